"""Retention: samples older than the retention horizon (default 14 days) are
rolled up to one row per GPU-minute (`samples_1m`: every metric's mean and the
sample count) and deleted, with the processes, health events and windows of
the same age.

Ingest must never wait long for it, so the work is cut into chunks of at most
`chunk_s` of data (one hour to start with), each one transaction on the writer
thread, between commit groups. A chunk that took longer than `target_pause_s`
halves the next one; a quick one doubles it (one minute to one day). A pass
runs the chunks one after another, with a breather as long as the chunk
between them, until nothing older than the horizon is left; then it prunes the
bookkeeping (agent boots and devices unseen since the horizon, except each
host's newest boot) and, at the long `history_s` horizon (default 365 days),
the per-minute rollups, closed findings, anomalies, decisions and captures.
The analyzer schedules a pass every `interval_s` (10 minutes). Each pass also
moves the findings, anomalies and decisions that can no longer change to
their history tables, in chunks (analyzers/hot_tables.py), so that the keyed
tables, whose indexes DuckDB holds in memory, stay small.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import structlog

from .hot_tables import HOT_S, MOVE_ROWS
from .store import Store

log = structlog.get_logger("gpuscope.retention")

DAY = 86400.0
MIN_CHUNK_S, MAX_CHUNK_S = 60.0, DAY


@dataclass(frozen=True)
class RetentionConfig:
    retention_s: float = 14 * DAY     # raw samples, processes, health, windows
    rollup: bool = True               # keep per-minute means of what is deleted
    history_s: float = 365 * DAY      # rollups, closed findings, anomalies, decisions, captures
    interval_s: float = 600.0         # between passes
    chunk_s: float = 3600.0           # data per transaction to start with
    target_pause_s: float = 0.25      # what one chunk may hold the writer for

    def __post_init__(self) -> None:
        if not (self.retention_s >= 60):
            raise ValueError(f"retention must be at least a minute, got {self.retention_s:g} s")
        if not (self.history_s >= self.retention_s):
            raise ValueError("the history horizon must be at least the retention")


@dataclass
class PassResult:
    chunks: int = 0
    seconds: float = 0.0              # writer time, summed over chunks
    longest_chunk_s: float = 0.0      # the longest pause imposed on ingest
    counts: dict[str, int] = field(default_factory=dict)
    complete: bool = False            # nothing older than the horizon is left

    def add(self, counts: dict) -> None:
        for k, v in counts.items():
            if isinstance(v, int):
                self.counts[k] = self.counts.get(k, 0) + v


def parse_age(text: str) -> float:
    """`14d`, `36h`, `90m`, `3600s` or seconds -> seconds (for the CLI's --retention)."""
    text = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}
    scale = units.get(text[-1:], None)
    number = text[:-1] if scale is not None else text
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"{text!r}: expected an age like 14d, 36h or 90m") from None
    if not math.isfinite(value) or value < 60:
        raise ValueError(f"{text!r}: at least a minute")
    return value


class Retention:
    """One chunk at a time (`chunk`, on the writer thread); a pass (`run_pass`)
    feeds chunks to the writer until the store is within the horizon."""

    def __init__(self, config: RetentionConfig = RetentionConfig(), clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self.chunk_s = _minutes(config.chunk_s)
        self.samples_deleted = 0
        self.minutes_written = 0
        self.last_pass: PassResult | None = None

    def horizon(self) -> float:
        """The retention horizon, down to a whole minute: older minutes are rolled up whole."""
        return math.floor((self._clock() - self.config.retention_s) / 60.0) * 60.0

    def chunk(self, store: Store) -> dict:
        """One transaction on the writer thread. Returns the counts, the
        chunk's seconds, and `more`: whether anything older is left."""
        t0 = time.perf_counter()
        horizon = self.horizon()
        oldest = store.oldest_before(horizon)
        if oldest is None:
            try:
                moved = store.move_to_history(self._clock() - HOT_S, MOVE_ROWS)
            except Exception as exc:  # e.g. a full disk (a move copies rows): the deletes below still run
                log.warning("records not moved to history", error=f"{type(exc).__name__}: {exc}"[:300])
                moved = {}
            counts = {f"{table}_moved": n for table, n in moved.items()}
            if max(moved.values(), default=0) >= MOVE_ROWS:        # more to move: another chunk
                return dict(counts, more=True, seconds=time.perf_counter() - t0, lo=None, hi=None)
            counts.update(store.prune_bookkeeping(horizon))
            counts.update(store.prune_history(self._clock() - self.config.history_s))
            return dict(counts, more=False, seconds=time.perf_counter() - t0, lo=None, hi=None)
        lo = math.floor(oldest / 60.0) * 60.0
        hi = min(lo + self.chunk_s, horizon)
        counts = store.retention_chunk(lo, hi, self.config.rollup)
        seconds = time.perf_counter() - t0
        self.samples_deleted += counts["samples_deleted"]
        self.minutes_written += counts["minutes_written"]
        self._adapt(seconds)
        return dict(counts, more=True, seconds=seconds, lo=lo, hi=hi)

    def _adapt(self, seconds: float) -> None:
        target = self.config.target_pause_s
        if seconds > target:
            self.chunk_s = max(MIN_CHUNK_S, _minutes(self.chunk_s / 2))
        elif seconds < target / 4:
            self.chunk_s = min(MAX_CHUNK_S, self.chunk_s * 2)

    def run_pass(self, call: Callable[[Callable[[Store], dict]], Future],
                 keep_going: Callable[[], bool] = lambda: True, max_chunks: int = 100_000,
                 breather: bool = True, on_chunk: Callable[[dict], None] | None = None) -> PassResult:
        """Chunks through `call` (the writer's), one at a time, until none is
        left, keep_going() turns false, or max_chunks. Runs on a scheduler
        thread, never on the writer's."""
        result = PassResult()
        while keep_going() and result.chunks < max_chunks:
            r = call(self.chunk).result(timeout=300)
            result.chunks += 1
            result.seconds += r["seconds"]
            result.longest_chunk_s = max(result.longest_chunk_s, r["seconds"])
            result.add(r)
            if on_chunk is not None:
                on_chunk(r)
            if not r["more"]:
                result.complete = True
                break
            if breather:              # at most half the writer's time, whatever the backlog
                time.sleep(min(r["seconds"], 1.0))
        self.last_pass = result
        if result.counts.get("samples_deleted") or result.counts.get("agents_deleted"):
            log.info("retention pass", chunks=result.chunks, writer_seconds=round(result.seconds, 3),
                     longest_chunk_s=round(result.longest_chunk_s, 3), **result.counts)
        return result


def _minutes(seconds: float) -> float:
    return max(60.0, math.floor(seconds / 60.0) * 60.0)
