"""Findings lifecycle: an episode per GPU, opened when a bottleneck starts and
closed when it ends, never a row per window.

A window whose verdict differs from the open finding's closes it at that
window's start; idle closes without opening (idle is a state, not a
bottleneck). The evidence of a finding is the mean of its windows' numbers.

A capture linked to an open finding refines it: the trace's verdict becomes
the finding's (counters cannot tell launch-bound from host-bound; a trace
can), the counters' verdict is kept beside it, and `decided_by` says which.
Episodes still follow the counters, so a refined finding goes on for as long
as the counters keep saying what they said.
"""
from __future__ import annotations

import collections

import uuid

from .classify import Classification
from .detector import family
from .rules.common import IDLE

TRACE_DECIDES_AT = 0.5      # a trace verdict below this confidence is recorded, not adopted


class FindingsTracker:
    def __init__(self) -> None:
        self.open: dict[tuple[str, int], dict] = {}
        self._sums: dict[str, dict[str, float]] = {}
        self._votes: dict[str, collections.Counter] = {}

    def load(self, rows: list[dict]) -> None:
        """Resume the findings left open by a previous run of the analyzer."""
        for f in rows:
            self.open[(f["host"], f["gpu"])] = f
            self._sums[f["id"]] = {k: v * f["windows"] for k, v in f["evidence"].items()}
            self._votes[f["id"]] = collections.Counter({f["counters_verdict"]: f["windows"]})

    def observe(self, host: str, c: Classification, job: str) -> list[dict]:
        """Returns the findings that changed (closed, opened or extended)."""
        key = (host, c.gpu)
        cur = self.open.get(key)
        changed = []
        # One episode per bottleneck family: launch- and host-bound windows of
        # one starved stretch are one incident; the majority names it.
        if cur is not None and family(cur["counters_verdict"]) == family(c.verdict):
            n = cur["windows"] + 1
            sums = self._sums[cur["id"]]
            for k, v in c.evidence.items():
                sums[k] = sums.get(k, 0.0) + v
            votes = self._votes.setdefault(cur["id"], collections.Counter())
            votes[c.verdict] += 1
            majority = votes.most_common(1)[0][0]
            cur.update(windows=n, confidence=round((cur["confidence"] * (n - 1) + c.confidence) / n, 3),
                       evidence={k: round(v / n, 6) for k, v in sums.items()},
                       flags=sorted(set(cur["flags"]) | set(c.flags)), job=job or cur["job"],
                       counters_verdict=majority)
            if cur["decided_by"] == "counters":
                cur["verdict"] = majority
                if majority != c.verdict or len(votes) > 1:
                    cur["alternatives"] = sorted(set(votes) - {majority}) or cur["alternatives"]
            return [cur]
        if cur is not None:
            changed.append(self.close(key, c.start))
        if c.verdict != IDLE:
            f = dict(id=uuid.uuid4().hex[:12], host=host, gpu=c.gpu, job=job, verdict=c.verdict,
                     start=c.start, end=None, confidence=c.confidence, windows=1,
                     evidence=dict(c.evidence), flags=list(c.flags), summary=c.summary,
                     alternatives=list(c.alternatives), decided_by="counters", counters_verdict=c.verdict,
                     trace_verdict=None, captures=[])
            self.open[key] = f
            self._sums[f["id"]] = dict(c.evidence)
            self._votes[f["id"]] = collections.Counter({c.verdict: 1})
            changed.append(f)
        return changed

    def close(self, key: tuple[str, int], end: float) -> dict:
        f = self.open.pop(key)
        self._sums.pop(f["id"], None)
        self._votes.pop(f["id"], None)
        f["end"] = max(end, f["start"])
        return f

    def attach_capture(self, host: str, gpus: list[int], capture_id: str, verdict: str | None,
                       confidence: float, summary: str) -> dict | None:
        """Link a capture to the open finding of one of its GPUs; returns the
        finding if one was open."""
        for gpu in gpus:
            f = self.open.get((host, gpu))
            if f is None:
                continue
            f["captures"] = list(f.get("captures") or []) + [capture_id]
            if verdict is not None:
                f["trace_verdict"] = verdict
                if confidence >= TRACE_DECIDES_AT:
                    if verdict != f["counters_verdict"]:
                        f["summary"] = f"{summary} (trace); counters said {f['counters_verdict']}"
                    f["verdict"], f["decided_by"] = verdict, "trace"
                    f["alternatives"] = []
            return f
        return None
