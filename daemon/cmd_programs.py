"""`gpuscope programs`: the programs the fleet runs (an HLO or a command
fingerprint), their runs and baselines; with a fingerprint, that program's
runs, each against its baseline (analyzers/programs.py; docs/programs.md)."""
from __future__ import annotations

import argparse
import re
import time
from datetime import datetime, timezone

from gpuscope.collectors.human import percent, value as human_value

from . import clients
from .cliutil import number, positive_duration, print_json
from .security_flags import client_security

# what a run's line shows of its means, and how
_MEANS = (("gpm_sm_util_ratio", "SM"), ("gpm_tensor_util_ratio", "TENSOR"), ("gpm_dram_bw_util_ratio", "DRAM"))


def add_programs_parser(sub, server_args) -> None:
    sp = sub.add_parser("programs", help="programs (same HLO or command line) with their runs and baselines; "
                                         "a fingerprint lists that program's runs")
    sp.add_argument("fingerprint", nargs="?", default="", type=_fingerprint,
                    help="one program's fingerprint (16 hex digits, as listed)")
    sp.add_argument("--since", type=positive_duration, default=7 * 86400.0, metavar="DURATION",
                    help="programs with runs this recent (default 7d)")
    sp.add_argument("--host", default="", help="runs on this host only")
    sp.add_argument("--limit", type=number(1, 10_000, int), default=0, metavar="N",
                    help="programs (or runs) shown (default 200)")
    server_args(sp)
    sp.set_defaults(fn=cmd_programs)


def _fingerprint(value: str) -> str:
    if value.strip() and not re.fullmatch(r"[0-9a-fA-F]{16}", value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a program's fingerprint (16 hex digits, as "
                                         "`gpuscope programs` lists them)")
    return value.strip().lower()


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M") if t else "—"


def cmd_programs(ns) -> int:
    fp = ns.fingerprint
    rows = clients.programs(ns.server, time.time() - ns.since, ns.host, fp, ns.limit,
                            security=client_security(ns))
    if ns.json:
        print_json({"programs": rows})
        return 0
    if not rows:
        print(f"no runs of program {fp} since {_when(time.time() - ns.since)}" if fp else
              "no program runs yet: runs are made from the processes agents list on GPUs, at each fleet check "
              "(--fleet-check-every, default 5m)")
        return 0
    if fp:
        return _runs(rows[0])
    print(f"{'PROGRAM':<16}  {'KIND':<7} {'NAME':<32} {'RUNS':>5} {'HOSTS':>5} {'STEP':>9}  {'VERDICT':<19} "
          f"{'LAST SEEN':<16}  OPEN")
    for p in rows:
        print(f"{p['fingerprint']:<16}  {p['kind']:<7} {(p.get('name') or '?')[:32]:<32} {p['runs']:>5} "
              f"{p['hosts']:>5} {human_value('seconds', p.get('step_seconds')):>9}  "
              f"{(p.get('baseline_verdict') or '—'):<19} {_when(p.get('last_seen')):<16}  "
              f"{p.get('open_regressions') or ''}")
    return 0


def _runs(p: dict) -> int:
    base = p.get("baseline") or {}
    print(f"program {p['fingerprint']} ({p.get('kind', '?')}): {p.get('name') or '?'}, {p.get('runs', 0)} runs")
    said = [f"{label} {percent(base[m])}" for m, label in _MEANS if base.get(m) is not None]
    if p.get("baseline_step_seconds"):
        said.insert(0, f"step {human_value('seconds', p['baseline_step_seconds'])}")
    if p.get("baseline_verdict"):
        said.insert(0, p["baseline_verdict"])
    print(f"baseline of {p.get('baseline_runs', 0)} runs long enough to judge: " + (", ".join(said) or "no figures"))
    print(f"{'HOST':<16} {'GPUS':<8} {'STARTED':<16} {'RAN':>7} {'STEP':>9} "
          + " ".join(f"{label:>6}" for _, label in _MEANS) + "  VERDICT")
    for r in p.get("runs_shown", []):
        verdicts = r.get("verdicts") or {}
        top = max(verdicts.items(), key=lambda kv: kv[1]) if verdicts else None
        means = r.get("means") or {}
        print(f"{r['host'][:16]:<16} {','.join(map(str, r['gpus'])) or '—':<8} {_when(r['start']):<16} "
              f"{human_value('seconds', r['sampled_s']):>7} {human_value('seconds', r.get('step_seconds')):>9} "
              + " ".join(f"{percent(means.get(m)) if means.get(m) is not None else '—':>6}" for m, _ in _MEANS)
              + (f"  {top[0]} {percent(top[1])}" if top else "  —")
              + ("  REGRESSION" if r.get("regressions") else ""))
    return 0
