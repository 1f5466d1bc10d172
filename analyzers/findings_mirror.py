"""Recent findings as the analysis process wrote them, kept in the gRPC
process so that `ListFindings` is answered where the writer's GIL is not.

Why: at 1,500 agents a fleet-wide list answered by the analysis process
waited for its writer thread (p95 0.5 s against the 200 ms target,
docs/benchmarks.md); GetStatus, answered from StatusMirror, did not. The
analysis process sends every findings row it writes, after the commit that
wrote it, with the status rows it publishes; a new analysis process first
sends the open findings and the newest closed ones.

What the mirror holds: every open finding, and every closed finding that
ended after `covered_after`; the oldest-ended closed rows are dropped past
`max_closed`, and `covered_after` moves up to the newest end dropped. So a
query is answered here only when the answer is exact:
- its range starts after `covered_after` (every row that can match is here), or
- at least `limit` of the matching rows here started after `covered_after`:
  a row not here ended, so started, by then, and sorts after them.
Otherwise (`answer` returns None) the caller asks the store.

Open findings are as last written: their running numbers (windows,
confidence, evidence) at most the snapshot interval old, and
`absorbed_until` says which window they hold. A change of verdict, an
opening or a closing is written, and mirrored, at once.
"""
from __future__ import annotations

import bisect
import json
import math
import threading
from typing import Any, Callable, Iterable, Sequence

from .store import FINDING_COLUMNS, finding_fields

MAX_CLOSED = 4_000           # ~1 KB a row: ~4 MB; a fleet-wide list of the last 1,000 four times over
MAX_MADE = 3_000             # rows whose reply entry is kept (~0.8 KB each)

_ID, _HOST, _GPU, _VERDICT, _START, _END, _FLAGS, _ATTRIBUTION, _KIND = (
    FINDING_COLUMNS.index(c) for c in ("id", "host", "gpu", "verdict", "start", "end", "flags", "attribution", "kind"))


class FindingsMirror:
    def __init__(self, max_closed: int = MAX_CLOSED) -> None:
        self.max_closed = max_closed
        self._rows: dict[str, tuple] = {}       # id -> the row as written (FINDING_COLUMNS, JSON as text)
        # start // 60 -> (start, id) of its rows, sorted: a newest-first list of `limit` reads about
        # `limit` rows, not all of them (16,000 open findings at 2,000 agents: 75 ms a list before)
        self._by_minute: dict[int, list[tuple[float, str]]] = {}
        self._made: dict[str, dict[str, Any]] = {}   # id -> variant -> what `messages` made of the row
        self._closed = 0
        self.covered_after: float | None = None   # None: nothing received yet
        self._lock = threading.Lock()

    def reset(self, rows: Iterable[tuple], covered_after: float) -> None:
        """A new analysis process's first publication: the open findings and
        the newest closed ones; every closed finding that ended after
        `covered_after` is among them."""
        with self._lock:
            self._rows, self._by_minute, self._made = {}, {}, {}
            self._closed = 0
            self.covered_after = covered_after
            self._put(rows)

    def apply(self, rows: Sequence[tuple]) -> None:
        """Rows the analysis process wrote and committed since it last published."""
        if not rows:
            return
        with self._lock:
            if self.covered_after is not None:
                self._put(rows)

    def _put(self, rows: Iterable[tuple]) -> None:
        cov = self.covered_after
        for r in rows:
            fid = r[_ID]
            old = self._rows.get(fid)
            if r[_END] is not None and r[_END] <= cov:      # outside what this mirror claims to hold
                self._drop(fid)
                continue
            if old is not None and old[_START] == r[_START]:    # written again: its place is the same
                self._closed += (r[_END] is not None) - (old[_END] is not None)
                self._made.pop(fid, None)
            else:
                self._drop(fid)
                bisect.insort(self._by_minute.setdefault(_minute(r), []), (r[_START], fid))
                self._closed += r[_END] is not None
            self._rows[fid] = r
        if self._closed > self.max_closed:
            self._evict()

    def _drop(self, fid: str) -> None:
        old = self._rows.pop(fid, None)
        if old is None:
            return
        self._closed -= old[_END] is not None
        keys = self._by_minute[_minute(old)]
        del keys[bisect.bisect_left(keys, (old[_START], fid))]
        if not keys:
            del self._by_minute[_minute(old)]
        self._made.pop(fid, None)

    def _evict(self) -> None:
        # down to 90 %: a sort per tenth of the capacity written, not per row
        keep = int(self.max_closed * 0.9)
        ends = sorted((r[_END], fid) for fid, r in self._rows.items() if r[_END] is not None)
        drop = ends[:len(ends) - keep]
        for _end, fid in drop:
            self._drop(fid)
        self.covered_after = max(self.covered_after, drop[-1][0])

    def __len__(self) -> int:
        return len(self._rows)

    def answer(self, **query) -> list[dict] | None:
        """Store.findings_table's rows for the same query (its arguments), as
        `finding_dicts` makes them, or None when this mirror cannot answer it
        exactly."""
        with self._lock:
            rows = self._select(**query)
        return None if rows is None else _dicts(rows)

    def messages(self, convert: Callable[[dict], Any], variant: str, **query) -> list | None:
        """`answer`'s rows, each as `convert` makes it; what it made of a row
        is kept (per `variant`) until the row is written again, so a list
        asked for every second converts only what changed."""
        with self._lock:
            rows = self._select(**query)
            if rows is None:
                return None
            made = self._made
            out = [made.get(r[_ID], {}).get(variant) for r in rows]
        todo = [r for r, m in zip(rows, out) if m is None]
        new = {r[_ID]: convert(d) for r, d in zip(todo, _dicts(todo))}
        with self._lock:
            if len(made) + len(todo) > MAX_MADE:      # many lists of many rows: start again
                made.clear()
            for r in todo:
                if self._rows.get(r[_ID]) is r:         # not written again meanwhile
                    made.setdefault(r[_ID], {})[variant] = new[r[_ID]]
        return [m if m is not None else new[r[_ID]] for r, m in zip(rows, out)]

    def _select(self, host: str = "", gpu: int | None = None, verdicts: Iterable[str] = (),
                start: float | None = None, end: float | None = None, open_only: bool = False,
                limit: int = 1000, flags: Iterable[str] = (), pod: str = "", namespace: str = "",
                slurm_job: str = "", gpus: Sequence[tuple[str, int]] = (),
                kinds: Iterable[str] = ()) -> list[tuple] | None:
        """Under the lock: the rows, newest first, or None (not exact here)."""
        cov = self.covered_after
        if cov is None:
            return None
        if limit <= 0:
            return []
        match = _matcher(host, gpu, verdicts, start, end, open_only, flags, pod, namespace, slurm_job, gpus, kinds)
        by_range = start is not None and start > cov      # every row that can match is here
        rows, found = self._rows, []
        for minute in sorted(self._by_minute, reverse=True):     # newest first, as the store orders them
            for _start, fid in reversed(self._by_minute[minute]):
                r = rows[fid]
                if match(r):
                    found.append(r)
                    if len(found) == limit:
                        # exact if every row that can match is here, or if the last row kept started after
                        # `cov`: a row not here ended, so started, by then, and sorts after all of these
                        return found if by_range or r[_START] > cov else None
        return found if by_range else None


def _dicts(rows: list[tuple]) -> list[dict]:
    return finding_fields([dict(zip(FINDING_COLUMNS, r)) for r in rows])


def _minute(row: tuple) -> int:
    return int(row[_START] // 60)


def _matcher(host, gpu, verdicts, start, end, open_only, flags, pod, namespace, slurm_job, gpus, kinds):
    """The predicate Store.findings_table's WHERE clause is, over a row as written."""
    tests = []
    if host:
        tests.append(lambda r: r[_HOST] == host)
    if gpu is not None:
        tests.append(lambda r: r[_GPU] == gpu)
    kinds = set(kinds)
    if kinds:
        tests.append(lambda r: (r[_KIND] or "bottleneck") in kinds)
    pairs = set(gpus)
    if pairs:
        tests.append(lambda r: (r[_HOST], r[_GPU]) in pairs)
    if "/" in pod:
        namespace, pod = pod.split("/", 1)
    labels = [(k, v) for k, v in (("pod", pod), ("namespace", namespace), ("slurm_job", slurm_job)) if v]
    if labels:
        tests.append(lambda r: _labels_match(r[_ATTRIBUTION], labels))
    verdicts = set(verdicts)
    if verdicts:
        tests.append(lambda r: r[_VERDICT] in verdicts)
    if start is not None:
        tests.append(lambda r: (math.inf if r[_END] is None else r[_END]) >= start)
    if end is not None:
        tests.append(lambda r: r[_START] <= end)
    if open_only:
        tests.append(lambda r: r[_END] is None)
    for flag in flags:            # as the store: the quoted word is in the flags' JSON text
        quoted = json.dumps(flag)
        tests.append(lambda r, q=quoted: r[_FLAGS] is not None and q in r[_FLAGS])
    return lambda r: all(t(r) for t in tests)


def _labels_match(attribution: str | None, labels: list[tuple[str, str]]) -> bool:
    if not attribution or attribution == "{}":
        return False
    a = json.loads(attribution)
    return all(isinstance(a.get(k), str) and a[k] == v for k, v in labels)
