"""What a coordinated capture of a job's ranks says (docs/jobs.md): per
collective, who arrived last and by how much, each rank's time waiting in
collectives, and the straggler as the traces see it.

Every rank's trace covers the same wall-clock window (the agents start them
together: ProfileOptions.start_timestamp_ns). A collective ends for all
ranks at about the same moment: none can leave before the last has
arrived. So a rank's time inside a collective is how long it waited for the
others, and the rank that spent least there arrived last. Comparing those
durations needs no clock agreement between hosts: only the matching of one
collective across ranks uses wall time (its end, within a tolerance), and
the traces start within tens of milliseconds of each other.

Collectives are the GPU's collective activities (NCCL kernels, XLA's
all-reduce/all-gather/... ops) where the trace has a GPU, else the host
events XLA's CPU runtime names after the op (`all-gather`, gloo).
"""
from __future__ import annotations

import re
import statistics

import numpy as np

from gpuscope.collectors.trace_model import COLLECTIVE, Trace

MAX_KEPT = 5000            # collectives a capture's summary keeps
MIN_COLLECTIVES = 5        # fewer matched collectives name no straggler: two steps are two coin tosses
COORDINATED = "cc-"        # a coordinated capture's commands (and so its captures' triggers): cc-GROUP-rRANK
_OP = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)"
                 r"(?:[.-][\w.-]*)?$")


def collectives(trace: Trace, limit: int = MAX_KEPT) -> list[list]:
    """[op, start, end] of each collective, Unix ns, in order (at most `limit`)."""
    origin = trace.start_unix_ns or 0
    for dev in trace.devices:
        mask = dev.kind == COLLECTIVE
        if mask.any():
            out = []
            for i in np.flatnonzero(mask)[:limit]:
                op = dev.ops[dev.op_idx[i]][1] if dev.op_idx[i] >= 0 else dev.names[dev.name_idx[i]]
                out.append([_base(op), origin + int(dev.start_ns[i]), origin + int(dev.start_ns[i] + dev.dur_ns[i])])
            return out
    ev = trace.host.events
    if ev is None or not len(ev):
        return []
    is_op = np.array([bool(_OP.match(n)) for n in ev.names], dtype=bool)
    mask = is_op[ev.name_idx]
    if not mask.any():
        return []
    thread = int(np.bincount(ev.thread[mask]).argmax())        # the thread that runs the job's steps
    sel = np.flatnonzero(mask & (ev.thread == thread))[:limit]
    return [[_base(ev.names[ev.name_idx[i]]), origin + int(ev.start_ns[i]), origin + int(ev.end_ns[i])] for i in sel]


def _base(op: str) -> str:
    m = _OP.match(op)
    return m.group(1) if m else op


def skew(per_rank: dict[str, list[list]], hosts: dict[str, str] | None = None, last_share: float = 0.5) -> dict:
    """Matches each collective across ranks by its end and reads who
    arrived last. `per_rank`: rank -> collectives(); `hosts`: rank -> host."""
    ranks = sorted((r for r, c in per_rank.items() if c), key=_rank_key)
    out: dict = dict(ranks=len(per_rank), ranks_with_collectives=len(ranks), collectives=0, straggler=None,
                     per_rank={}, examples=[])
    if len(ranks) < 2:
        return out
    ref = min(ranks, key=lambda r: len(per_rank[r]))
    ends = {r: np.array([c[2] for c in per_rank[r]], dtype=np.int64) for r in ranks}
    gaps = np.diff(ends[ref])
    tolerance = max(5_000_000, int(0.25 * float(np.median(gaps)))) if len(gaps) else 5_000_000
    matched = []
    for op, _s, e in per_rank[ref]:
        group = {}
        for r in ranks:
            i = int(np.abs(ends[r] - e).argmin())
            c = per_rank[r][i]
            if c[0] == op and abs(c[2] - e) <= tolerance:
                group[r] = c
        if len(group) == len(ranks):
            matched.append((op, group))
    waits: dict[str, list[float]] = {r: [] for r in ranks}
    last: dict[str, int] = {r: 0 for r in ranks}
    late: dict[str, list[float]] = {r: [] for r in ranks}
    skews = []
    for op, group in matched:
        wait = {r: (c[2] - c[1]) / 1e9 for r, c in group.items()}
        longest = max(wait.values())
        arrived_last = min(wait, key=wait.get)
        last[arrived_last] += 1
        skews.append(longest - wait[arrived_last])
        for r, w in wait.items():
            waits[r].append(w)
            late[r].append(longest - w)
        if len(out["examples"]) < 10:
            out["examples"].append(dict(op=op, last=arrived_last, skew_seconds=longest - wait[arrived_last]))
    n = len(matched)
    out["collectives"] = n
    if not n:
        return out
    out["skew_seconds"] = dict(p50=statistics.median(skews), p90=float(np.percentile(skews, 90)), max=max(skews))
    for r in ranks:
        out["per_rank"][r] = dict(host=(hosts or {}).get(r), last=last[r], last_share=last[r] / n,
                                  wait_seconds_mean=statistics.fmean(waits[r]),
                                  late_seconds_mean=statistics.fmean(late[r]))
    top = max(ranks, key=lambda r: last[r])
    if n >= MIN_COLLECTIVES and last[top] / n >= last_share and out["skew_seconds"]["p50"] > 0:
        out["straggler"] = dict(rank=top, host=(hosts or {}).get(top), last_share=last[top] / n,
                                arrives_late_by_seconds=statistics.median(
                                    max(w.values()) - w[top] for w in
                                    ({r: (c[2] - c[1]) / 1e9 for r, c in g.items()} for _, g in matched)))
    return out


def _rank_key(r: str):
    return (0, int(r)) if r.isdigit() else (1, r)
