"""Runs deep captures for the agent: never two on one process, a deadline
of the duration plus a margin, files only under the capture directory, and
a record of every attempt whatever its outcome."""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import structlog

from gpuscope.collectors.xla_profiler import ProfilerError, XlaProfilerClient

log = structlog.get_logger("gpuscope.captures")
MAX_DURATION_MS = 60_000


@dataclass(frozen=True)
class CaptureConfig:
    directory: Path
    max_bytes: int = 2 << 30           # the directory's budget
    min_free_bytes: int = 512 << 20    # leave the disk this much
    margin_s: float = 15.0
    keep_records: int = 500


@dataclass
class CaptureRecord:
    id: str
    host: str
    target: str
    pid: int | None = None
    gpus: list[int] = field(default_factory=list)
    job: str = ""
    start: float = 0.0
    end: float = 0.0
    duration_ms: int = 0
    path: str = ""
    size_bytes: int = 0
    status: str = "running"
    error: str = ""
    trigger: str = "on-call"
    kind: str = "jax"


class CaptureRunner:
    def __init__(self, config: CaptureConfig, host: str = socket.gethostname(),
                 client_factory: Callable[[str], XlaProfilerClient] = XlaProfilerClient,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self.host = host
        self._client_factory = client_factory
        self._clock = clock
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self.records: list[CaptureRecord] = []

    def _used_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.config.directory.rglob("*") if f.is_file())

    def capture(self, target: str, duration_ms: int, pid: int | None = None, gpus: list[int] | None = None,
                job: str = "", trigger: str = "on-call", kind: str = "jax",
                client=None) -> tuple[CaptureRecord, bytes]:
        """client: anything with the XlaProfilerClient.capture signature
        (the JAX profiler by default, or a serving engine's HTTP profiler)."""
        if not 0 < duration_ms <= MAX_DURATION_MS:
            raise ValueError(f"duration_ms must be 1 to {MAX_DURATION_MS}, got {duration_ms}")
        rec = CaptureRecord(id=uuid.uuid4().hex[:12], host=self.host, target=target, pid=pid, gpus=list(gpus or []),
                            job=job, start=self._clock(), duration_ms=duration_ms, trigger=trigger, kind=kind)
        key = f"pid:{pid}" if pid is not None else target
        with self._lock:
            busy = key in self._running
            if not busy:
                self._running.add(key)
        data = b""
        try:
            if busy:
                return self._finish(rec, "busy", "a capture of this process is already running"), data
            self.config.directory.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.config.directory).free
            if self._used_bytes() >= self.config.max_bytes or free < self.config.min_free_bytes:
                return self._finish(rec, "disk-full", f"capture directory {self.config.directory} is full "
                                    f"(budget {self.config.max_bytes >> 20} MiB, {free >> 20} MiB free on disk)"), data
            root = self.config.directory / rec.id
            root.mkdir()
            root.chmod(0o777)      # the job, maybe another user, writes its XSpace here
            try:
                result = (client or self._client_factory(target)).capture(duration_ms, root, rec.id, self.host,
                                                                          margin_s=self.config.margin_s)
            except ProfilerError as exc:
                shutil.rmtree(root, ignore_errors=True)
                return self._finish(rec, exc.reason, str(exc)), data
            data = result.xspace
            if result.path is not None and root in result.path.parents:
                path = result.path
            else:   # returned in the response, or written into the job's own directory: keep our copy
                name = result.path.name if result.path is not None else f"{self.host}.xplane.pb"
                path = root / name
                path.write_bytes(data)
            rec.path, rec.size_bytes = str(path), len(data)
            (root / "capture.json").write_text(json.dumps(asdict(rec) | {"status": "ok"}))
            return self._finish(rec, "ok" if not result.empty else "ok-empty", ""), data
        except OSError as exc:
            return self._finish(rec, "failed", f"{type(exc).__name__}: {exc}"), b""
        finally:
            if not busy:
                with self._lock:
                    self._running.discard(key)

    def _finish(self, rec: CaptureRecord, status: str, error: str) -> CaptureRecord:
        rec.status, rec.error, rec.end = status, error, self._clock()
        with self._lock:
            self.records.append(rec)
            del self.records[: -self.config.keep_records]
        log.info("capture finished", id=rec.id, target=rec.target, pid=rec.pid, status=status, error=error,
                 size=rec.size_bytes)
        return rec

    def record(self, rec: CaptureRecord, status: str, error: str = "") -> CaptureRecord:
        """Record an attempt that is not a trace (a counter burst)."""
        return self._finish(rec, status, error)
