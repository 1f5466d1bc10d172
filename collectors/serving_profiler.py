"""Torch-profiler captures of serving engines over HTTP: vLLM and SGLang
expose `POST /start_profile` and `POST /stop_profile` (vLLM only when started
with a profiler configuration; SGLang always). The engine writes
`*.pt.trace.json.gz` into its own profiler directory on this host; we name
the newest and the capture runner copies it into our capture directory.

This module reads no trace bytes: it returns the path and the directory the
path is confined to (`ServingTrace.source_root`), and the runner reads it
below that directory without following links. Looking for the newest trace
does not follow links either: a link in the trace directory (to a file or
to a directory) is not a trace.

Measured on vLLM: start answers 200 in ~10 ms, 409 while a session runs, 404
without --profiler-config; stop answers 200 only after the traces are
written, 6-19 s later, hence the long stop timeout.
"""
from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from .xla_profiler import CaptureResult, NotAProfiler, ProfilerBusy, ProfilerError, ProfilerUnreachable

TRACE_PATTERNS = ("*.pt.trace.json.gz", "*.trace.json.gz", "*.trace.json", "*.xplane.pb")


@dataclass
class ServingTrace(CaptureResult):
    """A trace the engine wrote on this host: `xspace` is empty; the runner
    reads `path`, which lies below `source_root`, and keeps a copy."""
    source_root: Path


class TorchProfilerHttp:
    def __init__(self, base_url: str, trace_dir: str | Path, stop_timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.trace_dir = Path(trace_dir)
        self.stop_timeout_s = stop_timeout_s

    def _post(self, path: str, timeout: float, body: dict | None = None) -> int:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise ProfilerUnreachable(f"{self.base_url}: {getattr(exc, 'reason', exc)}; the server may have exited") from None

    def capture(self, duration_ms: int, repository_root: Path, session_id: str, host_name: str = "gpuscope",
                margin_s: float = 15.0) -> CaptureResult:
        t0 = time.time()
        status = self._post("/start_profile", timeout=10)
        if status == 404:
            raise NotAProfiler(f"{self.base_url}/start_profile answers 404: profiling is not enabled (start vLLM "
                               "with --profiler-config '{\"profiler\":\"torch\",\"torch_profiler_dir\":DIR}')")
        if status == 409:
            raise ProfilerBusy(f"{self.base_url}: a profiling session is already running")
        if status != 200:
            raise ProfilerError(f"{self.base_url}/start_profile answered {status}")
        time.sleep(duration_ms / 1e3)
        status = self._post("/stop_profile", timeout=self.stop_timeout_s + margin_s)
        if status != 200:
            raise ProfilerError(f"{self.base_url}/stop_profile answered {status}")
        path = self.newest_trace(since=t0)
        if path is None:
            raise ProfilerError(f"{self.base_url}: stopped, but no new trace file under {self.trace_dir}")
        return ServingTrace(b"", path, False, time.time() - t0, source_root=self.trace_dir)

    def newest_trace(self, since: float) -> Path | None:
        """The trace to keep among the regular files written since `since`
        below the trace directory; links are neither followed nor chosen."""
        found: list[tuple[Path, os.stat_result]] = []
        for top, dirs, files in os.walk(self.trace_dir, followlinks=False):
            for name in files:
                if not any(fnmatch(name, pat) for pat in TRACE_PATTERNS):
                    continue
                path = Path(top) / name
                try:
                    st = path.lstat()
                except OSError:
                    continue                       # removed meanwhile
                if stat.S_ISREG(st.st_mode) and st.st_mtime >= since - 1:
                    found.append((path, st))
        if not found:
            return None
        # vLLM writes a worker trace (rank0.*, the GPU kernels) and an API-server one (*async_llm*)
        found.sort(key=lambda f: ("async_llm" in f[0].name, -f[1].st_size))
        return found[0][0]
