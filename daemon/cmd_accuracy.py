"""`gpuscope accuracy`: how often the counters' verdicts agreed with the
traces taken at the time (analyzers/accuracy.py), fleet-wide or per host."""
from __future__ import annotations

import time

from gpuscope.analyzers.accuracy import summarize

from . import clients
from .cliutil import print_json
from .security_flags import client_security


def cmd_accuracy(ns) -> int:
    start = time.time() - ns.since if ns.since else None
    rows = clients.accuracy(ns.server, start, None, ns.host or "", security=client_security(ns))
    s = summarize(rows)
    if ns.json:
        print_json(dict(s, pairs=rows))
        return 0
    total = s["overall"]
    if not total["pairs"]:
        print("no verdict pairs yet: a pair is recorded each time a capture's trace verdict lands for a GPU "
              "the counters had judged (`gpuscope capture`, or the analyzer's triggered captures)")
        return 0
    print(f"{total['pairs']} pairs: the trace agreed with the counters in {_share(total)}"
          f"{_family(total)}")
    print("by counters verdict (precision = the trace said the same):")
    for verdict, b in sorted(s["per_verdict"].items(), key=lambda kv: -kv[1]["pairs"]):
        said = ", ".join(f"{found} {n}" for found, n in sorted(s["matrix"][verdict].items(), key=lambda kv: -kv[1]))
        print(f"  {verdict:<20} {_share(b):<24} trace said: {said}")
    if len(s["per_model"]) > 1 or "unknown" not in s["per_model"]:
        print("by GPU model:")
        for model, b in sorted(s["per_model"].items(), key=lambda kv: -kv[1]["pairs"]):
            print(f"  {model:<28} {_share(b)}")
    return 0


def _share(b: dict) -> str:
    text = f"{b['agreed']} of {b['pairs']}"
    return f"{text} ({100 * b['precision']:.0f} %)" if b["enough"] else f"{text} (too few to state a rate)"


def _family(b: dict) -> str:
    n = b["same_family"]
    return f"; {n} more within launch/host-bound, which counters cannot tell apart" if n else ""
