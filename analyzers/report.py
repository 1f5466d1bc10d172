"""The story of one incident: what the counters showed before, during and
after a finding, what decided its verdict, the captures and their traces,
the anomalies and capture decisions around it, and what changed against the
job's own baseline (the `before` window)."""
from __future__ import annotations

import json
import time
from typing import Callable

from .rules import what_to_try
from .store import Store

KEY_METRICS = ("util_gpu_ratio", "util_mem_ratio", "gpm_sm_util_ratio", "gpm_sm_occupancy_ratio",
               "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio", "gpm_pcie_tx_bytes_per_second",
               "gpm_pcie_rx_bytes_per_second", "procs_cpu_cores", "power_watts", "sm_clock_hertz", "temp_celsius")
MIN_CONTEXT_S, MAX_CONTEXT_S = 60.0, 1800.0
ALWAYS_NAMED = ("sm_clock_hertz", "power_watts", "temp_celsius")   # a clock or power change is news at 5 %
MIN_PREFIX = 4


class AmbiguousId(LookupError):
    """A finding id prefix that matches more than one finding."""


def full_id(store: Store, given: str) -> str | None:
    """The finding `given` names, whole or by its first characters (at least
    MIN_PREFIX); None when none matches. Raises AmbiguousId."""
    if len(given) < MIN_PREFIX:
        return given if store.finding_ids(given, 1) == [given] else None
    ids = store.finding_ids(given)
    if given in ids or len(ids) == 1:
        return given if given in ids else ids[0]
    if ids:
        more = "" if len(ids) < 6 else ", …"
        raise AmbiguousId(f"finding_id {given!r} is the start of {'5 or more' if more else len(ids)} findings "
                          f"({', '.join(ids[:5])}{more}): give more of it")
    return None


def build_report(store: Store, finding_id: str, context_s: float = 0.0, now: float | None = None,
                 lookup: Callable[[str], dict | None] | None = None) -> dict | None:
    """`lookup` finds the finding (default: as stored; the analyzer's own
    lookup adds an open finding's running numbers)."""
    f = (lookup or store.finding)(finding_id)
    if f is None:
        return None
    now = time.time() if now is None else now
    end = f["end"] if f["end"] is not None else now
    span = max(end - f["start"], 1.0)
    ctx = context_s or min(max(span, MIN_CONTEXT_S), MAX_CONTEXT_S)
    host, gpu = f["host"], f["gpu"]
    before = store.means(host, gpu, f["start"] - ctx, f["start"], KEY_METRICS)
    during = store.means(host, gpu, f["start"], end, KEY_METRICS)
    after = store.means(host, gpu, end, end + ctx, KEY_METRICS) if f["end"] is not None else None
    captures = []
    for c in store.captures(host, limit=1000):
        if c["finding_id"] == finding_id:
            s = json.loads(c["summary"]) if c["summary"] else None
            captures.append(dict({k: v for k, v in c.items() if k != "summary"},
                                 trace_summary=s and {k: s.get(k) for k in ("verdict", "confidence", "summary",
                                                                          "busy_fraction", "kernels", "idle_gaps",
                                                                          "timing", "memcpy", "pcie_link",
                                                                          "top_ops", "host_steps")}))
    return dict(finding=f, counters=dict(context_seconds=ctx, before=before, during=during, after=after),
                changes=_changes(before, during), verdict=dict(decided=f["verdict"], by=f["decided_by"],
                                                               counters=f.get("counters_verdict"),
                                                               trace=f.get("trace_verdict")),
                what_to_try=what_to_try(f["verdict"], f.get("flags") or ()),
                captures=captures, anomalies=store.records("anomalies", host, 0, 100, finding_id=finding_id),
                decisions=store.records("decisions", host, 0, 100, finding_id=finding_id))


def _changes(before: dict, during: dict) -> list[dict]:
    """Metrics that moved most between the baseline and the incident, and
    clocks, power and temperature whenever they moved by 5 % or more: each
    with `relative` ((during - before) / |before|, None from 0) and `factor`
    (during / before)."""
    out = []
    for m in KEY_METRICS:
        b, d = before.get(m), during.get(m)
        if b is None or d is None:
            continue
        # `relative` and `factor` as people read them (+15.3 is 16.3x the before); the ranking uses the
        # change over the larger of the two, so that a rise and a fall of the same size rank alike
        out.append(dict(metric=m, before=b, during=d, change=d - b, relative=(d - b) / abs(b) if b else None,
                        factor=d / b if b else None, _rank=abs(d - b) / max(abs(b), abs(d), 1e-9)))
    out.sort(key=lambda r: r["_rank"], reverse=True)
    top = [r for r in out if r["_rank"] >= 0.1][:6]
    named = top + [r for r in out if r not in top and r["metric"] in ALWAYS_NAMED and r["_rank"] >= 0.05]
    return [{k: v for k, v in r.items() if k != "_rank"} for r in named]
