"""The documented example configuration (deploy/gpuscope.toml, `gpuscope
config example`) and the key tables of docs/configuration.md, written from
the command line's parsers. Tests hold both files to what this writes, so
neither can drift from the flags."""
from __future__ import annotations

import argparse
import json
import os
import socket
import textwrap

from . import client_config, config_file
from .config_schema import FILE_SUFFIX, LIST, SWITCH, Setting, duration_words, is_duration, settings

HEADER = """\
# gpuscope configuration: one file for the agent, the analyzer and `gpuscope up`
# (docs/configuration.md). Written by `gpuscope config example`; every key is
# here with its default, commented out. Check a file with `gpuscope config check FILE`.
#
# Read from --config FILE, else $GPUSCOPE_CONFIG, else /etc/gpuscope/gpuscope.toml.
# A key is its command's long flag (--flush-interval: flush_interval, or
# flush-interval) with the flag's checks. A flag beats the environment
# (GPUSCOPE_AGENT_<KEY>, GPUSCOPE_ANALYZER_<KEY>, GPUSCOPE_UP_<KEY>), which
# beats this file, which beats the default; `gpuscope config show` says which
# gave each value. Alert receivers' URLs that carry a key may come from a file
# of their own (alert_webhook_file, alertmanager_file) and are never shown.
"""
CLIENT_HEADER = """\
# On-call commands (status, findings, query, ...) read the top-level keys
# (the file is theirs by $GPUSCOPE_CONFIG, else ~/.config/gpuscope/config.toml).
"""
TABLE_HEADERS = {
    "agent": "the per-host sampling daemon (`gpuscope agent`)",
    "analyzer": "the central analyzer (`gpuscope analyzer`)",
    "up": "agent and analyzer in one process (`gpuscope up`)",
}


def _portable(text: str) -> str:
    """This machine's home directory as ~, so the example reads the same wherever it is written."""
    home = os.path.expanduser("~")
    return text.replace(home, "~") if home not in ("", "/") else text


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(_portable(str(value)))      # JSON's escapes are TOML's


def _placeholder(s: Setting) -> str:
    words = (s.metavar or s.key.upper()).replace('"', "")
    return f"[{json.dumps(words)}]" if s.kind == LIST else json.dumps(words)


def _comment(text: str, width: int = 96) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(_portable(" ".join(text.split())), width)] if text else []


def _default(s: Setting) -> str | None:
    """The default as the file would say it; None when there is none to write
    (unset, or this machine's own, like its host name)."""
    if s.kind == SWITCH:
        return None if s.default is None else _toml(s.default)
    if s.default in (None, []) or (isinstance(s.default, str) and s.default == socket.gethostname()):
        return None
    if isinstance(s.default, (int, float)) and is_duration(s):
        return _toml(duration_words(s.default))
    return _toml(s.default)


def _block(s: Setting) -> list[str]:
    lines = _comment(s.help)
    default = _default(s)
    if default is not None:
        return lines + [f"#{s.key} = {default}"] + _secret_lines(s)
    if "default" not in s.help:
        lines.append("# (no default)" if s.default is None or s.default == [] else "# (default: this host's name)")
    example = _toml(s.const) if s.kind == SWITCH else _placeholder(s)
    return lines + [f"#{s.key} = {example}"] + _secret_lines(s)


def _secret_lines(s: Setting) -> list[str]:
    if not s.secret:
        return []
    return ["# ... or, when they carry a key, the file that holds them, one a line (no access for group or",
            "# others; the value is then never shown):",
            f"#{s.key}{FILE_SUFFIX} = \"/etc/gpuscope/{s.key}s\""]


def _client_settings(parser: argparse.ArgumentParser) -> list[Setting]:
    """The on-call commands' top-level keys, described by the flags they stand for."""
    status = settings(parser, "status", client_config.CLIENT_KEYS)
    keys = sorted(client_config.CLIENT_KEYS, key=lambda k: k == "insecure")      # where to ask first
    return [status[k] for k in keys if k in status]


def example(parser: argparse.ArgumentParser) -> str:
    out = [HEADER, CLIENT_HEADER]
    for s in _client_settings(parser):
        out += _block(s) + [""]
    for table, schema in config_file.schemas(parser).items():
        out += ["", "", f"# {'-' * 94}", f"# {TABLE_HEADERS[table]}", f"[{table}]"]
        for s in schema.values():
            out.append("")
            out += _block(s)
    return "\n".join(out).rstrip() + "\n"


def _cell(text: str) -> str:
    return _portable(" ".join(str(text).split())).replace("|", "\\|")


def _default_words(s: Setting) -> str:
    default = _default(s)
    if default is not None:
        return f"`{_cell(default)}`"
    if s.kind == SWITCH:
        return "decided at start"
    return "none" if s.default in (None, []) else "this host's name"


def reference(parser: argparse.ArgumentParser) -> str:
    """docs/configuration.md's tables: each table's keys, their flag and default."""
    out = []
    for table, schema in config_file.schemas(parser).items():
        out += [f"### [{table}]", "", f"{TABLE_HEADERS[table][0].upper()}{TABLE_HEADERS[table][1:]}.", "",
                "| key | flag | default | meaning |", "|---|---|---|---|"]
        for s in schema.values():
            key = f"`{s.key}`" + (f" (or `{s.key}{FILE_SUFFIX}`)" if s.secret else "")
            kind = " (array)" if s.kind == LIST else ""
            out.append(f"| {key}{kind} | `{s.flag}` | {_default_words(s)} | {_cell(s.help)} |")
        out.append("")
    return "\n".join(out)
