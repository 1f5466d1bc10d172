"""Torch-profiler captures of serving engines over HTTP: vLLM and SGLang
expose `POST /start_profile` and `POST /stop_profile` (vLLM only when started
with a profiler configuration; SGLang always). The engine writes
`*.pt.trace.json.gz` into its own profiler directory on this host; we name
the newest and the capture runner copies it into our capture directory.

This module reads no trace bytes but to check a file is complete: it returns
the path and the directory the path is confined to
(`ServingTrace.source_root`), and the runner reads it below that directory
without following links. Looking for traces does not follow links either: a
link in the trace directory (to a file or to a directory) is not a trace.

Measured on vLLM 0.32: start answers 200 in ~10 ms, 409 while a session runs,
404 without --profiler-config, and blocks while a previous stop is still
writing; stop answers only after the traces are written and post-processed:
6-19 s for a sub-second session on an idle server, 86 s to 211 s on a
2-core machine under load. Hence the rules here:

- **Never leave a session running.** Once `/start_profile` was sent, every
  way out (an error, a timeout, the agent stopping) either ends with a stop
  that answered or hands the stop to `PendingStops`, which retries it until
  the engine says no session runs. A start that times out may still start
  later (vLLM starts once the previous stop finishes): it gets a stop too.
- **The trace is taken when it is complete on disk** (its size unchanged
  between two looks a second apart and, for gzip, a stream that ends), even
  while the stop's HTTP answer is still pending.
- **Stop waits are sized** from the capture's duration and the engine's
  last measured stop time, at least `stop_timeout_s`.
- **Words that say what happened**: `busy` (409), `slow` (the engine's
  `/health` answers but the stop did not finish in time; the stop stays
  pending), `unreachable` only when nothing answers.
"""
from __future__ import annotations

import os
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

import structlog

from .xla_profiler import CaptureResult, NotAProfiler, ProfilerBusy, ProfilerError, ProfilerUnreachable

log = structlog.get_logger("gpuscope.serving")

TRACE_PATTERNS = ("*.pt.trace.json.gz", "*.trace.json.gz", "*.trace.json", "*.xplane.pb")
TABLE_PATTERNS = ("*profiler_out*.txt",)      # vLLM's key-averages table, kept with the traces


@dataclass
class ServingTrace(CaptureResult):
    """A trace the engine wrote on this host: `xspace` is empty; the runner
    reads `path`, which lies below `source_root`, and keeps a copy, with the
    session's other files (`extra_paths`: the API server's trace, the tables)."""
    source_root: Path
    extra_paths: list[Path] = field(default_factory=list)


class ProfilerSlow(ProfilerError):
    """The engine is alive but did not finish in time; its stop stays pending."""
    reason = "slow"


class _Timeout(Exception):
    pass


def post(base_url: str, path: str, timeout: float) -> int:
    """POST with an empty JSON body; the status, or _Timeout, or
    ProfilerUnreachable when nothing answers."""
    req = urllib.request.Request(base_url + path, data=b"", method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (TimeoutError, socket.timeout):
        raise _Timeout() from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise _Timeout() from None
        raise ProfilerUnreachable(f"{base_url}: {exc.reason}; the server may have exited") from None
    except (ConnectionError, OSError) as exc:
        raise ProfilerUnreachable(f"{base_url}: {exc}; the server may have exited") from None


def healthy(base_url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500          # alive, whatever it thinks of the route
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


class PendingStops:
    """Stops that must still reach an engine, each followed in its own thread
    until the engine answers that no session runs (200 to the stop, or
    400/404: none running). The follow-up ends too when the engine is gone
    (connection refused: its session died with it, and a restarted engine's
    new session is not ours to stop), or after `give_up_s`."""

    def __init__(self, retry_s: float = 5.0, give_up_s: float = 3600.0, stop_timeout_s: float = 600.0):
        self.retry_s, self.give_up_s, self.stop_timeout_s = retry_s, give_up_s, stop_timeout_s
        self._lock = threading.Lock()
        self._followers: list[tuple[str, threading.Thread]] = []
        self._starting: dict[int, tuple[str, "_Request"]] = {}   # starts sent, not yet answered
        self._active: dict[str, int] = {}                # engines with a session we started, not yet stopped
        self.done: list[tuple[str, int | None]] = []     # (url, last status) of stops that finished

    def starting(self, base_url: str, start: "_Request") -> None:
        with self._lock:
            self._starting[id(start)] = (base_url, start)

    def started(self, base_url: str, start: "_Request | None" = None) -> None:
        with self._lock:
            if start is not None:
                self._starting.pop(id(start), None)
            self._active[base_url] = self._active.get(base_url, 0) + 1

    def stopped(self, base_url: str) -> None:
        with self._lock:
            n = self._active.get(base_url, 0) - 1
            if n > 0:
                self._active[base_url] = n
            else:
                self._active.pop(base_url, None)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """The agent is stopping. Starts still in flight are given what is left
        of `timeout_s` to answer (a stop sent before a blocked start takes
        effect would end nothing); then every engine with a session of ours,
        or a stop still being followed, is sent a stop. vLLM stops once the
        request is in, so an answer is not awaited beyond a few seconds."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            starting = list(self._starting.values())
        for _, start in starting:
            start.join(max(0.0, deadline - time.monotonic() - 3.0))
        with self._lock:
            urls = set(self._active) | {u for u, th in self._followers if th.is_alive()}
            urls |= {u for u, start in starting if start.is_alive() or _may_have_started(start)}
        left_running = []
        for url in sorted(urls):
            try:
                status = post(url, "/stop_profile", max(0.5, min(deadline - time.monotonic(), 3.0)))
            except _Timeout:
                continue                          # sent: the engine is stopping
            except ProfilerError:
                continue                          # gone: nothing of ours runs there
            if status not in (200, 400, 404):
                left_running.append(f"{url} (stop answered {status})")
        still = [u for u, start in starting if start.is_alive()]
        if still or left_running:
            log.error("profiling sessions this agent started may still run after it exits",
                      engines=sorted(set(still) | set(left_running)),
                      what_to_do="POST /stop_profile to each engine once it answers")

    def add(self, base_url: str, in_flight: "_Request | None" = None) -> None:
        """Stop `base_url`'s session later. `in_flight`: the start or stop
        request still running: a start that ends up refused leaves nothing
        to stop; a stop that ends up answering 200 is all it takes."""
        th = threading.Thread(target=self._run, args=(base_url, in_flight), name="pending-stop", daemon=True)
        with self._lock:
            self._followers = [(u, t) for u, t in self._followers if t.is_alive()] + [(base_url, th)]
        if in_flight is not None and in_flight.path == "/stop_profile":
            # the usual case: the trace is taken, the engine still post-processes before it answers
            log.info("waiting for the engine's stop to answer", engine=base_url)
        else:
            log.warning("profiling session left to stop; following it", engine=base_url)
        th.start()

    def pending(self) -> list[str]:
        with self._lock:
            return sorted({u for u, th in self._followers if th.is_alive()})

    def wait(self, timeout: float) -> bool:
        """True when no stop is pending (for shutdown and tests)."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.pending()

    def _run(self, base_url: str, in_flight: "_Request | None") -> None:
        if in_flight is not None:
            in_flight.join()
            if in_flight.path == "/start_profile":
                with self._lock:
                    self._starting.pop(id(in_flight), None)
                if not _may_have_started(in_flight):
                    self.done.append((base_url, in_flight.status))
                    return                         # refused: nothing started
            elif in_flight.status == 200:
                _STOP_SECONDS[base_url] = in_flight.seconds
                self.done.append((base_url, 200))
                return
        deadline = time.monotonic() + self.give_up_s
        status = None
        while time.monotonic() < deadline:
            try:
                status = post(base_url, "/stop_profile", self.stop_timeout_s)
            except _Timeout:
                status = None                  # still writing: ask again
            except ProfilerUnreachable:
                log.info("engine gone; its profiling session went with it", engine=base_url)
                self.done.append((base_url, None))
                return
            if status in (200, 400, 404):      # stopped, or nothing running
                log.info("pending profiling stop done", engine=base_url, status=status)
                self.done.append((base_url, status))
                return
            time.sleep(self.retry_s)
        log.error("gave up stopping a profiling session", engine=base_url, last_status=status)
        self.done.append((base_url, status))


class LateTrace:
    """The trace of a capture that answered `slow` while the engine was still
    writing it: `wait()` takes it once the stop answers (or every file of
    the session is whole on disk), as the capture would have."""

    def __init__(self, profiler: "TorchProfilerHttp", stopper: "_Request", before: dict):
        self.profiler, self.stopper, self.before = profiler, stopper, before

    def wait(self, timeout_s: float | None = None) -> "ServingTrace":
        """Raises ProfilerError when the session's trace never comes."""
        p, t0 = self.profiler, time.time()
        p.budget_s = None                  # nobody waits on this answer any more
        path, extras = p._await_trace(self.stopper, self.before, timeout_s or STOP_WAIT_S, t0)
        return ServingTrace(b"", path, False, time.time() - t0, source_root=p.trace_dir, extra_paths=extras)


def _may_have_started(start: "_Request") -> bool:
    """A start that answered 200, or whose answer says nothing (no answer in
    time, a 5xx from the engine or a proxy in front of it): only a clear
    refusal (404, 409, other 4xx) or a refused connection means no session."""
    if start.error is not None:
        return False                          # never reached the engine
    return start.status is None or start.status == 200 or start.status >= 500


PENDING_STOPS = PendingStops()
# measured on vLLM 0.32, 2 cores under load: 185-211 s of stop for 2 s of capture
STOP_S_PER_CAPTURE_S = 100.0
START_WAIT_S = 600.0       # a start blocked behind a previous stop is waited for this long, in the background
STOP_WAIT_S = 900.0        # a stop is waited for this long, in the background, before it is sent again
_STOP_SECONDS: dict[str, float] = {}       # engine -> its last measured stop time


def expected_seconds(duration_ms: int, stop_timeout_s: float = 60.0, start_timeout_s: float = 10.0,
                     margin_s: float = 15.0) -> float:
    """How long a serving capture may take before it answers: what a caller
    should give it (the CLI's deadline)."""
    return start_timeout_s + duration_ms / 1e3 + stop_floor(duration_ms, stop_timeout_s) + margin_s


def stop_floor(duration_ms: int, stop_timeout_s: float, s_per_capture_s: float = STOP_S_PER_CAPTURE_S) -> float:
    """What a stop may take before anything is known of this engine: the
    configured floor, or the duration scaled by what stops cost."""
    return max(stop_timeout_s, duration_ms / 1e3 * s_per_capture_s)


class TorchProfilerHttp:
    def __init__(self, base_url: str, trace_dir: str | Path, stop_timeout_s: float = 60.0,
                 start_timeout_s: float = 10.0, pending: PendingStops | None = None, poll_s: float = 1.0,
                 stop_s_per_capture_s: float = STOP_S_PER_CAPTURE_S, budget_s: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.trace_dir = Path(trace_dir)
        self.stop_timeout_s = stop_timeout_s
        self.start_timeout_s = start_timeout_s
        self.pending = pending or PENDING_STOPS
        self.poll_s = poll_s
        self.stop_s_per_capture_s = stop_s_per_capture_s
        self.budget_s = budget_s          # the caller's time: the capture answers within it

    def stop_deadline(self, duration_ms: int) -> float:
        """Seconds to wait for a stop: the configured floor, the duration
        scaled by what stops cost, and 1.5x this engine's last stop."""
        return max(stop_floor(duration_ms, self.stop_timeout_s, self.stop_s_per_capture_s),
                   1.5 * _STOP_SECONDS.get(self.base_url, 0.0))

    def capture(self, duration_ms: int, repository_root: Path, session_id: str, host_name: str = "gpuscope",
                margin_s: float = 15.0) -> CaptureResult:
        t0 = time.time()
        if not self.trace_dir.is_dir() and not self.trace_dir.parent.is_dir():
            # the engine makes its directory when it first writes (torch's trace handler does), but not
            # its parent: a path with neither is a typo, or one this host does not see
            raise ProfilerError(f"{self.base_url}: neither its trace directory {self.trace_dir} nor the directory "
                                f"above it exists on this host; nothing was started (--serving URL=DIR names the "
                                f"directory the engine writes its traces to, e.g. vLLM's torch_profiler_dir, as "
                                f"this host sees it)")
        if self.budget_s is not None and self.budget_s < duration_ms / 1e3 + 2:
            raise ProfilerError(f"the caller allows {self.budget_s:.0f} s, less than the {duration_ms / 1e3:g} s "
                                f"capture itself; nothing was started (give a longer timeout)")
        if self.base_url in self.pending.pending():
            # vLLM would hold a start until that stop's trace is written (minutes on a small
            # host), and a capture that waits that long reads as a dead server
            raise ProfilerBusy(f"{self.base_url}: an earlier capture's /stop_profile has not answered yet (vLLM "
                               f"answers it once it has written and post-processed the trace, which that capture "
                               f"may already hold); a start now would wait for it, so none was sent. Try again "
                               f"when it has answered (seconds to minutes; the agent logs 'pending profiling stop "
                               f"done')")
        start = _Request(self.base_url, "/start_profile", START_WAIT_S)
        self.pending.starting(self.base_url, start)
        start.start()
        start.join(self._within(self.start_timeout_s, t0))
        if start.is_alive():
            # vLLM blocks a start while a previous stop writes, then starts: stop it then
            self.pending.add(self.base_url, in_flight=start)
            raise self._late(f"/start_profile did not answer within {self.start_timeout_s:g} s (a previous "
                             f"session may still be writing its trace); a stop is pending so that no session "
                             f"this capture started keeps running", t0)
        if start.error is not None:
            raise start.error
        status = start.status
        if status != 200:
            self.pending.add(self.base_url, in_flight=start)     # a 5xx may hide a session that started
        if status == 404:
            raise NotAProfiler(f"{self.base_url}/start_profile answers 404: profiling is not enabled (start vLLM "
                               "with --profiler-config '{\"profiler\":\"torch\",\"torch_profiler_dir\":DIR}')")
        if status == 409:
            raise ProfilerBusy(f"{self.base_url}: a profiling session is already running")
        if status != 200:
            raise ProfilerError(f"{self.base_url}/start_profile answered {status}"
                                + ("; a stop follows in case it started anyway" if status >= 500 else ""))
        # What is on disk once the start answered belongs to earlier sessions: vLLM answers a start
        # blocked behind a previous stop only after that stop wrote its files.
        before = self._existing()
        stopper = None
        self.pending.started(self.base_url, start)
        try:
            time.sleep(duration_ms / 1e3)
            wait_s = self._within(self.stop_deadline(duration_ms) + margin_s, t0)
            # The request itself waits as long as a stop can take: if this capture stops
            # waiting first, the follow-up takes over this same request rather than send
            # another stop, which could end the next session once this one is written.
            stopper = _Request(self.base_url, "/stop_profile", max(wait_s, STOP_WAIT_S))
            stopper.start()
            try:
                path, extras = self._await_trace(stopper, before, wait_s, t0)
            except ProfilerSlow as exc:
                if stopper.is_alive():           # the engine is still writing: the trace can be taken later
                    exc.late = LateTrace(self, stopper, before)
                raise
            return ServingTrace(b"", path, False, time.time() - t0, source_root=self.trace_dir,
                                extra_paths=extras)
        finally:
            if stopper is None or stopper.status != 200:
                # every way out of a started session ends with a stop, now or later
                self.pending.add(self.base_url, in_flight=stopper)
            self.pending.stopped(self.base_url)

    def _within(self, wait_s: float, t0: float) -> float:
        """`wait_s`, cut to what is left of the caller's budget (at least 1 s)."""
        if self.budget_s is None:
            return wait_s
        return max(1.0, min(wait_s, self.budget_s - (time.time() - t0)))

    def _await_trace(self, stopper: "_Request", before: dict, wait_s: float,
                     t0: float) -> tuple[Path, list[Path]]:
        """The session's traces once all are whole on disk, or once the stop
        answered; raises when neither happens in time."""
        deadline = time.monotonic() + wait_s
        seen: dict[Path, int] = {}
        while True:
            done = not stopper.is_alive()
            if done and stopper.error is not None:
                raise stopper.error
            if done and stopper.status is None:
                raise self._late(f"/stop_profile has not answered in {STOP_WAIT_S:.0f} s", t0)
            if done and stopper.status != 200:
                raise ProfilerError(f"{self.base_url}/stop_profile answered {stopper.status}")
            found = self.session_files(before)
            main = self.pick(found)
            if main is not None:
                traces = [f for f in found if any(fnmatch(f.name, pat) for pat in TRACE_PATTERNS)]
                sizes = {f: _size(f) for f in traces}
                # the engine said it is written, or, while its answer is pending, every trace of
                # the session is whole on disk and the worker's is among them: the API server's
                # alone is not the session (a real vLLM 0.32 wrote it a minute before the worker's)
                worker = any(not _frontend(f) for f in traces)
                if done or worker and all(seen.get(f) == n and complete(f) for f, n in sizes.items()):
                    if stopper.status == 200:
                        _STOP_SECONDS[self.base_url] = stopper.seconds
                    return main, [f for f in found if f != main]
                seen = sizes
            elif done:
                raise ProfilerError(f"{self.base_url}: stopped, but no new trace file under {self.trace_dir}")
            if time.monotonic() >= deadline:
                raise self._late(f"/stop_profile has not finished in {wait_s:.0f} s and no complete "
                                 f"trace is on disk yet; the stop stays pending, and the engine will write its "
                                 f"trace under {self.trace_dir}", t0)
            stopper.join(self.poll_s)

    def _late(self, what: str, t0: float) -> ProfilerError:
        # a hung /health must not push the answer past the caller's deadline
        if healthy(self.base_url, timeout=min(5.0, max(0.5, self._within(5.0, t0) - 1.0))):
            return ProfilerSlow(f"{self.base_url} is alive (its /health answers) but {what}")
        return ProfilerUnreachable(f"{self.base_url}: {what}; and /health does not answer in time: the server "
                                   f"may have exited or be stalled")

    def _existing(self) -> dict[Path, tuple[int, float]]:
        return {p: (st.st_size, st.st_mtime) for p, st in self._files()}

    def _files(self):
        """(path, lstat) of every trace and table file below the trace
        directory (regular files only; links are neither followed nor kept)."""
        for top, dirs, files in os.walk(self.trace_dir, followlinks=False):
            for name in files:
                if not any(fnmatch(name, pat) for pat in TRACE_PATTERNS + TABLE_PATTERNS):
                    continue
                path = Path(top) / name
                try:
                    st = path.lstat()
                except OSError:
                    continue                       # removed meanwhile
                if stat.S_ISREG(st.st_mode):
                    yield path, st

    def session_files(self, before: dict[Path, tuple[int, float]]) -> list[Path]:
        """The files this session wrote: those not in `before` (the listing
        taken once the start answered), or changed since (a table every
        session rewrites)."""
        return [p for p, st in self._files() if before.get(p) != (st.st_size, st.st_mtime)]

    @staticmethod
    def pick(files: list[Path]) -> Path | None:
        """The trace to read: the worker's (rank<N>.*, the GPU kernels) before
        the API server's (*async_llm*), the largest first."""
        traces = [(p, _size(p)) for p in files if any(fnmatch(p.name, pat) for pat in TRACE_PATTERNS)]
        if not traces:
            return None
        traces.sort(key=lambda f: (_frontend(f[0]), -f[1]))
        return traces[0][0]


def _frontend(path: Path) -> bool:
    """vLLM's API server (frontend) trace: host-side only, not the worker's."""
    return "async_llm" in path.name


class _Request(threading.Thread):
    """One POST in the background: a stop's answer can take minutes while
    the trace is already whole on disk, and a start can block for as long."""

    def __init__(self, base_url: str, path: str, timeout: float) -> None:
        super().__init__(name=f"profile{path.replace('/', '-')}", daemon=True)
        self.base_url, self.path, self.timeout = base_url, path, timeout
        self.status: int | None = None          # None: no answer in time
        self.error: ProfilerError | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self.status = post(self.base_url, self.path, self.timeout)
        except _Timeout:
            self.status = None
        except ProfilerError as exc:
            self.error = exc
        self.seconds = time.monotonic() - t0


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return -1


def complete(path: Path) -> bool:
    """A gzip trace whose stream ends (the writer closed it), or any other
    trace file, non-empty; read without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            if not path.name.endswith(".gz"):
                size = os.fstat(fd).st_size
                if size == 0:
                    return False
                if path.name.endswith(".json"):       # a JSON document ends with its closing bracket
                    f.seek(max(0, size - 64))
                    return f.read().rstrip().endswith((b"}", b"]"))
                return True
            d = zlib.decompressobj(wbits=47)
            while not d.eof:
                chunk = f.read(1 << 20)
                if not chunk:
                    return False
                d.decompress(chunk, 1 << 16)
                while d.unconsumed_tail:
                    d.decompress(d.unconsumed_tail, 1 << 16)
            return True
    except (OSError, zlib.error):
        return False
    finally:
        os.close(fd)
