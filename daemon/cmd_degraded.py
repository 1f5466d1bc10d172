"""`gpuscope degraded`: GPUs well under their peers of the same model, one
line per weak dimension (analyzers/degraded.py; docs/degraded.md)."""
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
    if not rows:
        print("no degraded GPU: none is under its peers by the documented margin (docs/degraded.md), "
              "or no model has enough GPUs with figures to judge")
        return 0
    for r in rows:
        print(f"{r['host']} gpu {r['gpu']}  {r['dimension']:<7} {r['summary']}")
    return 0
