"""Findings of the analyzer's fleet checks: conditions found by setting a GPU
(or a run) against others, not by judging its own windows: `degraded`
(degraded.py: under its peers) and `regression` (a program slower than its
baseline).

A check runs on a schedule and says what holds now, each condition under a
key that stays the same for as long as the condition does ("degraded:hbm:"
and the GPU's UUID). Reconciling a check's answer with the open findings of
its kind keeps one finding per condition, as findings.py keeps one per
bottleneck episode: a new key opens a finding at the check's time; a key
still found updates its numbers to the newest check's and counts the checks
that found it (`windows`); a key missing from `misses_to_close` checks in a
row closes at the time of the last check that found it, so a GPU at the edge
of a threshold does not open and close a finding at every check.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .ids import new_id

MISSES_TO_CLOSE = 2


@dataclass
class Reconciled:
    opened: list[dict] = field(default_factory=list)
    updated: list[dict] = field(default_factory=list)     # still found; numbers refreshed
    closed: list[dict] = field(default_factory=list)

    @property
    def changed(self) -> list[dict]:
        return self.opened + self.updated + self.closed


class ConditionFindings:
    """The open findings of one kind, as the store holds them, and the
    checks that did not find each one since it was last found (memory only:
    a restart forgets them, which at worst closes a finding one check late)."""

    def __init__(self, kind: str, open_rows: list[dict], misses_to_close: int = MISSES_TO_CLOSE,
                 ended_words: str = "no longer found") -> None:
        self.kind = kind
        self.misses_to_close = misses_to_close
        self.ended_words = ended_words
        self.open: dict[str, dict] = {f["condition_key"]: f for f in open_rows if f.get("condition_key")}
        self._misses: dict[str, int] = {}

    def reconcile(self, found: list[dict], now: float) -> Reconciled:
        """`found`: the check's conditions at `now`, each with `key`, `host`,
        `gpu`, `summary`, `evidence` (numbers), `flags`, `confidence`, and
        optionally `job`, `attribution`, `source`."""
        out = Reconciled()
        seen = set()
        for c in found:
            key = c["key"]
            if key in seen:
                raise ValueError(f"{self.kind} check found {key!r} twice")
            seen.add(key)
            self._misses.pop(key, None)
            f = self.open.get(key)
            if f is None:
                f = self.open[key] = dict(
                    id=new_id(), host=c["host"], gpu=c["gpu"], job=c.get("job"), verdict=self.kind,
                    start=now, end=None, windows=0, alternatives=[], decided_by="fleet check",
                    counters_verdict=None, trace_verdict=None, captures=[], kind=self.kind, condition_key=key)
                out.opened.append(f)
            else:
                out.updated.append(f)
            f.update(confidence=c["confidence"], evidence=dict(c["evidence"]), flags=list(c.get("flags") or ()),
                     summary=c["summary"], attribution=c.get("attribution") or f.get("attribution") or {},
                     source=c.get("source", ""), windows=(f["windows"] or 0) + 1, last_window_end=now)
            if c.get("job"):
                f["job"] = c["job"]
        for key in [k for k in self.open if k not in seen]:
            misses = self._misses[key] = self._misses.get(key, 0) + 1
            if misses >= self.misses_to_close:
                f = self.open.pop(key)
                self._misses.pop(key, None)
                # ends when it was last found; a row resumed from the store keeps what it last absorbed
                f["end"] = max(f.get("last_window_end") or f.get("absorbed_until") or f["start"], f["start"])
                f["ended_because"] = f"{self.ended_words} ({misses} checks in a row)"
                f["summary"] = f"{f['summary']}; ended: {f['ended_because']}"
                out.closed.append(f)
        return out
