"""The single writer: group commit of decoded batches into the store.

Ingest threads decode in parallel and hand batches here; one thread drains
whatever is queued, dedupes by (host, boot_id, seq), appends everything in one
transaction, and only then resolves each batch's future. A batch is
acknowledged only after it is durable; a failed transaction fails every batch
in it, and the agents resend them.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

import pyarrow as pa
import structlog

from .ingest import DecodedBatch
from .store import Store

COMMITTED, DUPLICATE = "committed", "duplicate"
log = structlog.get_logger("gpuscope.writer")


class Writer:
    def __init__(self, store: Store, after_commit: Callable[[list[DecodedBatch]], None],
                 max_group: int = 256, clock: Callable[[], float] = time.time):
        self._store = store
        self._after_commit = after_commit
        self._max_group = max_group
        self._clock = clock
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._hw = store.high_water_marks()
        self._devices_written: dict[tuple[str, int], tuple] = {}
        self._thread = threading.Thread(target=self._run, name="db-writer", daemon=True)
        self.batches = self.duplicates = self.samples = self.failed_groups = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: DecodedBatch) -> Future:
        fut: Future = Future()
        self._q.put((batch, fut))
        return fut

    def call(self, fn: Callable[[Store], None]) -> Future:
        """Run fn(store) on the writer thread, between groups (windows, findings)."""
        fut: Future = Future()
        self._q.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            group = [item]
            while len(group) < self._max_group:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                group.append(nxt)
            batches = [(b, f) for b, f in group if isinstance(b, DecodedBatch)]
            tasks = [(b, f) for b, f in group if not isinstance(b, DecodedBatch)]
            if batches:
                self._commit(batches)
            for fn, fut in tasks:
                try:
                    fut.set_result(fn(self._store))
                except Exception as exc:  # a failed task must not kill the writer
                    log.exception("writer task failed")
                    fut.set_exception(exc)

    def _commit(self, group: list[tuple[DecodedBatch, Future]]) -> None:
        fresh, dup = [], []
        marks = dict(self._hw)
        for b, fut in group:
            key = (b.host, b.boot_id)
            if b.seq <= marks.get(key, 0):
                dup.append(fut)
            else:
                marks[key] = b.seq
                fresh.append((b, fut))
        now = self._clock()
        store = self._store
        try:
            if fresh:
                store.begin()
                tables = [b.samples for b, _ in fresh if b.count]
                if tables:
                    store.append("samples", pa.concat_tables(tables, promote_options="default")
                                 if len(tables) > 1 else tables[0])
                procs = [b.processes for b, _ in fresh if b.processes is not None]
                if procs:
                    store.append("processes", pa.concat_tables(procs))
                health = [h for b, _ in fresh for h in b.health]
                if health:
                    store.insert_health(health)
                agents = {(b.host, b.boot_id): (b.host, b.boot_id, marks[(b.host, b.boot_id)], now, b.dropped_samples)
                          for b, _ in fresh}
                store.upsert_agents(list(agents.values()))
                devices = self._changed_devices(fresh, now)
                store.upsert_devices(devices)
                store.commit()
        except Exception as exc:  # disk full, file gone: fail the group, keep running
            store.rollback()
            self.failed_groups += 1
            log.exception("commit failed; agents will resend", batches=len(fresh))
            for _, fut in fresh:
                fut.set_exception(exc)
            for fut in dup:
                fut.set_result(DUPLICATE)
            return
        self._hw = marks
        for row in (devices if fresh else ()):
            self._devices_written[(row[0], row[1])] = (row[:-1], now)
        self.batches += len(fresh)
        self.duplicates += len(dup)
        self.samples += sum(b.count for b, _ in fresh)
        for _, fut in fresh:
            fut.set_result(COMMITTED)
        for fut in dup:
            fut.set_result(DUPLICATE)
        if fresh:
            try:
                self._after_commit([b for b, _ in fresh])
            except Exception:  # analysis must never lose committed data or stop ingest
                log.exception("live analysis failed")


    def _changed_devices(self, fresh: list[tuple[DecodedBatch, Future]], now: float) -> list[tuple]:
        """Device rows that changed, or whose last_seen is over a minute old:
        every batch repeats the devices, rewriting them each time is waste."""
        rows = {}
        for b, _ in fresh:
            for d in b.devices:
                opt = lambda f: getattr(d, f) if d.HasField(f) else None  # noqa: E731
                facts = (b.host, d.gpu, d.uuid, d.name, d.architecture, opt("memory_total_bytes"),
                         opt("power_limit_watts"), opt("pcie_generation"), opt("pcie_width"), d.gpm_supported, d.lost)
                key = (b.host, d.gpu)
                last = self._devices_written.get(key)
                if last is None or last[0] != facts or now - last[1] > 60:
                    rows[key] = facts + (now,)
        return list(rows.values())   # remembered once the transaction commits
