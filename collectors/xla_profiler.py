"""Client of the XLA/TSL profiler service that JAX jobs start with
`jax.profiler.start_server(port)` (gRPC service tensorflow.ProfilerService).

Facts it respects: the server sleeps for `opts.duration_ms` then collects,
so the deadline is the duration plus a margin; it allows one session per
process ("Another profiling session active." -> ProfilerBusy); it listens
without authentication, so we only ever ask for a trace and write nowhere
but the directory we are given. Servers that return the XSpace in the
response are read from it; the ones that write `<root>/<session>/<host>.xplane.pb`
(JAX 0.4-0.10) or `<root>/plugins/profile/<session>/...` are read from disk.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc

from gpuscope.xla import profiler_service_pb2 as ps

SERVICE = "/tensorflow.ProfilerService/"


class ProfilerError(RuntimeError):
    """A capture that did not happen; `reason` is one word for records."""
    reason = "failed"


class NotAProfiler(ProfilerError):
    reason = "not-a-profiler"


class ProfilerBusy(ProfilerError):
    reason = "busy"


class ProfilerUnreachable(ProfilerError):
    reason = "unreachable"


class CaptureTimeout(ProfilerError):
    reason = "timeout"


@dataclass
class CaptureResult:
    xspace: bytes
    path: Path | None          # where the server wrote it, when it did
    empty: bool
    seconds: float             # wall time of the Profile call


class XlaProfilerClient:
    def __init__(self, address: str, channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel):
        self.address = address
        self._channel_factory = channel_factory

    def _method(self, channel, name: str, req_type, resp_type):
        return channel.unary_unary(SERVICE + name, request_serializer=req_type.SerializeToString,
                                   response_deserializer=resp_type.FromString)

    def probe(self, timeout_s: float = 2.0) -> bool:
        """True when a profiler service answers there. Uses Terminate on a
        session id nobody holds: it starts no capture."""
        with self._channel_factory(self.address) as ch:
            try:
                self._method(ch, "Terminate", ps.TerminateRequest, ps.TerminateResponse)(
                    ps.TerminateRequest(session_id=f"gpuscope-probe-{uuid.uuid4().hex[:8]}"), timeout=timeout_s)
                return True
            except grpc.RpcError:
                return False

    def capture(self, duration_ms: int, repository_root: Path, session_id: str, host_name: str = "gpuscope",
                margin_s: float = 15.0, host_tracer_level: int = 2, python_tracer_level: int = 0,
                start_unix_s: float | None = None) -> CaptureResult:
        """`start_unix_s`: when the session starts, on this host's clock (the
        profiler server waits for it: ProfileOptions.start_timestamp_ns, how
        XLA starts the hosts of one job together); None: now."""
        if duration_ms <= 0:
            raise ValueError(f"duration_ms must be > 0, got {duration_ms}")
        repository_root = Path(repository_root)
        req = ps.ProfileRequest(
            duration_ms=duration_ms, tools=["xplane.pb"], repository_root=str(repository_root),
            session_id=session_id, host_name=host_name,
            # enable_hlo_proto: the XSpace carries each program's HLO (the /host:metadata
            # plane), which puts ops on the roofline by FLOPs and bytes instead of kernel
            # names; without it an H200 capture of a bf16 matmul said "placed by kernel names"
            opts=ps.ProfileOptions(version=1, host_tracer_level=host_tracer_level, device_tracer_level=1,
                                   python_tracer_level=python_tracer_level, duration_ms=duration_ms,
                                   enable_hlo_proto=True,
                                   start_timestamp_ns=int(start_unix_s * 1e9) if start_unix_s else 0))
        wait_s = max(0.0, start_unix_s - time.time()) if start_unix_s else 0.0
        t0 = time.monotonic()
        with self._channel_factory(self.address) as ch:
            try:
                resp = self._method(ch, "Profile", ps.ProfileRequest, ps.ProfileResponse)(
                    req, timeout=wait_s + duration_ms / 1e3 + margin_s)
            except grpc.RpcError as exc:
                raise _classify(exc, self.address) from None
        seconds = time.monotonic() - t0
        for tool in resp.tool_data:
            if tool.name.endswith("xplane.pb") and tool.data:
                return CaptureResult(tool.data, None, resp.empty_trace, seconds)
        path = _find_written(repository_root, session_id)
        if path is None:
            raise ProfilerError(f"{self.address}: the profiler returned no XSpace and wrote none under "
                                f"{repository_root} (is that directory writable by the job?)")
        # only where it is: the job wrote it, so the caller reads it without
        # following links and with a size cap (daemon.safe_files)
        return CaptureResult(b"", path, resp.empty_trace, seconds)


def _find_written(root: Path, session_id: str) -> Path | None:
    for pattern in (f"{session_id}/*.xplane.pb", f"plugins/profile/{session_id}/*.xplane.pb", f"**/{session_id}/*.xplane.pb"):
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
    return None


def _classify(exc: grpc.RpcError, address: str) -> ProfilerError:
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return NotAProfiler(f"{address} is a gRPC server but not an XLA profiler ({detail})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CaptureTimeout(f"{address}: the capture did not finish in time (the job may be stuck)")
    if code == grpc.StatusCode.UNAVAILABLE:
        # A peer that closes the connection mid-call has gone away ("Socket
        # closed"); one that answers in another protocol is not a profiler.
        if any(m in detail for m in ("http1.x server", "SETTINGS frame", "HTTP/2")):
            return NotAProfiler(f"{address} does not speak gRPC ({detail})")
        return ProfilerUnreachable(f"{address}: no profiler answers ({detail}); the job may have exited")
    if "Another profiling session" in detail:
        return ProfilerBusy(f"{address}: a capture is already running in that process")
    return ProfilerError(f"{address}: {code.name}: {detail}")
