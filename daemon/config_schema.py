"""The configuration file's keys, read off the command line's own parsers:
every long flag of `gpuscope agent`, `analyzer` and `up` is a key of its
table (`--flush-interval` is `flush_interval`), checked by the flag's own
`type=` and `choices`, so the file and the flags cannot drift apart.

A value comes as TOML (the file) or as text (the environment) and leaves as
what argparse would have stored for the flag. Errors are ValueErrors whose
message says what is wrong with the value; the caller says where it was."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

SWITCH, LIST, VALUE = "switch", "list", "value"
# flags that are no setting: where the settings are
NOT_SETTINGS = ("help", "config", "version")
# Values that may carry a credential (an alert receiver's URL: Slack's and
# Teams' webhooks are their own key, Alertmanager's may hold a password),
# which argparse cannot tell us. They may come from a file of their own
# (`KEY_file`), and are never shown.
SECRETS = ("alertmanager", "alert_webhook")
FILE_SUFFIX = "_file"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Setting:
    key: str                      # the file's key: the long flag without --, `-` as `_`
    dest: str                     # where argparse keeps it
    flag: str                     # --the-flag
    kind: str                     # SWITCH, LIST or VALUE
    parse: Callable | None        # the flag's type=
    choices: tuple | None
    const: object                 # what a SWITCH stores when on
    default: object
    help: str
    metavar: str | None

    @property
    def secret(self) -> bool:
        return self.key in SECRETS


def _setting(action: argparse.Action, default) -> Setting | None:
    if not action.option_strings or action.dest in NOT_SETTINGS or \
            isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
        return None
    flag = next((o for o in action.option_strings if o.startswith("--")), None)
    if flag is None:
        return None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        kind = SWITCH
    elif isinstance(action, argparse._AppendAction) and action.nargs is None:
        kind = LIST
    elif type(action) is argparse._StoreAction and action.nargs is None:
        kind = VALUE
    else:            # a flag of a shape the file cannot hold yet: found here, by the tests, not by a user
        raise TypeError(f"{flag}: {type(action).__name__} with nargs={action.nargs!r} has no configuration form")
    return Setting(key=flag[2:].replace("-", "_"), dest=action.dest, flag=flag, kind=kind, parse=action.type,
                   choices=tuple(action.choices) if action.choices else None, const=action.const,
                   default=default, help=action.help or "", metavar=action.metavar)


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def settings(parser: argparse.ArgumentParser, command: str, dests: tuple[str, ...] | None = None) -> dict[str, Setting]:
    """key -> Setting for one server command: its own flags, and the global
    ones that shape its logs (--log-level, --json-logs); only those of
    `dests` when given."""
    sp = subparser(parser, command)
    out = {}
    for owner in (parser, sp):
        for action in owner._actions:
            if dests is not None and action.dest not in dests:
                continue
            s = _setting(action, owner.get_default(action.dest))
            if s is not None:
                out[s.key] = s
    return out


def is_duration(s: Setting) -> bool:
    """Whether the flag takes 90s, 10m, 14d: asked of its own type."""
    try:
        return s.parse is not None and s.parse("1m") == 60
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False


def duration_words(seconds: float) -> str:
    """Seconds as the largest unit that says them exactly: 600 -> 10m, 1209600 -> 14d, 90 -> 90s."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:g}s"


def _type_words(s: Setting) -> str:
    if s.choices:
        return "one of " + ", ".join(map(str, s.choices))
    if is_duration(s):
        return 'a duration (seconds, or a string like "90s", "10m", "14d")'
    return "a number" if s.parse is not None else "a string"


_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
               dict: "a table"}


def toml_type(value) -> str:
    return next((words for t, words in _TOML_TYPES.items() if isinstance(value, t)), type(value).__name__)


def _scalar(s: Setting, value):
    """One value as argparse would have stored it from the command line."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or \
            (s.parse is None and not isinstance(value, str)):
        raise ValueError(f"expected {_type_words(s)}, not {toml_type(value)} ({_shown(value)})")
    text = value if isinstance(value, str) else repr(value)
    if s.parse is not None:
        try:
            value = s.parse(text)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None
        except (TypeError, ValueError):
            raise ValueError(f"invalid {getattr(s.parse, '__name__', 'value')} value: {text!r}") from None
    else:
        value = text
    if s.choices and value not in s.choices:
        raise ValueError(f"{text!r} is not one of {', '.join(map(str, s.choices))}")
    return value


def _shown(value) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def from_toml(s: Setting, value):
    """A TOML value of the file: a switch is true or false, a repeatable
    flag an array (or one string), anything else a string, or a number where
    the flag takes one."""
    if s.kind == SWITCH:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, not {toml_type(value)} ({_shown(value)})")
        return s.const if value else (not s.const)
    if s.kind == LIST:
        if isinstance(value, list):
            return [_scalar(s, v) for v in value]
        if isinstance(value, str):
            return [_scalar(s, value)]
        raise ValueError(f"expected an array of strings, not {toml_type(value)} ({_shown(value)})")
    return _scalar(s, value)


def from_text(s: Setting, text: str):
    """A value from the environment: a switch is 1/0, true/false, yes/no or
    on/off; a repeatable flag takes several values apart by blanks."""
    if s.kind == SWITCH:
        word = text.strip().lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(f"{text!r} is not one of 1, 0, true, false, yes, no, on, off")
        return s.const if word in _TRUE else (not s.const)
    if s.kind == LIST:
        return [_scalar(s, v) for v in text.split()]
    return _scalar(s, text)


def from_secret_file(s: Setting, text: str):
    """A secret's own file (KEY_file): a repeatable one's values a line each,
    blank lines and # comments left out; any other its whole text."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if s.kind == LIST:
        return [_scalar(s, v) for v in lines]
    if len(lines) != 1:
        raise ValueError(f"expected one value, found {len(lines)} lines")
    return _scalar(s, lines[0])
