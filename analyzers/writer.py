"""The single writer: group commit of decoded batches into the store.

Ingest decodes and hands batches here; one thread drains whatever is
queued and hands each group to a commit thread, which drops those already
stored (exactly, by the committed seqs of each (host, boot_id), never by a
high-water mark), appends the rest in one transaction on its own DuckDB
connection, and only then resolves each batch's future. An
acknowledgement therefore always means stored. The live analysis of what
committed runs on the first thread, overlapping the next group's commit;
the rows it writes (windows, findings, anomalies) it hands back to the
commit thread (`defer`), which stores them before the next group, so that
the analysis never waits for DuckDB either.

A failed group is retried in halves, so a batch that can never be stored
fails alone (BatchRejected, the agent drops it) and the others commit. A
failure of the store itself (disk full, file gone) fails the group as
StoreUnavailable; the agents resend, and nothing was acknowledged.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import duckdb
import numpy as np
import pyarrow as pa
import structlog

from .features import stack_columns
from .flow import ByteBudget, take_queued
from .throttle import Throttle
from .ingest import METRIC_NAMES, DecodedBatch, ProcessRows
from .seqset import SeqSet
from .store import Store, encode_ranges

COMMITTED, DUPLICATE = "committed", "duplicate"
DEFAULT_QUEUE_BYTES = 64 << 20
# A group is what was queued when the writer last looked, up to this. 1,024
# cost 20 % less live analysis a batch than 256 (each group's DuckDB
# statements, ~5-15 ms each, spread wider) and held 15 % more batches a
# second at 2,000 agents, but the gRPC process's event loop then stalled for
# 0.4-1.9 s every few seconds and GetStatus p95 went from 0.4-0.7 to 1.3-2.0 s
# (docs/benchmarks.md, 2026-12-03); with decoding off the loop, still ~1.05 s.
# Kept at 256 until the rest of those bursts is found; 512 again on 2026-12-07: +0.7 % at saturation,
# GetStatus p95 doubled.
MAX_GROUP = 256
log = structlog.get_logger("gpuscope.writer")

# Errors of the data: the same batch fails again however often it is sent.
_PERMANENT = (duckdb.DataError, duckdb.IntegrityError, duckdb.ProgrammingError,
              pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError)
# Errors of the store: halving the group cannot help.
_ENVIRONMENT = (duckdb.OperationalError, duckdb.FatalException, OSError)   # I/O, memory, WAL


def samples_table(batches: list[DecodedBatch]) -> pa.Table:
    """One Arrow table of a group's samples: host, gpu, t and the metrics
    any of them carries (NULL where a batch lacks one or marked it missing;
    a stored value is never NaN). Built once per group, not per batch."""
    names = batches[0].names
    if any(b.names != names for b in batches):
        names = tuple(m for m in METRIC_NAMES if any(m in b.names for b in batches))
    values = stack_columns([(b.names, b.values) for b in batches], names).matrix
    hosts = [h for b in batches for h in [b.host] * b.count]
    cols = [pa.array(hosts, pa.string()),
            pa.array(np.concatenate([b.gpu for b in batches]).astype(np.int32), pa.int32()),
            pa.array(np.concatenate([b.t for b in batches]), pa.float64())]
    for i in range(len(names)):
        v = np.ascontiguousarray(values[:, i])
        cols.append(pa.array(v, pa.float64(), mask=np.isnan(v)))
    return pa.Table.from_arrays(cols, names=["host", "gpu", "t", *names])


class BatchRejected(ValueError):
    """The batch can never be stored; str() says why."""


def what_to_do(exc: BaseException, then: str = "agents keep their batches and resend them") -> str:
    """For an operator reading a failed write's log line; `then`: what
    happens to what was not written."""
    text = str(exc)
    if "No space left" in text or "Disk full" in text or "disk is full" in text:
        return f"free space on the DB's file system (or move --db to another); {then}, and storing resumes by itself"
    if "Permission denied" in text or "Read-only file system" in text:
        return f"make the DB's directory writable by the analyzer's user; {then}"
    return f"see the error; {then}"


class StoreUnavailable(RuntimeError):
    """The store could not commit now; the batch should be sent again later."""


class Writer:
    def __init__(self, store: Store, after_commit: Callable[[list[DecodedBatch]], None],
                 max_group: int = MAX_GROUP, clock: Callable[[], float] = time.time,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES):
        self._store = store
        # the commit thread's own connection: group N+1 commits while group N is analysed here
        self._sink = store.sibling()
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="db-commit")
        self._reopen: Exception | None = None     # a commit's error that needs the store opened again
        self._after_commit = after_commit
        self._max_group = max_group
        self._clock = clock
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.budget = ByteBudget(queue_bytes)
        self._seqs: dict[tuple[str, str], SeqSet] = store.committed_seqs()
        self._devices_written: dict[tuple[str, int], tuple] = {}
        self._writes: list[tuple[Callable[[Store], None], Callable[[Exception | None], None] | None]] = []
        # runs after deferred writes were stored outside a group (idle, a task): the analyzer
        # publishes the findings rows they stored, which would otherwise wait for its next analysis
        self.after_flush: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="db-writer", daemon=True)
        self._stopping = False
        self._caught_up_at = clock()     # the latest take that left nothing queued
        self.batches = self.duplicates = self.samples = self.failed_groups = self.rejected = 0
        self.last_error = ""
        self.failing_since: float | None = None     # the first commit that failed since the last that did not
        self._commit_log, self._write_log = Throttle(30.0), Throttle(30.0)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: DecodedBatch) -> Future:
        """Queues a decoded batch; the future resolves to COMMITTED or
        DUPLICATE, or fails with BatchRejected or StoreUnavailable."""
        fut: Future = Future()
        if self._stopping:
            fut.set_exception(StoreUnavailable("the analyzer is shutting down"))
            return fut
        self._q.put((batch, fut))
        return fut

    def call(self, fn: Callable[[Store], None]) -> Future:
        """Run fn(store) on the writer thread, between groups (windows,
        findings). Its future resolves once what it deferred is stored."""
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut

    def defer(self, write: Callable[[Store], None], done: Callable[[Exception | None], None] | None = None) -> None:
        """Writer thread: `write(store)` runs later on the commit thread's
        connection, before the next group is stored or as soon as nothing
        is queued, so that the analysis never waits for DuckDB (its own
        statements took a quarter of this thread's time at 2,000 agents).
        `done(None)`, or `done(error)` after a rollback, runs back on this
        thread. Writes run in the order deferred, inside a transaction the
        writer opens (they never begin or commit one themselves)."""
        self._writes.append((write, done))

    def behind_since(self) -> float | None:
        """None when nothing waits for this thread; otherwise when it last
        took everything queued. Every batch that had arrived by then is
        committed and analysed, or is in the group being handled now; later
        ones may be waiting here, or in their agents while the byte budget
        holds the streams back. Staleness is judged at this time, so an
        analyzer that falls behind never takes its own backlog for silent
        agents (closing their windows and findings, to reopen them at once,
        is more work, and the falling behind would feed itself).
        A store that fails to commit is behind too, since its first failure:
        the agents are sending, and resend what it did not store."""
        behind = self._caught_up_at if self._stopping or not self._q.empty() else None
        # (_stopping: its queue empties because it takes nothing new, not because it caught up)
        failing = self.failing_since
        return failing if behind is None else behind if failing is None else min(behind, failing)

    def reload_seqs(self) -> None:
        """Writer thread only: the committed seqs as stored, after retention
        pruned old agent boots (the store is exact: seqs commit with samples)."""
        self._seqs = self._store.committed_seqs()

    def stop(self, timeout_s: float = 8.0) -> None:
        """Commits what is queued (bounded by the byte budget, so this is
        quick), then stops; whatever is still queued after timeout_s fails
        as StoreUnavailable so its streams can tell their agents."""
        self._stopping = True
        self._q.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        self._committer.shutdown(wait=False)
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return
            if item is not None and not item[1].done():
                item[1].set_exception(StoreUnavailable("the analyzer is shutting down"))

    def _run(self) -> None:
        """Group N+1 is stored on the commit thread while group N's live
        analysis runs here: DuckDB gives the GIL up while it appends and
        commits, so its part of each group (a sixth of the core at 2,000
        agents) no longer waits for the Python analysis, nor that for it.
        At most one group waits for analysis, so memory stays bounded by
        the byte budget plus one group. A task runs after the analysis of
        every batch queued before it, with the commit thread idle."""
        owed: list[DecodedBatch] = []      # committed; analysed while the next group commits
        while True:
            if not owed and self._writes and self._q.empty():
                self._flush_writes()       # idle: what the analysis deferred is stored now
            try:
                item = self._q.get(block=not owed)
            except queue.Empty:            # nothing more to commit now: analyse at once
                self._analyse(owed)
                owed = []
                continue
            if item is None:
                self._analyse(owed)
                self._flush_writes()
                return
            group, stopping = take_queued(self._q, item, self._max_group)
            if self._q.empty() and not self._stopping:
                self._caught_up_at = self._clock()
            if stopping:
                self._q.put(None)            # this group first, then stop
            batches = [(b, f) for b, f in group if isinstance(b, DecodedBatch)]
            tasks = [(b, f) for b, f in group if not isinstance(b, DecodedBatch)]
            writes = self._take_writes() if batches else []
            try:
                storing = self._committer.submit(self._write_and_store, writes, batches) if batches else None
            except RuntimeError:          # stop() gave up waiting and shut the commit thread down
                for _, fut in batches:
                    fut.set_exception(StoreUnavailable("the analyzer is shutting down"))
                storing = None
            self._analyse(owed)
            owed, written = storing.result() if storing is not None else ([], None)    # None: none ran
            self._recover()
            self._settle(writes, written)
            if tasks:
                self._analyse(owed)
                owed = []
                self._flush_writes()
            for fn, fut in tasks:
                try:
                    result = fn(self._store)
                    self._flush_writes()
                    fut.set_result(result)
                except Exception as exc:  # a failed task must not kill the writer
                    log.exception("writer task failed")
                    fut.set_exception(exc)

    def _analyse(self, committed: list[DecodedBatch]) -> None:
        if committed:
            try:
                self._after_commit(committed)
            except Exception:  # analysis must never lose committed data or stop ingest
                log.exception("live analysis failed")

    def _commit(self, group: list[tuple[DecodedBatch, Future]]) -> None:
        """Stores a group and analyses what committed, on the calling thread
        (a benchmark's or a test's; the writer's loop overlaps the two)."""
        committed = self._store_safely(group)
        self._recover()
        self._analyse(committed)
        writes = self._take_writes()
        self._settle(writes, self._run_writes(writes))
        self._recover()

    # -- the analysis's own writes (defer) -------------------------------------------------
    def _take_writes(self) -> list:
        writes, self._writes = self._writes, []
        return writes

    def _flush_writes(self) -> None:
        """Writer thread: stores what was deferred, on the commit thread, and waits."""
        writes = self._take_writes()
        if not writes:
            return
        try:
            errors = self._committer.submit(self._run_writes, writes).result()
        except RuntimeError:              # stop() gave up waiting and shut the commit thread down
            errors = None
        self._recover()
        self._settle(writes, errors)
        if self.after_flush is not None:
            try:
                self.after_flush()
            except Exception:  # a view of what is stored; the writer must go on
                log.exception("after_flush failed")

    def _write_and_store(self, writes: list, group: list[tuple[DecodedBatch, Future]]):
        """Commit thread: the analysis's writes, then the group."""
        errors = self._run_writes(writes)
        return self._store_safely(group), errors

    def _run_writes(self, writes: list) -> list[Exception | None]:
        """Commit thread: the writes in order, in one transaction (a commit
        each cost more than most writes); if it fails, each again in a
        transaction of its own, so that one failing write fails alone."""
        if not writes:
            return []
        try:
            self._sink.begin()
            for write, _ in writes:
                write(self._sink)
            self._sink.commit()
            return [None] * len(writes)
        except Exception as exc:  # the analysis's rows are owed again by their done()
            self._sink.rollback()
            if _fatal(exc):
                self._reopen = exc
            if len(writes) > 1 and not _fatal(exc) and not isinstance(exc, _ENVIRONMENT):
                return [self._run_writes([w])[0] for w in writes]
            said = self._write_log.hit(writes=len(writes))
            if said is not None:
                log.error("analysis write failed", writes_since_last_line=said["writes"], error=str(exc)[:500],
                          what_to_do=what_to_do(exc, "the analysis's rows are owed and written again later"))
            return [exc] * len(writes)

    def _settle(self, writes: list, errors: list[Exception | None] | None) -> None:
        """Writer thread: each write's done(); errors None: none ran (shutdown)."""
        for i, (_, done) in enumerate(writes):
            if done is None:
                continue
            try:
                done(errors[i] if errors is not None else StoreUnavailable("the analyzer is shutting down"))
            except Exception:  # the writer must outlive any bug
                log.exception("analysis write's done() failed")

    def _store_safely(self, group: list[tuple[DecodedBatch, Future]]) -> list[DecodedBatch]:
        try:
            return self._store_batches(group)
        except Exception as exc:  # the writer must outlive any bug; nothing is acked
            log.exception("commit path failed")
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(StoreUnavailable(str(exc)))
            return []

    def _store_batches(self, group: list[tuple[DecodedBatch, Future]]) -> list[DecodedBatch]:
        """Stores the batches not stored before; returns those committed."""
        fresh, dup, again = [], [], []
        first: dict[tuple[str, str, int], Future] = {}
        for b, fut in group:
            key = (b.host, b.boot_id, b.seq)
            if b.seq in self._seqs.get(key[:2], ()):
                dup.append(fut)
            elif key in first:            # resent before the first copy was answered
                again.append((first[key], fut))
            else:
                first[key] = fut
                fresh.append((b, fut))
        committed: list[DecodedBatch] = []
        if fresh:
            self._store_group(fresh, committed)
        for fut in dup:
            fut.set_result(DUPLICATE)
        self.duplicates += len(dup)
        for orig, fut in again:
            exc = orig.exception()
            if exc is None:
                self.duplicates += 1
                fut.set_result(DUPLICATE)
            else:
                fut.set_exception(exc)
        return committed

    def _store_group(self, group: list[tuple[DecodedBatch, Future]], committed: list[DecodedBatch]) -> None:
        try:
            seqs, devices, now = self._write(group)
        except Exception as exc:
            self._sink.rollback()
            if _fatal(exc):           # opened again by the writer thread, once the analysis is done with it
                self._reopen = exc
            if isinstance(exc, _ENVIRONMENT) or _fatal(exc) or not isinstance(exc, _PERMANENT) and len(group) == 1:
                self.failed_groups += 1
                self.last_error = str(exc)
                if self.failing_since is None:
                    self.failing_since = self._clock()
                said = self._commit_log.hit(groups=1, batches=len(group))
                if said is not None:      # a full disk fails every group: one line in 30 s, with the counts
                    log.error("commit failed; agents will resend", groups_since_last_line=said["groups"],
                              batches_since_last_line=said["batches"], error=self.last_error[:500],
                              what_to_do=what_to_do(exc))
                for _, fut in group:
                    fut.set_exception(StoreUnavailable(f"commit failed: {exc}"))
                return
            if len(group) == 1:
                b, fut = group[0]
                self.rejected += 1
                log.warning("batch cannot be stored", host=b.host, boot_id=b.boot_id, seq=b.seq,
                            error=f"{type(exc).__name__}: {exc}"[:500])
                fut.set_exception(BatchRejected(f"cannot be stored: {type(exc).__name__}: {exc}"[:1000]))
                return
            mid = len(group) // 2     # one bad batch fails only itself
            self._store_group(group[:mid], committed)
            self._store_group(group[mid:], committed)
            return
        self._seqs.update(seqs)
        for row in devices:
            self._devices_written[(row[0], row[1])] = (row[:-1], now)
        self.batches += len(group)
        self.samples += sum(b.count for b, _ in group)
        self.last_error, self.failing_since = "", None
        for b, fut in group:
            committed.append(b)
            fut.set_result(COMMITTED)

    def _write(self, group: list[tuple[DecodedBatch, Future]]):
        """One transaction; returns the committed-seq sets and device rows
        to remember once it has committed."""
        now = self._clock()
        seqs: dict[tuple[str, str], SeqSet] = {}
        latest: dict[tuple[str, str], DecodedBatch] = {}
        for b, _ in group:
            key = (b.host, b.boot_id)
            s = seqs.get(key)
            if s is None:
                s = seqs[key] = self._seqs.get(key, SeqSet()).copy()
            s.add(b.seq)
            if b.min_unacked_seq:
                s.close_below(b.min_unacked_seq)
            merged = s.bound()
            if merged:
                log.warning("too many missing batches for one agent boot; the oldest gaps are closed",
                            host=b.host, boot_id=b.boot_id, merged=merged)
            if key not in latest or b.seq > latest[key].seq:
                latest[key] = b
        store = self._sink
        store.begin()
        sampled = [b for b, _ in group if b.count]
        if sampled:
            store.append("samples", samples_table(sampled))
        procs = [b.processes for b, _ in group if b.processes is not None]
        if procs:
            store.append("processes", ProcessRows.table(procs))
        owners = [_owner_row(b, g) for b, _ in group for g in b.device_owned]
        owners = [r for r in owners if r is not None]
        if owners:
            store.insert_gpu_owners(owners)
        health = [h for b, _ in group for h in b.health]
        if health:
            store.insert_health(health)
        store.upsert_agents([(h, boot, s.max, now, latest[(h, boot)].dropped_samples, encode_ranges(s))
                             for (h, boot), s in seqs.items()])
        devices = self._changed_devices(group, now)
        store.upsert_devices(devices)
        store.commit()
        return seqs, devices, now

    def _recover(self) -> None:
        """After a fatal error DuckDB refuses every later statement until the
        file is opened again: done here, with the commit thread idle and the
        analysis not running (reopening closes both connections)."""
        exc, self._reopen = self._reopen, None
        if exc is None:
            return
        try:
            self._store.reopen()
            log.warning("store reopened after a fatal error", error=str(exc)[:300])
        except Exception as again:  # keep running; the next group tries again
            log.error("store could not be reopened", error=str(again)[:300])
            self._reopen = exc

    def _changed_devices(self, fresh: list[tuple[DecodedBatch, Future]], now: float) -> list[tuple]:
        """Device rows that changed, or whose last_seen is over a minute old:
        every batch repeats the devices, rewriting them each time is waste."""
        rows = {}
        for b, _ in fresh:
            for d in b.devices:
                facts = (b.host, *d)
                key = (b.host, d.gpu)
                last = self._devices_written.get(key)
                if last is None or last[0] != facts or now - last[1] > 60:
                    rows[key] = facts + (now,)
        return list(rows.values())   # remembered once the transaction commits


def _fatal(exc: Exception) -> bool:
    return isinstance(exc, duckdb.FatalException) or "invalidated" in str(exc)


def _owner_row(b: DecodedBatch, gpu: int) -> tuple | None:
    """The gpu_owners row of a GPU its source names the owner of: over the
    times of its samples in the batch (none: no row)."""
    t = b.t[b.gpu == gpu]
    if not len(t):
        return None
    o = b.owner.get(gpu, {})
    return (b.host, gpu, float(t.min()), float(t.max()), b.job.get(gpu), o.get("namespace"), o.get("pod"),
            o.get("container"), o.get("slurm_job"))
