"""The servers' configuration file (docs/configuration.md): where it is,
what it says, and each setting's effective value with where it came from.

    flag  >  $GPUSCOPE_<COMMAND>_<KEY>  >  [command] table of the file  >  default

The file is --config FILE, else $GPUSCOPE_CONFIG, else /etc/gpuscope/gpuscope.toml
when it exists. It holds a table per server command ([agent], [analyzer],
[up]) whose keys are that command's long flags (config_schema.py); its
top-level keys are the on-call commands' (client_config.py). Everything
wrong is refused before anything starts, each problem naming the file, the
table and the key (or the variable) and what is wrong with it."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuscope.security.redact import redact_url

from . import client_config, config_checks, config_schema
from .config_schema import FILE_SUFFIX, Setting

ENV_CONFIG = client_config.ENV_CONFIG
DEFAULT_PATH = Path("/etc/gpuscope/gpuscope.toml")
TABLES = client_config.SERVER_TABLES
DEFAULT, FLAG, ENV, FILE = "default", "flag", "env", "file"
_RANK = {DEFAULT: 0, FILE: 1, ENV: 2, FLAG: 3}
# What --insecure turns off: whichever of the two a higher source set wins,
# so `--insecure` on the command line runs a file made for TLS (and the
# other way round) instead of refusing the pair.
TLS_MATERIAL = ("tls_dir", "ca", "cert", "key", "tokens", "oncall_listen")
# Keys whose values are paths: ~ is expanded, as a shell does for a flag's.
PATHS = ("db", "capture_dir", "tls_dir", "ca", "cert", "key", "tokens", "kubelet_socket", "publish", "publish_state")
# Variables of the GPUSCOPE_<COMMAND>_ form that are not ours: the systemd
# units' extra flags, and the links Kubernetes makes for a Service named
# gpuscope-agent or gpuscope-analyzer (..._SERVICE_HOST, ..._PORT_9403_TCP).
_NOT_OURS = re.compile(r"args|(?:\w+_)?(?:service_host|service_port(?:_\w+)?|port(?:_\d+_(?:tcp|udp|sctp)"
                       r"(?:_proto|_port|_addr)?)?)")
SECRET_SHOWN = "<redacted from {}>"


@dataclass
class Problem:
    where: str          # `FILE: [agent] interval`, `$GPUSCOPE_AGENT_INTERVAL`, `FILE`
    message: str
    table: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class ConfigError(Exception):
    """Every problem found, each naming where it is."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


@dataclass
class Effective:
    value: object
    source: str                   # "default", "flag", "env:NAME", "file:PATH"
    where: str = ""               # for messages: `FILE: [analyzer] db`, `$GPUSCOPE_ANALYZER_DB`, `--db`
    secret_from: str | None = None  # a secret's value is shown as where it came from, never itself
    note: str = ""

    @property
    def kind(self) -> str:
        return self.source.split(":", 1)[0]


@dataclass
class Resolution:
    command: str
    path: Path | None             # the file read, if any
    settings: dict[str, Effective]
    schema: dict[str, Setting]
    warnings: list[str] = field(default_factory=list)
    table: bool = False           # the file has a table for the command

    def shown(self, key: str) -> object:
        """The value fit to print: a secret's is where it came from."""
        e = self.settings[key]
        return SECRET_SHOWN.format(e.secret_from) if e.secret_from else e.value


# -- the file ---------------------------------------------------------------------------------

def find(config_flag: str | None, environ) -> tuple[Path | None, str]:
    """(the file, what named it): --config, $GPUSCOPE_CONFIG, or the default
    path when it exists; (None, "") when there is none."""
    if config_flag:
        return Path(config_flag).expanduser().absolute(), "--config"
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG]).expanduser().absolute(), f"${ENV_CONFIG}"
    if DEFAULT_PATH.exists():
        return DEFAULT_PATH, ""
    return None, ""


def read(path: Path, named_by: str = "") -> dict:
    """The file as TOML; a file named but missing, unreadable or not TOML is
    a ConfigError (never ignored)."""
    by = f" ({named_by})" if named_by else ""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([Problem(f"{path}{by}", "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(f"{path}{by}", "is a directory; give the configuration file")]) from None
    except PermissionError:
        raise ConfigError([Problem(f"{path}{by}", "not readable by this user")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(f"{path}{by}", f"cannot be read ({exc})")]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(str(path), f"not TOML: {exc}")]) from None


def _open_to_others(path: Path) -> int | None:
    """The file's mode when group or others may read it (the rule of tokens
    files and of ssh's keys), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return stat.S_IMODE(mode) if mode & 0o077 else None


def _did_you_mean(word: str, known, shown: str = "{}") -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {shown.format(close[0])}?)" if close else ""


def check_top_level(doc: dict, path: Path, schemas: dict[str, dict[str, Setting]]) -> list[Problem]:
    """The keys outside the servers' tables: the on-call commands' (checked as
    they check them), and nothing else."""
    out = []
    for key, value in doc.items():
        where = f"{path}: {key}"
        if key in TABLES:
            if not isinstance(value, dict):
                out.append(Problem(where, f"expected a table ([{key}]), not {config_schema.toml_type(value)}",
                                   key=key))
        elif isinstance(value, dict):
            tables = ", ".join(f"[{t}]" for t in TABLES)
            out.append(Problem(f"{path}: [{key}]", f"unknown table; the tables are {tables}"
                               f"{_did_you_mean(key, TABLES, '[{}]')}", table=key))
        elif key == "token":
            out.append(Problem(where, "a token is never written in this file: put it in a file only you can read "
                                      "(chmod 600) and name that file with token_file", key=key))
        elif key in client_config.CLIENT_KEYS:
            try:
                client_config.client_value(key, value)
            except ValueError as exc:
                out.append(Problem(where, str(exc), key=key))
        else:
            owners = [t for t, schema in schemas.items() if key.replace("-", "_") in schema]
            known = client_config.CLIENT_KEYS
            hint = (f"; it is a setting of {', '.join(f'[{t}]' for t in owners)}: put it under its table" if owners
                    else f" (top-level keys are the on-call commands': {', '.join(known)}){_did_you_mean(key, known)}")
            out.append(Problem(where, f"unknown key{hint}", key=key))
    return out


def _secret_file(s: Setting, path_text) -> tuple[object, str]:
    """A secret's value from its own file (KEY_file), held to the tokens
    file's rule: no access for group or others."""
    if not isinstance(path_text, str) or not path_text.strip():
        raise ValueError(f"expected the path of a file, not {path_text!r}")
    p = Path(path_text).expanduser()
    mode = _open_to_others(p)
    if mode is not None:
        raise ValueError(f"{p} is accessible to group or others (mode {mode:04o}); run `chmod 600 {p}`")
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: cannot be read ({exc})") from None
    try:
        return config_schema.from_secret_file(s, text), str(p)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def _expand(key: str, value):
    return os.path.expanduser(value) if key in PATHS and isinstance(value, str) and value else value


def _table(doc: dict, path: Path, command: str, all_schemas: dict[str, dict[str, Setting]],
           problems: list[Problem]) -> dict[str, Effective]:
    schema = all_schemas[command]
    table = doc.get(command)
    if not isinstance(table, dict):
        return {}
    out: dict[str, Effective] = {}
    given_as: dict[str, str] = {}
    source = f"{FILE}:{path}"
    for raw, value in table.items():
        key = raw.replace("-", "_")
        where = f"{path}: [{command}] {raw}"
        base = key[:-len(FILE_SUFFIX)] if key.endswith(FILE_SUFFIX) else None
        target = key if key in schema else base if base in schema and schema[base].secret else None
        if target is None:
            elsewhere = [t for t in TABLES if t != command and key in all_schemas[t]]
            hint = (f"; it is a setting of {', '.join(f'[{t}]' for t in elsewhere)}, not of gpuscope {command}"
                    if elsewhere else _did_you_mean(key, [*schema, *(f"{k}{FILE_SUFFIX}" for k, s in schema.items()
                                                                   if s.secret)])
                    or f" (the keys are the long flags of `gpuscope {command} --help`)")
            problems.append(Problem(where, f"unknown key{hint}", command, raw))
            continue
        if target in given_as:
            problems.append(Problem(where, f"given twice: as {given_as[target]} too (give one)", command, raw))
            continue
        given_as[target] = raw
        try:
            if target == key:
                out[key] = Effective(_expand(key, config_schema.from_toml(schema[key], value)), source, where)
            else:
                value, secret_path = _secret_file(schema[target], value)
                out[target] = Effective(value, source, where, secret_from=secret_path)
        except ValueError as exc:
            problems.append(Problem(where, str(exc), command, raw))
    mode = _open_to_others(path)
    for key, e in out.items():
        if schema[key].secret and e.secret_from is None and _carries_a_credential(e.value):
            if mode is not None:
                problems.append(Problem(e.where, f"holds a credential and {path} is accessible to group or "
                                        f"others (mode {mode:04o}): run `chmod 600 {path}`, or put the value in a "
                                        f"file of its own named by {key}{FILE_SUFFIX}", command, key))
            e.secret_from = str(path)
    return out


def _may_hold_a_key(value) -> bool:
    """A receiver URL with user info, a query, or a path other than
    Alertmanager's API: its key may hide anywhere in it."""
    import urllib.parse
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, str) and v:
            u = urllib.parse.urlsplit(v)
            if u.username or u.password or u.query or u.path.rstrip("/") not in ("", "/api/v2/alerts",
                                                                                    "/api/v1/alerts"):
                return True
    return False


def _carries_a_credential(value) -> bool:
    """What a log would redact of an alert receiver's URL: user info, query
    values, key-like path segments (Slack's webhook key)."""
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and redact_url(v) != v for v in values)


def _environment(environ, command: str, schema: dict[str, Setting], problems: list[Problem],
                 warnings: list[str]) -> dict[str, Effective]:
    prefix = f"GPUSCOPE_{command.upper()}_"
    out = {}
    for name in sorted(environ):
        if not name.startswith(prefix):
            continue
        key, text, where = name[len(prefix):].lower(), environ[name], f"${name}"
        base = key[:-len(FILE_SUFFIX)] if key.endswith(FILE_SUFFIX) else None
        try:
            if key in schema:
                out[key] = Effective(_expand(key, config_schema.from_text(schema[key], text)), f"{ENV}:{name}", where)
            elif base in schema and schema[base].secret:
                value, secret_path = _secret_file(schema[base], text)
                out[base] = Effective(value, f"{ENV}:{name}", where, secret_from=secret_path)
            elif not _NOT_OURS.fullmatch(key):
                # the environment is shared with other programs: said, not refused
                close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
                warnings.append(f"{where} is not a setting of gpuscope {command}; ignored"
                                + (f" (did you mean {prefix}{close[0].upper()}?)" if close else ""))
        except ValueError as exc:
            problems.append(Problem(where, str(exc), command, key))
    both = {k for k in out if f"{prefix}{k.upper()}" in environ and f"{prefix}{k.upper()}_FILE" in environ}
    for k in sorted(both):
        problems.append(Problem(f"${prefix}{k.upper()}", f"and ${prefix}{k.upper()}_FILE: give one", command, k))
    return out


# -- precedence -------------------------------------------------------------------------------

def schemas(parser: argparse.ArgumentParser) -> dict[str, dict[str, Setting]]:
    """table -> key -> Setting, for every server command."""
    return {t: config_schema.settings(parser, t) for t in TABLES}


def flags_given(build_parser: Callable[[], argparse.ArgumentParser], argv: list[str]) -> set[str]:
    """The dests the command line set, told apart from defaults by parsing
    again with every default suppressed (a flag given its default value
    still beats the file)."""
    parser = build_parser()
    _suppress_defaults(parser)
    return set(vars(parser.parse_args(argv)))


def _suppress_defaults(parser: argparse.ArgumentParser) -> None:
    parser._defaults.clear()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                _suppress_defaults(sp)
        else:
            action.default = argparse.SUPPRESS


def resolve(parser: argparse.ArgumentParser, ns: argparse.Namespace, given: set[str], environ,
            doc: dict | None = None, path: Path | None = None, top_level: bool = True) -> Resolution:
    """Each setting of `ns.command` from the highest source that has it.
    ConfigError with every problem found, in the file (its top-level keys
    too, unless `top_level` is False), the environment and the paths they
    name."""
    command = ns.command
    all_schemas = schemas(parser)
    schema = all_schemas[command]
    problems: list[Problem] = []
    warnings: list[str] = []
    if doc is not None and path is not None:
        if top_level:
            problems += check_top_level(doc, path, all_schemas)
        from_file = _table(doc, path, command, all_schemas, problems)
    else:
        from_file = {}
    from_env = _environment(environ, command, schema, problems, warnings)
    settings: dict[str, Effective] = {}
    for key, s in schema.items():
        if s.dest in given:
            settings[key] = Effective(getattr(ns, s.dest), FLAG, s.flag)
        else:
            settings[key] = from_env.get(key) or from_file.get(key) or Effective(getattr(ns, s.dest), DEFAULT)
        e = settings[key]
        # a webhook's key may be any path segment (found in a trial: `.../T1/B1/secretsecretsecret` was
        # printed): shown only when it has no path beyond Alertmanager's own
        if s.secret and e.secret_from is None and e.kind != DEFAULT and _may_hold_a_key(e.value):
            e.secret_from = "the command line" if e.kind == FLAG else e.where
    problems += _insecure_or_tls(settings, schema)
    configured = {k for k, e in settings.items() if e.kind in (FILE, ENV)}
    for key, message in config_checks.problems(command, {k: e.value for k, e in settings.items()}, configured):
        problems.append(Problem(settings[key].where, message, command, key))
    if problems:
        raise ConfigError(problems)
    return Resolution(command, path, settings, schema, warnings, table=isinstance((doc or {}).get(command), dict))


def _insecure_or_tls(settings: dict[str, Effective], schema: dict[str, Setting]) -> list[Problem]:
    """--insecure and TLS material from different sources: the higher one
    wins and the other is set aside (said in `config show`); from the same
    file or environment they are refused, as the flags are."""
    insecure = settings.get("insecure")
    if insecure is None or insecure.value is not True:
        return []
    material = [k for k in TLS_MATERIAL if k in settings and settings[k].kind != DEFAULT and settings[k].value]
    if not material:
        return []
    top = max(_RANK[settings[k].kind] for k in material)
    mine = _RANK[insecure.kind]
    if top > mine:
        settings["insecure"] = Effective(False, DEFAULT, note=f"insecure from {insecure.source} set aside: "
                                         f"{settings[max(material, key=lambda k: _RANK[settings[k].kind])].source} "
                                         f"gives TLS")
    elif top < mine:
        for k in material:
            settings[k] = Effective(schema[k].default, DEFAULT,
                                    note=f"{settings[k].source} set aside: insecure from {insecure.source}")
    elif insecure.kind != FLAG:          # two flags: the command's own message says it
        same = [settings[k].where for k in material if settings[k].kind == insecure.kind]
        return [Problem(insecure.where, f"cannot be combined with {', '.join(same)} (plain text has no TLS files "
                                        "or tokens): give one")]
    return []


def apply(ns: argparse.Namespace, parser: argparse.ArgumentParser, given: set[str], environ=None) -> Resolution:
    """Reads the file and the environment into `ns` (a server command's
    parsed flags), flags kept; ConfigError before anything starts."""
    environ = os.environ if environ is None else environ
    path, named_by = find(getattr(ns, "config", None), environ)
    doc = read(path, named_by) if path is not None else None
    res = resolve(parser, ns, given, environ, doc, path)
    for key, e in res.settings.items():
        setattr(ns, res.schema[key].dest, e.value)
    ns.configuration = res
    return res


def summary(res: Resolution) -> str | None:
    """The start-up line that says where settings came from, when not all
    from flags and defaults."""
    if not any(e.kind in (FILE, ENV) for e in res.settings.values()):
        if res.path is None:
            return None
        return (f"settings file {res.path}: every [{res.command}] setting is overridden" if res.table
                else f"settings file {res.path} has no [{res.command}] table")
    from_file = sorted(k for k, e in res.settings.items() if e.kind == FILE)
    from_env = sorted(k for k, e in res.settings.items() if e.kind == ENV)
    parts = []
    if from_file:
        parts.append(f"{res.path} [{res.command}] ({', '.join(from_file)})")
    if from_env:
        parts.append(f"the environment ({', '.join(from_env)})")
    return "settings from " + " and ".join(parts) + "; `gpuscope config show` says each one's source"
