"""Runs deep captures for the agent: never two on one process, a deadline
of the duration plus a margin, files only under the capture directory, and
a record of every attempt whatever its outcome.

Files: the capture directory is 0700 and must be the agent's own (see
safe_files: a symbolic link, another user's directory or one that group or
others may write is refused, at start-up when it exists, else when the
first capture creates it). Each capture gets a new 0700 directory made
under the root's descriptor; every file the agent writes there is created
new, 0600, through that directory's descriptor, never through a link. A
trace the job or the engine wrote is read the same way: below the
directory it must be in (ours, or the engine's trace directory), no link
followed, a regular file, at most `max_trace_bytes`. Anything else is
recorded as a failed capture saying what was refused, and nothing is
written. Consequence: a JAX job that writes its XSpace to disk must run as
the agent's user (servers that return it in the response need nothing).

A serving engine's session writes several files (the worker's trace, the
API server's, key-averages tables). One that cannot be kept is named in the
capture's result (`skipped_files` in capture.json, and its error) and the
others are kept: a worker's trace over `max_trace_bytes`, which could not
travel to the analyzer, leaves a `partial` capture of the session's other
files rather than none.
"""
from __future__ import annotations

import inspect
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import structlog

from gpuscope.collectors.xla_profiler import ProfilerError, XlaProfilerClient

from . import safe_files

log = structlog.get_logger("gpuscope.captures")
MAX_DURATION_MS = 60_000
MAX_LEAD_S = 60.0            # a coordinated capture starts at most this long after its command arrives


@dataclass(frozen=True)
class CaptureConfig:
    directory: Path
    max_bytes: int = 2 << 30           # the directory's budget
    min_free_bytes: int = 512 << 20    # leave the disk this much
    margin_s: float = 15.0
    keep_records: int = 500
    max_trace_bytes: int = 256 << 20   # one trace: to the analyzer in chunks, to `capture` in one reply (serve.MAX_MESSAGE_BYTES)


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


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def _process_owner(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(uid, gid) a process runs as, or None when it is gone."""
    try:
        st = os.stat(f"{proc}/{int(pid)}")
    except OSError:
        return None
    return st.st_uid, st.st_gid


def _skipped(name: str, exc: OSError) -> dict:
    """A session file not kept: its name, its size when that is why (None
    when unknown), and the reason."""
    return dict(name=name, size_bytes=exc.size if isinstance(exc, safe_files.TooLarge) else None, reason=str(exc))


def _outcome(result, path: Path | None, kept: list[str], skipped: list[dict], root: Path) -> tuple[str, str]:
    """Status and error of a capture whose files were kept."""
    if path is None:
        return "partial", (f"{skipped[0]['reason']}: not kept nor sent; the session's other files are kept in "
                           f"{root}: {', '.join(kept)}")
    return "ok" if not result.empty else "ok-empty", "; ".join(f"not kept: {f['reason']}" for f in skipped)


class ProfilingPause(Protocol):
    """A source that holds the GPUs' performance counters (DCGM's profiling)
    and lets go of them while a capture's profiler needs them. Never raises."""
    def pause_profiling(self) -> None: ...
    def resume_profiling(self) -> None: ...


class CaptureRunner:
    def __init__(self, config: CaptureConfig, host: str = socket.gethostname(),
                 client_factory: Callable[[str], XlaProfilerClient] = XlaProfilerClient,
                 clock: Callable[[], float] = time.time, new_id: Callable[[], str] = _new_id,
                 job_owner: Callable[[int], tuple[int, int] | None] | None = None,
                 profiling: ProfilingPause | None = None):
        """Raises ValueError when the capture directory exists and is not
        safe to write in (fail fast); a missing one is made by the first capture.
        `profiling`: paused for the length of each capture's profiler session."""
        self.config = config
        self._profiling = profiling
        self.host = host
        self._client_factory = client_factory
        self._clock = clock
        self._new_id = new_id
        self._job_owner = job_owner or _process_owner
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self.records: list[CaptureRecord] = []
        try:
            if os.path.lexists(config.directory):
                os.close(safe_files.open_root(config.directory, create=False))
            else:                        # made at the first capture: a link on its way is refused now
                safe_files.walk(Path(config.directory), create=False)
        except OSError as exc:
            raise ValueError(f"capture directory: {exc}") from None

    def capture(self, target: str, duration_ms: int, pid: int | None = None, gpus: list[int] | None = None,
                job: str = "", trigger: str = "on-call", kind: str = "jax",
                client=None, on_late: Callable[[CaptureRecord, bytes], None] | None = None,
                start_at: float | None = None) -> tuple[CaptureRecord, bytes]:
        """client: anything with the XlaProfilerClient.capture signature
        (the JAX profiler by default, or a serving engine's HTTP profiler).
        A result with a `path` outside the per-capture directory must carry
        `source_root`, the directory that path is confined to; the runner
        reads it from there and keeps a copy. A capture that answers `slow`
        while its engine still writes the trace is completed when the trace
        lands: the same record becomes `ok` and goes to `on_late`. `start_at`:
        when the trace starts, on this host's clock (a coordinated capture of
        a job's ranks); the JAX profiler waits for it itself, others are
        started then."""
        if not 0 < duration_ms <= MAX_DURATION_MS:
            raise ValueError(f"duration_ms must be 1 to {MAX_DURATION_MS}, got {duration_ms}")
        rec = CaptureRecord(id=self._new_id(), host=self.host, target=target, pid=pid, gpus=list(gpus or []),
                            job=job, start=self._clock(), duration_ms=duration_ms, trigger=trigger, kind=kind)
        key = f"pid:{pid}" if pid is not None else target
        with self._lock:
            busy = key in self._running
            if not busy:
                self._running.add(key)
        root_fd = cap_fd = None
        try:
            if busy:
                return self._finish(rec, "busy", "a capture of this process is already running"), b""
            root_fd = safe_files.open_root(self.config.directory)
            free = safe_files.free_bytes(root_fd)
            if safe_files.used_bytes(root_fd) >= self.config.max_bytes or free < self.config.min_free_bytes:
                return self._finish(rec, "disk-full", f"capture directory {self.config.directory} is full "
                                    f"(budget {self.config.max_bytes >> 20} MiB, {free >> 20} MiB free on disk)"), b""
            where = str(self.config.directory)
            cap_fd = safe_files.make_private_dir(root_fd, rec.id, where)
            owner = self._job_owner(pid) if pid is not None and os.geteuid() == 0 else None
            if owner is not None and owner[0] != 0:
                # JAX writes the trace itself, as the job's user: an agent running
                # as root hands that user this capture's directory
                safe_files.hand_to(root_fd, cap_fd, *owner)
            root = self.config.directory / rec.id
            try:
                result = self._profiled(client or self._client_factory(target), duration_ms, root, rec.id, start_at)
                path, data, kept, skipped = self._keep_session(result, root, cap_fd)
                status, error = _outcome(result, path, kept, skipped, root)
                rec.path, rec.size_bytes = (str(path), len(data)) if path is not None else ("", 0)
                rec.end = self._clock()
                safe_files.write_new(cap_fd, "capture.json", json.dumps(
                    asdict(rec) | {"status": status, "error": error, "other_files": kept,
                                   "skipped_files": skipped}).encode(), str(root))
            except (ProfilerError, OSError) as exc:      # a failed capture leaves no files
                os.close(cap_fd)
                cap_fd = None
                safe_files.remove_tree(root_fd, rec.id)
                rec.path, rec.size_bytes = "", 0
                if isinstance(exc, ProfilerError):
                    done = self._finish(rec, exc.reason, str(exc))
                    late = getattr(exc, "late", None)
                    if late is not None:
                        threading.Thread(target=self._complete_late, args=(rec, late, on_late),
                                         name="capture-late", daemon=True).start()
                    return done, b""
                raise
            return self._finish(rec, status, error), data
        except OSError as exc:
            return self._finish(rec, "failed", f"{type(exc).__name__}: {exc}"), b""
        finally:
            for fd in (cap_fd, root_fd):
                if fd is not None:
                    os.close(fd)
            if not busy:
                with self._lock:
                    self._running.discard(key)

    def _profiled(self, client, duration_ms: int, root: Path, capture_id: str, start_at: float | None = None):
        """The profiler's session, with the counters let go by whoever holds them (DCGM) until it ends."""
        timed = start_at is not None and "start_unix_s" in inspect.signature(client.capture).parameters
        if start_at is not None and not timed:
            time.sleep(max(0.0, min(start_at - time.time(), MAX_LEAD_S)))
        if self._profiling is not None:
            self._profiling.pause_profiling()
        try:
            if timed:
                return client.capture(duration_ms, root, capture_id, self.host, margin_s=self.config.margin_s,
                                      start_unix_s=start_at)
            return client.capture(duration_ms, root, capture_id, self.host, margin_s=self.config.margin_s)
        finally:
            if self._profiling is not None:
                self._profiling.resume_profiling()

    def _complete_late(self, rec: CaptureRecord, late, on_late) -> None:
        """A `slow` capture's trace, taken when the engine has written it:
        kept as an on-time one would have been, the record updated, and
        passed to `on_late` (the agent reports it to the analyzer)."""
        answered = rec.end
        try:
            result = late.wait()
        except ProfilerError as exc:
            log.warning("capture: the late trace never came", id=rec.id, error=str(exc))
            return
        root_fd = cap_fd = None
        try:
            root_fd = safe_files.open_root(self.config.directory)
            root = self.config.directory / rec.id
            cap_fd = safe_files.make_private_dir(root_fd, rec.id, str(self.config.directory))
            path, data, kept, skipped = self._keep_session(result, root, cap_fd)
            status, error = _outcome(result, path, kept, skipped, root)
            rec.path, rec.size_bytes = (str(path), len(data)) if path is not None else ("", 0)
            rec.status, rec.end = status, self._clock()
            rec.error = "; ".join(e for e in (f"taken {rec.end - answered:.0f} s after the capture answered slow, "
                                               f"once the engine had written it", error) if e)
            safe_files.write_new(cap_fd, "capture.json", json.dumps(
                asdict(rec) | {"other_files": kept, "skipped_files": skipped}).encode(), str(root))
        except (OSError, ProfilerError) as exc:
            log.warning("capture: the late trace could not be kept", id=rec.id, error=str(exc))
            return
        finally:
            for fd in (cap_fd, root_fd):
                if fd is not None:
                    os.close(fd)
        log.info("capture completed late", id=rec.id, status=rec.status, size=rec.size_bytes)
        if on_late is not None:
            on_late(rec, data)

    def _keep_session(self, result, root: Path, cap_fd: int) -> tuple[Path | None, bytes, list[str], list[dict]]:
        """The trace (None and no bytes when it is over max_trace_bytes but
        the session has other files), the names of the session's other files
        kept, and the files skipped. Raises when nothing could be kept."""
        try:
            path, data = self._keep(result, root, cap_fd)
        except safe_files.TooLarge as exc:
            kept, skipped = self._keep_extras(result, root, cap_fd)
            if not kept:
                raise                           # nothing of the session to keep: a failed capture
            return None, b"", kept, [_skipped(Path(result.path).name, exc), *skipped]
        return (path, data, *self._keep_extras(result, root, cap_fd))

    def _keep(self, result, root: Path, cap_fd: int) -> tuple[Path, bytes]:
        """The trace's bytes and where it is kept under `root`: read back
        safely when the job wrote it there, copied from the engine's trace
        directory, or written from the response."""
        limit = self.config.max_trace_bytes
        if result.path is None:                  # returned in the response
            if len(result.xspace) > limit:
                raise safe_files.TooLarge(f"the trace is {len(result.xspace) >> 20} MiB, more than the "
                                          f"{limit >> 20} MiB a capture may be", len(result.xspace))
            name = f"{self.host}.xplane.pb"
            safe_files.write_new(cap_fd, name, result.xspace, str(root))
            return root / name, result.xspace
        path = Path(result.path)
        if root in path.parents:                 # the job wrote it into our directory
            return path, safe_files.read_beneath(cap_fd, path.relative_to(root), limit, str(root),
                                                 make_private=True)
        source_root = getattr(result, "source_root", None)
        if source_root is None or Path(source_root) not in path.parents:
            raise safe_files.UnsafePath(f"the profiler reported its trace at {path}, outside {root} and any "
                                        f"directory it is confined to; not read")
        data = self._read_confined(path, source_root)
        safe_files.write_new(cap_fd, path.name, data, str(root))
        return root / path.name, data

    def _read_confined(self, path: Path, source_root) -> bytes:
        """A file below the engine's configured trace directory, read without following links."""
        if source_root is None or Path(source_root) not in path.parents:
            raise safe_files.UnsafePath(f"{path} is outside the directory it is confined to; not read")
        src_fd = os.open(source_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)   # the configured trace dir
        try:
            return safe_files.read_beneath(src_fd, path.relative_to(source_root), self.config.max_trace_bytes,
                                           str(source_root))
        finally:
            os.close(src_fd)

    def _keep_extras(self, result, root: Path, cap_fd: int) -> tuple[list[str], list[dict]]:
        """The session's other files (a serving engine's API-server trace, its
        tables), copied beside the trace the same safe way: (names kept, the
        ones skipped and why). One that cannot be read is skipped, not fatal:
        the main trace is what was asked for."""
        kept, skipped = [], []
        for extra in getattr(result, "extra_paths", None) or []:
            try:
                data = self._read_confined(Path(extra), result.source_root)
                safe_files.write_new(cap_fd, Path(extra).name, data, str(root))
                kept.append(Path(extra).name)
            except OSError as exc:                 # safe_files.UnsafePath and TooLarge among them
                log.warning("capture: a session file was not kept", path=str(extra), error=str(exc))
                skipped.append(_skipped(Path(extra).name, exc))
        return kept, skipped

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
