"""Findings lifecycle: an episode per GPU, opened when a bottleneck starts and
closed when it ends, never a row per window.

A window whose verdict differs from the open finding's closes it; idle closes
without opening (idle is a state, not a bottleneck). The evidence of a finding
is the mean of its windows' numbers.

A finding ends when the last sample that supported it was taken: at the end
of the last window it absorbed, whatever closes it (a different verdict, the
GPU going silent, an analyzer restart) and however late. A window that comes
more than `max_gap_s` after that end (the agent was silent meanwhile, e.g.
`gpuscope up` was stopped and started again) never extends it: the old
episode closes at its last window and a new one opens. Every closed finding
says why in its summary ("...; ended: became compute-bound", "...; ended:
agent went silent (no samples for 47 s)").

A capture linked to an open finding refines it: the trace's verdict becomes
the finding's (counters cannot tell launch-bound from host-bound; a trace
can), the counters' verdict is kept beside it, and `decided_by` says which.
Episodes still follow the counters, so a refined finding goes on for as long
as the counters keep saying what they said.
"""
from __future__ import annotations

import collections
import operator

from .classify import Classification
from .detector import family
from .ids import new_id
from .rules.common import IDLE
from .rules.transitional import TRANSITIONAL
from .serving import SERVING_WORDS

TRACE_DECIDES_AT = 0.5      # a trace verdict below this confidence is recorded, not adopted


class FindingsTracker:
    def __init__(self, window_s: float | None = None, max_gap_s: float | None = None) -> None:
        self.window_s = window_s
        self.max_gap_s = max_gap_s       # None: a gap never closes a finding by itself
        self.open: dict[tuple[str, int], dict] = {}
        # each open finding's evidence summed over its windows: the names once, the sums in a list
        # aligned with them, which a window adds to in one pass (a dict per finding, updated key by key,
        # was a fifth of the live analysis at 2,000 agents)
        self._keys: dict[str, tuple[str, ...]] = {}
        self._sums: dict[str, list[float]] = {}
        # windows of a finding that lacked a number its others have (a serving engine's /metrics,
        # scraped once a window, can miss one): its mean is over the windows that had it
        self._missing: dict[str, dict[str, int]] = {}
        self._votes: dict[str, collections.Counter] = {}
        self._confidence: dict[str, float] = {}      # the sum of its windows' confidences
        self._first_summary: dict[str, str] = {}      # the opening window's words, under any split prefix
        self._serving: dict[str, str] = {}            # the newest window's serving words (analyzers/serving.py)
        self._serving_missed: dict[str, int] = {}     # windows since, that had none

    def load(self, rows: list[dict], last_window_ends: dict[tuple[str, int], float] | None = None,
             unwritten: dict[str, list[tuple[str, float]]] | None = None) -> None:
        """Resume the findings left open by a previous run of the analyzer.
        `last_window_ends`: the newest stored window end of each GPU, which
        is the last window such a finding absorbed (windows and findings are
        written in one transaction). `unwritten`: by finding id, the
        (verdict, confidence) of windows it absorbed after its row was last
        written (a kill -9 cost the row, not the windows): counted in, their
        votes and confidence; the evidence means stay as written.

        A row keeps its windows' votes as the majority's share
        (evidence["verdict_share"]) and its alternatives, and its confidence
        as their mean confidence times that share: both are taken apart
        again here, so that an episode split between launch- and host-bound
        resumes with the votes it had (before, every window was counted for
        the majority, and a 0.75 finding came back 0.875)."""
        ends = last_window_ends or {}
        for f in rows:
            key = (f["host"], f["gpu"])
            end = ends.get(key)
            if end is None or end < f["start"]:      # its windows were pruned: estimate
                end = f["start"] + (f["windows"] * self.window_s if self.window_s else 0.0)
            f["last_window_end"] = end
            self.open[key] = f
            evidence = {k: v for k, v in f["evidence"].items() if k != "verdict_share"}
            votes, summed = _votes_of(f)
            for verdict, confidence in (unwritten or {}).get(f["id"], ()):
                votes[verdict] += 1
                summed += confidence
            n = f["windows"] = sum(votes.values())
            majority, f["confidence"] = _tally(votes, summed, n)
            f["counters_verdict"] = majority
            self._keys[f["id"]] = tuple(evidence)
            self._sums[f["id"]] = [v * n for v in evidence.values()]
            self._votes[f["id"]] = votes
            self._confidence[f["id"]] = summed
            first, serving = _split_serving(f["summary"] or "")
            first = self._first_summary[f["id"]] = first.rpartition(SPLIT_WORDS_END)[2]
            if serving:
                self._serving[f["id"]] = serving
            if f["decided_by"] == "counters":       # the verdict and split words as the votes are now (observe's)
                f["verdict"] = majority
                f["summary"] = _split_words(votes, n) + first + serving

    def observe(self, host: str, c: Classification, job: str, owner: dict[str, str] | None = None,
                source: str = "") -> list[dict]:
        """Returns the findings that changed (closed, opened or extended).
        A transitional window (rules/transitional.py) changes none: the
        windows on either side of the change say what each regime is.
        `owner`: the job's attribution (pod, Slurm job, user...), which a
        finding carries as `attribution` and follows with its job. `source`:
        where the GPU's counters come from ("dcgm (profiling)"); a finding
        keeps its first window's, so a later outage of the source does not
        rewrite what decided it (found in a trial)."""
        if TRANSITIONAL in c.flags:
            return []
        key = (host, c.gpu)
        cur = self.open.get(key)
        changed = []
        if cur is not None and self.max_gap_s is not None and c.start - self.last_end(cur) > self.max_gap_s:
            gap = c.start - self.last_end(cur)
            changed.append(self.close(key, reason=f"agent went silent (no samples for {gap:.0f} s)"))
            cur = None
        # One episode per bottleneck family: launch- and host-bound windows of
        # one starved stretch are one incident; the majority names it.
        if cur is not None and family(cur["counters_verdict"]) == family(c.verdict):
            n = cur["windows"] + 1
            self._add_evidence(cur["id"], c.evidence, n)
            votes = self._votes.setdefault(cur["id"], collections.Counter())
            votes[c.verdict] += 1
            # evidence (the means) is worked out when the finding is read or written: evidence_of()
            summed = self._confidence[cur["id"]] = self._confidence.get(cur["id"], 0.0) + c.confidence
            majority, confidence = _tally(votes, summed, n)
            cur.update(windows=n, confidence=confidence,
                       counters_verdict=majority, last_window_end=max(c.end, self.last_end(cur)),
                       source=cur.get("source") or source)
            if job:                        # a window without processes keeps the job it had
                cur["job"], cur["attribution"] = job, owner or {}
            if c.flags and not set(c.flags) <= set(cur["flags"]):
                cur["flags"] = sorted(set(cur["flags"]) | set(c.flags))
            if cur["decided_by"] == "counters":
                cur["verdict"] = majority
                if majority != c.verdict or len(votes) > 1:
                    cur["alternatives"] = sorted(set(votes) - {majority}) or cur["alternatives"]
                serving = _split_serving(c.summary)[1]
                if serving:                # what the engine does now, not when the episode began
                    self._serving[cur["id"]] = serving
                    self._serving_missed.pop(cur["id"], None)
                elif cur["id"] in self._serving:
                    # a scrape a window can miss one; two in a row: the engine is gone or mute
                    missed = self._serving_missed[cur["id"]] = self._serving_missed.get(cur["id"], 0) + 1
                    if missed >= 2:
                        self._serving.pop(cur["id"], None)
                cur["summary"] = (_split_words(votes, n) + self._first_summary.get(cur["id"], "")
                                  + self._serving.get(cur["id"], ""))
            return [cur]
        if cur is not None:
            changed.append(self.close(key, reason="GPU went idle" if c.verdict == IDLE else f"became {c.verdict}"))
        if c.verdict != IDLE:
            f = dict(id=new_id(), host=host, gpu=c.gpu, job=job, verdict=c.verdict,
                     start=c.start, end=None, confidence=c.confidence, windows=1,
                     evidence=dict(c.evidence), flags=list(c.flags), summary=c.summary,
                     alternatives=list(c.alternatives), decided_by="counters", counters_verdict=c.verdict,
                     trace_verdict=None, captures=[], last_window_end=c.end, attribution=owner or {},
                     source=source)
            self.open[key] = f
            self._first_summary[f["id"]], serving = _split_serving(c.summary)
            if serving:
                self._serving[f["id"]] = serving
            self._keys[f["id"]] = tuple(c.evidence)
            self._sums[f["id"]] = list(c.evidence.values())
            self._votes[f["id"]] = collections.Counter({c.verdict: 1})
            self._confidence[f["id"]] = c.confidence
            changed.append(f)
        return changed

    def _add_evidence(self, fid: str, evidence: dict[str, float], n: int) -> None:
        """Adds a window's numbers to the finding's sums; `n`: its windows
        with this one. A window whose names differ (a number missing, or
        one the others lacked) is merged by name, and counted as missing."""
        keys = self._keys[fid]
        if keys == tuple(evidence):
            self._sums[fid] = list(map(operator.add, self._sums[fid], evidence.values()))
            return
        sums = dict(zip(keys, self._sums[fid]))
        missing = self._missing.setdefault(fid, {})
        for k in sums.keys() - evidence.keys():
            missing[k] = missing.get(k, 0) + 1
        for k in evidence.keys() - sums.keys():
            missing[k] = n - 1
        for k, v in evidence.items():
            sums[k] = sums.get(k, 0.0) + v
        self._keys[fid], self._sums[fid] = tuple(sums), list(sums.values())

    def evidence_of(self, f: dict) -> dict[str, float]:
        """The finding's evidence now: the mean of its windows' numbers.
        Safe from any thread: a window replaces the sums' list, never
        changes it, and names and sums are read together."""
        keys, values = self._keys.get(f["id"]), self._sums.get(f["id"])
        if keys is None or values is None or len(keys) != len(values):
            return f["evidence"]
        sums = dict(zip(keys, values))
        n = f["windows"]
        missing = self._missing.get(f["id"])
        if missing:
            missing = dict(missing)
            out = {k: round(v / max(n - missing.get(k, 0), 1), 6) for k, v in sums.items()}
        else:
            out = {k: round(v / n, 6) for k, v in sums.items()}
        votes = self._votes.get(f["id"])
        if votes:
            out["verdict_share"] = round(votes[f["counters_verdict"]] / max(sum(votes.values()), 1), 3)
        return out

    def current(self, f: dict) -> dict:
        """Writer thread: brings the finding's evidence up to date, for
        writing or publishing it."""
        f["evidence"] = self.evidence_of(f)
        return f

    def last_end(self, f: dict) -> float:
        """The end of the last window the finding absorbed."""
        end = f.get("last_window_end")
        return f["start"] if end is None else end

    def close(self, key: tuple[str, int], end: float | None = None, reason: str = "") -> dict:
        """Closes the GPU's open finding at `end`, by default (and as it
        should be) the end of the last window it absorbed; `reason` is
        appended to its summary."""
        f = self.current(self.open.pop(key))
        self._keys.pop(f["id"], None)
        self._sums.pop(f["id"], None)
        self._missing.pop(f["id"], None)
        self._votes.pop(f["id"], None)
        self._confidence.pop(f["id"], None)
        self._first_summary.pop(f["id"], None)
        self._serving.pop(f["id"], None)
        self._serving_missed.pop(f["id"], None)
        f["end"] = max(self.last_end(f) if end is None else end, f["start"])
        if reason:
            f["ended_because"] = reason
            f["summary"] = f"{f['summary']}; ended: {reason}" if f.get("summary") else f"ended: {reason}"
        return f

    def attach_capture(self, host: str, gpus: list[int], capture_id: str, verdict: str | None,
                       confidence: float, summary: str, ended: float = 0.0) -> dict | None:
        """Link a capture to the open finding of one of its GPUs; returns the
        finding if one was open. `ended`: when the capture's trace ends (0:
        not said); a capture over before the open finding began traced
        another episode, and must not decide this one (found in a trial:
        captures reported late turned a newer finding's verdict)."""
        for gpu in gpus:
            f = self.open.get((host, gpu))
            if f is None or (ended and ended < f["start"]):
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


def _tally(votes: collections.Counter, summed: float, n: int) -> tuple[str, float]:
    """The majority verdict (ties: the one seen first) and the confidence:
    the windows' mean confidence times the share that voted for it, so an
    episode split between launch- and host-bound is not 1.00 sure of either
    (found in a trial)."""
    majority = max(votes, key=votes.__getitem__)
    return majority, round(summed / n * votes[majority] / n, 3)


def _votes_of(f: dict) -> tuple[collections.Counter, float]:
    """A stored finding's window votes and summed confidence, from its
    windows, majority share and alternatives (FindingsTracker.load)."""
    n = max(int(f["windows"]), 1)
    share = f["evidence"].get("verdict_share")
    share = 1.0 if not isinstance(share, (int, float)) or not 0.0 < share <= 1.0 else float(share)
    k = min(max(round(share * n), 1), n)
    votes = collections.Counter({f["counters_verdict"]: k})
    if k < n:        # the minority: within one bottleneck family there is one other verdict
        others = [a for a in f.get("alternatives") or () if a != f["counters_verdict"]]
        votes[others[0] if others else f["counters_verdict"]] += n - k
    return votes, f["confidence"] / (k / n) * n


SPLIT_WORDS_END = ", a capture decides; "
SPLIT_SHARE = 0.3      # a minority this large within the starved family: counters cannot tell which


def _split_words(votes: collections.Counter, n: int) -> str:
    """How the episode's windows voted, when launch- and host-bound split it:
    the counters cannot separate the two (each names the other as its
    alternative), so the finding says so rather than pick one."""
    if len(votes) < 2 or n < 3:
        return ""
    ranked = votes.most_common()
    if ranked[1][1] / n < SPLIT_SHARE:
        return ""
    names = " or ".join(v.replace("-bound", "") for v, _ in ranked[:2])
    counts = ", ".join(f"{v} in {k} of {n} windows" for v, k in ranked)
    return f"{names}-bound ({counts}): counters cannot tell them apart{SPLIT_WORDS_END}"


def _split_serving(summary: str) -> tuple[str, str]:
    """(the verdict's words, the serving engine's words) of a summary."""
    i = summary.find(SERVING_WORDS)
    return (summary, "") if i < 0 else (summary[:i], summary[i:])
