"""`gpuscope config check|show|example`: the servers' configuration file
checked without starting anything, each effective setting with where it
came from, and the documented example (docs/configuration.md)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import config_example, config_file
from .cliutil import UsageError, print_json
from .config_file import TABLES, ConfigError, Problem
from .config_schema import duration_words, is_duration

SHOWN_BY_DEFAULT = ("agent", "analyzer")


def add_config_flag(sp: argparse.ArgumentParser) -> None:
    command = sp.prog.split()[-1]
    sp.add_argument("--config", default=None, metavar="FILE",
                    help=f"settings file: its [{command}] table (default ${config_file.ENV_CONFIG}, else "
                         f"{config_file.DEFAULT_PATH} if it exists); flags and GPUSCOPE_{command.upper()}_<KEY> "
                         "variables win over it (docs/configuration.md)")


def add_config_parser(sub, build_parser) -> None:
    """`build_parser`: the command line's, whose server flags are the file's keys."""
    sp = sub.add_parser("config", help="check the servers' configuration file, or show each setting and its source")
    config_sub = sp.add_subparsers(dest="config_command", required=True)
    cp = config_sub.add_parser("check", help="validate a configuration file without starting anything (exit 0 "
                                             "when good, 2 when not)")
    cp.add_argument("file", metavar="FILE")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(fn=cmd_config_check, build_parser=build_parser)
    shp = config_sub.add_parser(
        "show", help="the effective settings of a server command and where each came from",
        description="The settings `gpuscope COMMAND` would run with, each with its source: default, "
                    "file:PATH, env:GPUSCOPE_..., or flag. Flags after COMMAND are that command's own, "
                    "e.g. `gpuscope config show analyzer --window 10`. Secrets are never printed.")
    shp.add_argument("--config", default=None, metavar="FILE",
                     help=f"the file (default ${config_file.ENV_CONFIG}, else {config_file.DEFAULT_PATH} if it "
                          "exists)")
    shp.add_argument("--json", action="store_true")
    shp.add_argument("target", nargs="?", choices=TABLES, metavar="COMMAND",
                     help=f"{', '.join(TABLES)} (default: {' and '.join(SHOWN_BY_DEFAULT)}, and up when the file "
                          "has an [up] table)")
    shp.add_argument("flags", nargs=argparse.REMAINDER, help="COMMAND's flags, as they would be given to it")
    shp.set_defaults(fn=cmd_config_show, build_parser=build_parser)
    ep = config_sub.add_parser("example", help="a configuration file with every key, its meaning and its default "
                                               "(deploy/gpuscope.toml)")
    ep.add_argument("--markdown", action="store_true", help="the key tables of docs/configuration.md instead")
    ep.set_defaults(fn=cmd_config_example, build_parser=build_parser)


# -- check --------------------------------------------------------------------------------------

def check(parser: argparse.ArgumentParser, path: Path) -> tuple[list[Problem], dict[str, list[str]]]:
    """Every problem of the file as written (the environment and flags left
    out), and the keys each table sets."""
    try:
        doc = config_file.read(path)
    except ConfigError as exc:
        return exc.problems, {}
    problems = config_file.check_top_level(doc, path, config_file.schemas(parser))
    tables = {}
    for table in TABLES:
        if not isinstance(doc.get(table), dict):
            continue
        tables[table] = list(doc[table])
        try:
            config_file.resolve(parser, parser.parse_args([table]), set(), {}, doc, path, top_level=False)
        except ConfigError as exc:
            problems += exc.problems
    return problems, tables


def cmd_config_check(ns) -> int:
    path = Path(ns.file).expanduser()
    problems, tables = check(ns.build_parser(), path)
    if ns.json:
        print_json({"file": str(path), "ok": not problems, "tables": tables,
                    "problems": [dict(where=p.where, table=p.table, key=p.key, message=p.message)
                                 for p in problems]})
    elif problems:
        for p in problems:
            print(f"{p}")
        print(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}")
    else:
        said = [f"[{t}] {len(keys)} setting{'s' if len(keys) != 1 else ''}" for t, keys in tables.items()]
        print(f"{path}: ok" + (f" ({', '.join(said)})" if said else " (no [agent], [analyzer] or [up] table)"))
    return 2 if problems else 0


# -- show ---------------------------------------------------------------------------------------

def _value_words(value, duration: bool = False) -> str:
    if duration and isinstance(value, (int, float)) and not isinstance(value, bool):
        return duration_words(value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "-"
    return str(value) if value != "" else '""'


def _resolved(ns, target: str, flags: list[str]):
    build = ns.build_parser
    argv = [target, *(["--config", ns.config] if ns.config and "--config" not in flags else []), *flags]
    parser = build()
    tns = parser.parse_args(argv)
    return config_file.apply(tns, parser, config_file.flags_given(build, argv))


def cmd_config_show(ns) -> int:
    flags = [f for f in ns.flags if f != "--json"]
    as_json = ns.json or len(flags) != len(ns.flags)
    if ns.target is None:
        if flags:
            raise UsageError(f"config show: flags ({' '.join(flags)}) belong to a command: "
                             f"`gpuscope config show {'|'.join(TABLES)} FLAGS...`")
        path, named_by = config_file.find(ns.config, os.environ)
        doc = config_file.read(path, named_by) if path is not None else {}
        targets = [*SHOWN_BY_DEFAULT, *(["up"] if isinstance(doc.get("up"), dict) else [])]
    else:
        targets = [ns.target]
    shown = {t: _resolved(ns, t, flags) for t in targets}      # a ConfigError: main says it, exit 2
    if as_json:
        path = next(iter(shown.values())).path
        print_json({"file": str(path) if path else None, "commands": {
            t: {"settings": {k: dict(value=res.shown(k), source=e.source, **({"note": e.note} if e.note else {}))
                             for k, e in res.settings.items()},
                "warnings": res.warnings} for t, res in shown.items()}})
        return 0
    for i, (t, res) in enumerate(shown.items()):
        if i:
            print()
        print(f"gpuscope {t}: " + (f"settings file {res.path}" if res.path else "no settings file"))
        rows = [(k, _value_words(res.shown(k), is_duration(res.schema[k])), e.source)
                for k, e in res.settings.items()]
        wk, wv = max(len(r[0]) for r in rows), min(48, max(len(r[1]) for r in rows))
        print(f"{'KEY':<{wk}}  {'VALUE':<{wv}}  SOURCE")
        for k, v, src in rows:
            print(f"{k:<{wk}}  {v:<{wv}}  {src}")
        for k, e in res.settings.items():
            if e.note:
                print(f"note: {k}: {e.note}")
        for w in res.warnings:
            print(f"warning: {w}")
    return 0


def cmd_config_example(ns) -> int:
    parser = ns.build_parser()
    sys.stdout.write(config_example.reference(parser) if ns.markdown else config_example.example(parser))
    return 0
