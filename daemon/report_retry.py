"""Capture reports the analyzer did not store, sent again later.

A capture's report is sent at once and again after 5, 10 and 20 s
(clients.report_capture). An analyzer away longer than that (restarting,
its disk full) would lose the capture's summary and verdict, though its
trace is on the agent's disk (found in a trial). So a report still not
stored is kept here, its trace in memory up to a bound, and sent again
every `every_s` for up to `keep_s`; the oldest go first when the bound is
reached, and each report dropped is logged with its id.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import structlog

log = structlog.get_logger("gpuscope.agent")

RETRY_EVERY_S = 30.0
KEEP_S = 3600.0
MAX_HELD_BYTES = 256 << 20      # the largest trace the analyzer takes (capture_upload.MAX_TRACE_BYTES)


class ReportRetry:
    def __init__(self, send: Callable, stop: threading.Event, every_s: float = RETRY_EVERY_S,
                 keep_s: float = KEEP_S, max_bytes: int = MAX_HELD_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self._stop, self._every, self._keep, self._max = send, stop, every_s, keep_s, max_bytes
        self._clock = clock
        self._held: collections.deque = collections.deque()      # (record, trace, its error as captured, since)
        self._bytes = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def pending(self) -> int:
        return len(self._held)

    def add(self, rec, data: bytes, error: str) -> None:
        """`rec` was not reported; `error` is its own error, without why it was not."""
        with self._lock:
            self._held.append((rec, data, error, self._clock()))
            self._bytes += len(data)
            while self._bytes > self._max and len(self._held) > 1:
                self._drop(self._held.popleft(), f"more than {self._max >> 20} MiB of traces wait to be reported")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="capture-report-retry", daemon=True)
                self._thread.start()

    def _drop(self, item, why: str) -> None:
        self._bytes -= len(item[1])
        self.dropped += 1
        log.warning("capture report given up", id=item[0].id, why=why,
                    trace_path=item[0].path or None)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.retry()

    def retry(self) -> None:
        """Sends what is held, oldest first, until one is refused again."""
        while True:
            with self._lock:
                if not self._held:
                    return
                item = self._held[0]
            rec, data, error, since = item
            reported = rec.error
            rec.error = error               # the analyzer stores the record as captured
            try:
                self._send(rec, data)
            except Exception as exc:  # still away: the next round tries again
                rec.error = reported
                if self._clock() - since > self._keep:
                    with self._lock:
                        self._held.popleft()
                        self._drop(item, f"not stored for {self._keep / 60:.0f} min: {exc}"[:300])
                    continue
                return
            with self._lock:
                self._held.popleft()
                self._bytes -= len(data)
            log.info("capture reported after all", id=rec.id, waited_s=round(self._clock() - since))
