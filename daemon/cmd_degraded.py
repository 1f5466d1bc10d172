"""`gpuscope degraded`: GPUs well under their peers of the same model, one
line per weak dimension, then the groups too few to judge, each said: a
4-GPU box is not "no degraded GPU" (analyzers/degraded.py; docs/degraded.md)."""
from __future__ import annotations

import time

from . import clients
from .cliutil import print_json
from .security_flags import client_security


def cmd_degraded(ns) -> int:
    end = time.time()
    rows = clients.degraded(ns.server, end - ns.since, end, security=client_security(ns))
    if ns.json:
        print_json(rows)
        return 0
    found = [r for r in rows if r["kind"] == "degraded"]
    unjudged = [r for r in rows if r["kind"] == "unjudged"]
    if not found and unjudged:
        print("no degraded GPU among the groups judged (docs/degraded.md); the others were not compared:")
    elif not found:
        print("no degraded GPU: none is under its peers by the documented margin (docs/degraded.md), "
              "or no GPU has figures to judge")
    for r in found:
        print(f"{r['host']} gpu {r['gpu']}  {r['dimension']:<7} {r['summary']}")
    for u in unjudged:
        driver = f"driver {u['driver']}" if u["driver"] else "drivers not told apart"
        print(f"not judged: {u['gpus']} {u['model']} GPU{'s' if u['gpus'] != 1 else ''} ({driver}) for "
              f"{u['dimension']}: fewer than {u['min_peers']} peers")
    return 0
