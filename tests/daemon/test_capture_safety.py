"""Capture files nobody can redirect, and capture targets the agent knows.

Real servers on loopback stand in for the targets: a gRPC server speaking
the XLA ProfilerService (the hostile kind: it plants symbolic links in the
directory the agent gives it) and an HTTP server speaking vLLM's
/start_profile and /stop_profile that writes (and plants) trace files.
"""
from __future__ import annotations

import gzip
import http.server
import json
import os
import stat
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuscope.collectors.jobs import JobDiscovery
from gpuscope.collectors.nvml import NvmlCollector
from gpuscope.collectors.serving_profiler import TorchProfilerHttp
from gpuscope.collectors.xla_profiler import XlaProfilerClient
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon import safe_files
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
from gpuscope.daemon.serve import build_server, shutdown
from gpuscope.daemon.service import AgentServicer
from gpuscope.v1 import agent_pb2, agent_pb2_grpc
from gpuscope.xla import profiler_service_pb2 as ps, xplane_pb2
from tests.fakes.nvml import FakeNvml, h200

HOST = "host-a"
XSPACE = xplane_pb2.XSpace(hostnames=["job-host"]).SerializeToString()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def tree(path: Path) -> dict[str, bytes | str]:
    """Everything below `path`, links shown as links (never followed)."""
    out: dict[str, bytes | str] = {}
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            p = Path(top) / name
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_bytes()
            else:
                out[rel] = "dir"
    return out


class FakeProfiler:
    """A real gRPC ProfilerService. `on_profile(request)` runs before the
    answer (to plant files); the XSpace comes back in the response unless
    `in_response` is False (then only what on_profile wrote is there)."""

    def __init__(self, on_profile=None, in_response: bool = True):
        self.on_profile = on_profile or (lambda req: None)
        self.in_response = in_response
        self.profiles = 0
        handlers = {
            "Profile": grpc.unary_unary_rpc_method_handler(
                self._profile, ps.ProfileRequest.FromString, ps.ProfileResponse.SerializeToString),
            "Terminate": grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: ps.TerminateResponse(), ps.TerminateRequest.FromString,
                ps.TerminateResponse.SerializeToString),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("tensorflow.ProfilerService",
                                                                                    handlers)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def _profile(self, req, context):
        self.profiles += 1
        self.on_profile(req)
        resp = ps.ProfileResponse(empty_trace=False)
        if self.in_response:
            resp.tool_data.add(name=f"{req.host_name}.xplane.pb", data=XSPACE)
        return resp

    def stop(self):
        self.server.stop(0)


@pytest.fixture
def outside(tmp_path):
    """A directory outside the capture directory, with a file worth protecting."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "precious").write_bytes(b"do not touch")
    return d


@pytest.fixture
def caps(tmp_path):
    return tmp_path / "captures"


# ---------------------------------------------------------------- modes


def test_directories_are_0700_and_files_0600_whatever_the_umask(tmp_path):
    prof = FakeProfiler()
    old = os.umask(0o000)                          # the most permissive umask: modes must not depend on it
    try:
        caps = tmp_path / "a" / "b" / "captures"   # missing, parents too
        runner = CaptureRunner(CaptureConfig(caps), HOST)
        rec, data = runner.capture(prof.address, 100)
    finally:
        os.umask(old)
        prof.stop()
    assert rec.status == "ok" and data == XSPACE, rec
    cap_dir = caps / rec.id
    assert mode(caps) == 0o700 and mode(cap_dir) == 0o700
    # found by a tester: the missing parents were made 0777 less the umask (0755 as usually run)
    assert mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    assert sorted(p.name for p in cap_dir.iterdir()) == ["capture.json", f"{HOST}.xplane.pb"]
    assert all(mode(p) == 0o600 for p in cap_dir.iterdir())
    assert Path(rec.path).read_bytes() == XSPACE and json.loads((cap_dir / "capture.json").read_text())["id"] == rec.id


def test_a_trace_the_job_wrote_into_the_capture_directory_is_kept_private(caps):
    def job_writes(req):                           # as JAX 0.4-0.10 do: <root>/<session>/<host>.xplane.pb
        d = Path(req.repository_root) / req.session_id
        d.mkdir()
        (d / f"{req.host_name}.xplane.pb").write_bytes(XSPACE)
        os.chmod(d / f"{req.host_name}.xplane.pb", 0o644)
    prof = FakeProfiler(job_writes, in_response=False)
    try:
        rec, data = CaptureRunner(CaptureConfig(caps), HOST).capture(prof.address, 100)
    finally:
        prof.stop()
    assert rec.status == "ok" and data == XSPACE, rec
    assert rec.path == str(caps / rec.id / rec.id / f"{HOST}.xplane.pb") and mode(Path(rec.path)) == 0o600
    assert mode(caps / rec.id) == 0o700 and mode(caps / rec.id / "capture.json") == 0o600


# ---------------------------------------------------------------- the root


def test_an_unsafe_capture_root_is_refused_at_start_up(tmp_path, outside):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=r"writable by group or others \(mode 0777\).*chmod 700"):
        CaptureRunner(CaptureConfig(shared), HOST)
    assert mode(shared) == 0o777                   # refused, not changed: it may be a directory others use
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)                           # as /tmp: anyone may plant a link here
    link = sticky / "link"
    link.symlink_to(outside)
    with pytest.raises(ValueError, match="is a symbolic link others could have planted"):
        CaptureRunner(CaptureConfig(link), HOST)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match="not a directory"):
        CaptureRunner(CaptureConfig(tmp_path / "file"), HOST)
    readable = tmp_path / "readable"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    CaptureRunner(CaptureConfig(readable), HOST)   # read bits are the operator's choice
    assert mode(readable) == 0o755


def test_missing_parents_are_made_0700_under_the_usual_umask(tmp_path):
    old = os.umask(0o022)
    try:
        os.close(safe_files.open_root(tmp_path / "x" / "a" / "b" / "c"))     # as `--capture-dir /tmp/x/a/b/c`
    finally:
        os.umask(old)
    assert [mode(tmp_path.joinpath(*"xabc"[:i])) for i in range(1, 5)] == [0o700] * 4


@pytest.mark.parametrize("link_at", ["x", "x/a"])
def test_a_missing_root_is_never_made_through_a_planted_symbolic_link(tmp_path, outside, link_at):
    """Found by a tester: mkdir(parents=True) followed a link anywhere on the
    way (in /tmp, anyone may plant one where the parents will be)."""
    (tmp_path / link_at).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link_at).parent.chmod(0o1777)                       # shared, as /tmp
    (tmp_path / link_at).symlink_to(outside)
    root = tmp_path / "x" / "a" / "b" / "c"
    with pytest.raises(ValueError, match=rf"capture directory: {tmp_path / link_at} is a symbolic link others "
                                         r"could have planted .* directories are not created through one"):
        CaptureRunner(CaptureConfig(root), HOST)                    # said at start-up
    with pytest.raises(safe_files.UnsafePath, match="is a symbolic link"):
        safe_files.open_root(root)                                  # and at the first capture
    assert tree(outside) == {"precious": b"do not touch"}


def test_a_root_below_a_directory_anyone_may_write_to_is_refused_at_start_up(tmp_path):
    """Found in a trial: --capture-dir /tmp/ww/sub/caps, /tmp/ww 0777 without
    the sticky bit, started fine; anyone could have replaced sub later."""
    shared = tmp_path / "ww"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=rf"{shared} is writable by anyone and not sticky \(mode 0777\)"):
        CaptureRunner(CaptureConfig(shared / "sub" / "caps"), HOST)
    shared.chmod(0o1777)                          # as /tmp: others may not replace what is not theirs
    os.close(safe_files.open_root(shared / "sub" / "caps"))


def test_a_root_that_is_a_link_only_its_owner_could_have_made_is_followed(tmp_path):
    """As /var/lib/gpuscope/captures -> /data/captures (found in a trial: refused)."""
    real, private = tmp_path / "data", tmp_path / "varlib"
    real.mkdir(mode=0o700)
    private.mkdir(mode=0o755)
    (private / "captures").symlink_to(real, target_is_directory=True)
    CaptureRunner(CaptureConfig(private / "captures"), HOST)
    os.close(safe_files.open_root(private / "captures"))


def test_a_link_only_its_owner_could_have_made_is_followed(tmp_path):
    """As /home -> /data/home on many clusters: a root-owned link in a
    directory only root writes to leads to the default capture directory."""
    real, private = tmp_path / "data", tmp_path / "private"
    real.mkdir(mode=0o700)
    private.mkdir(mode=0o755)
    (private / "home").symlink_to(real, target_is_directory=True)
    os.close(safe_files.open_root(private / "home" / "state" / "captures"))
    assert mode(real / "state") == 0o700 and mode(real / "state" / "captures") == 0o700


def test_a_root_made_unsafe_after_start_up_fails_the_capture(caps, outside):
    prof = FakeProfiler()
    runner = CaptureRunner(CaptureConfig(caps), HOST)
    try:
        caps.mkdir(mode=0o700)
        caps.chmod(0o777)
        rec, data = runner.capture(prof.address, 100)
    finally:
        prof.stop()
    assert rec.status == "failed" and "writable by group or others" in rec.error and not data
    assert prof.profiles == 0 and not list(caps.iterdir())


# ---------------------------------------------------------------- planted links


def test_a_link_planted_as_the_per_capture_directory_is_not_followed(caps, outside):
    prof = FakeProfiler()
    runner = CaptureRunner(CaptureConfig(caps), HOST, new_id=lambda: "planted")
    caps.mkdir(mode=0o700)
    (caps / "planted").symlink_to(outside, target_is_directory=True)
    before = tree(outside)
    try:
        rec, data = runner.capture(prof.address, 100)
    finally:
        prof.stop()
    assert rec.status == "failed" and not data and not rec.path, rec
    assert f"{caps}/planted is a symbolic link; not written through it" in rec.error
    assert prof.profiles == 0                      # the profiler was never asked to write there
    assert tree(outside) == before
    assert runner.records[-1] is rec


@pytest.mark.parametrize("name", [f"{HOST}.xplane.pb", "capture.json"])
@pytest.mark.parametrize("victim", ["precious", "new-file"])
def test_a_link_planted_as_a_file_name_is_not_written_through(caps, outside, name, victim):
    def plant(req):                                # the profiler plants the link in the directory we gave it
        (Path(req.repository_root) / name).symlink_to(outside / victim)
    prof = FakeProfiler(plant)
    before = tree(outside)
    try:
        rec, data = CaptureRunner(CaptureConfig(caps), HOST).capture(prof.address, 100)
    finally:
        prof.stop()
    assert rec.status == "failed" and not data and not rec.path, rec
    assert f"{caps / rec.id}/{name} is a symbolic link; not written through it" in rec.error
    assert tree(outside) == before                 # unchanged, and nothing new there
    assert not list(caps.iterdir())                # the failed capture's directory (and the link) are gone


@pytest.mark.parametrize("planted", ["file", "session-dir"])
def test_a_job_written_trace_behind_a_link_is_not_read(caps, outside, planted):
    secret = outside / "precious"

    def plant(req):
        root = Path(req.repository_root)
        if planted == "file":
            (root / req.session_id).mkdir()
            (root / req.session_id / f"{req.host_name}.xplane.pb").symlink_to(secret)
        else:
            (outside / f"{req.host_name}.xplane.pb").write_bytes(b"outside bytes")
            (root / req.session_id).symlink_to(outside, target_is_directory=True)
    prof = FakeProfiler(plant, in_response=False)
    try:
        rec, data = CaptureRunner(CaptureConfig(caps), HOST).capture(prof.address, 100)
    finally:
        prof.stop()
    assert rec.status == "failed" and not data and not rec.path, rec
    assert "is a symbolic link; not read through it" in rec.error
    assert secret.read_bytes() == b"do not touch" and not list(caps.iterdir())


# ---------------------------------------------------------------- the budget


def test_the_budget_ignores_linked_files_and_directories(caps, outside):
    (outside / "big").write_bytes(b"x" * 8192)
    caps.mkdir(mode=0o700)
    (caps / "old").mkdir()
    (caps / "old" / "link-to-big").symlink_to(outside / "big")
    (caps / "link-to-dir").symlink_to(outside, target_is_directory=True)
    prof = FakeProfiler()
    runner = CaptureRunner(CaptureConfig(caps, max_bytes=4096), HOST)
    try:
        rec, _ = runner.capture(prof.address, 100)
        assert rec.status == "ok", rec             # links count nothing: within budget
        (caps / "old" / "real").write_bytes(b"x" * 4096)
        rec, _ = runner.capture(prof.address, 100)
        assert rec.status == "disk-full" and "is full" in rec.error
    finally:
        prof.stop()
    assert (outside / "big").read_bytes() == b"x" * 8192


# ---------------------------------------------------------------- serving engines


class Engine:
    """A real HTTP server speaking vLLM's profiling protocol; on stop it
    writes what `on_stop(trace_dir)` writes."""

    def __init__(self, trace_dir: Path, on_stop):
        trace_dir.mkdir(exist_ok=True)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/stop_profile":
                    on_stop(trace_dir)
                self.send_response(200 if self.path in ("/start_profile", "/stop_profile") else 404)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.trace_dir = trace_dir
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


TRACE = gzip.compress(b'{"traceEvents": []}')


def _capture_served(engine, config):
    """One capture of a serving engine's trace through the agent's runner; the engine stops after."""
    try:
        return CaptureRunner(config, HOST).capture(engine.url, 100, kind="torch-http",
                                                   client=TorchProfilerHttp(engine.url, engine.trace_dir))
    finally:
        engine.stop()

def test_serving_traces_are_copied_without_following_links(tmp_path, caps, outside):
    secret = outside / "secret.pt.trace.json.gz"
    secret.write_bytes(b"s" * 100_000)             # bigger: the newest-trace choice would prefer it

    def write(trace_dir):
        (trace_dir / "rank0.pt.trace.json.gz").write_bytes(TRACE)
        (trace_dir / "rank1.pt.trace.json.gz").symlink_to(secret)
        (trace_dir / "sub").symlink_to(outside, target_is_directory=True)
    rec, data = _capture_served(Engine(tmp_path / "engine", write), CaptureConfig(caps))
    assert rec.status == "ok" and data == TRACE, rec
    copy = caps / rec.id / "rank0.pt.trace.json.gz"
    assert rec.path == str(copy) and copy.read_bytes() == TRACE and mode(copy) == 0o600
    assert mode(caps / rec.id) == 0o700


def test_a_serving_trace_that_is_only_a_link_is_no_trace(tmp_path, caps, outside):
    rec, data = _capture_served(Engine(tmp_path / "engine",
                                       lambda d: (d / "rank0.pt.trace.json.gz").symlink_to(outside / "precious")),
                                CaptureConfig(caps))
    assert rec.status == "failed" and "no new trace file" in rec.error and not data
    assert not list(caps.iterdir())


def test_a_serving_trace_over_the_size_bound_is_not_read(tmp_path, caps):
    rec, data = _capture_served(Engine(tmp_path / "engine", lambda d: (d / "rank0.pt.trace.json.gz").write_bytes(
        b"x" * 4096)), CaptureConfig(caps, max_trace_bytes=1024))
    assert rec.status == "failed" and "more than the" in rec.error and not data
    assert not list(caps.iterdir())


# ---------------------------------------------------------------- targets the agent knows


@pytest.fixture
def agent_server(tmp_path):
    """The real agent gRPC API over an agent that knows one JAX profiler
    (--profiler) and one serving engine (--serving)."""
    known = FakeProfiler()
    unknown = FakeProfiler()
    engine = Engine(tmp_path / "engine", lambda d: (d / "rank0.pt.trace.json.gz").write_bytes(TRACE))
    agent = Agent(AgentConfig(host=HOST, interval_s=0.1, slow_interval_s=1.0), NvmlCollector(nvml=FakeNvml([h200()])))
    agent.start()
    agent.captures = CaptureRunner(CaptureConfig(tmp_path / "captures"), HOST)
    agent.discovery = JobDiscovery(lambda a: XlaProfilerClient(a).probe(), configured=[known.address],
                                   serving={engine.url: str(engine.trace_dir)})
    server, port, health = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent), "gpuscope.v1.Agent")])
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield agent_pb2_grpc.AgentStub(channel), known, unknown, engine, tmp_path / "captures"
    finally:
        channel.close()
        shutdown(server, health)
        agent.stop()
        for s in (known, unknown, engine):
            s.stop()


def test_a_capture_of_an_address_the_agent_does_not_know_is_refused(agent_server):
    stub, known, unknown, engine, caps = agent_server
    for address in (unknown.address, "10.0.0.1:9012", "http://127.0.0.1:1/"):
        with pytest.raises(grpc.RpcError) as err:
            stub.Capture(agent_pb2.CaptureRequest(jax_address=address, duration_ms=100), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"start the agent with --profiler {address}" in err.value.details()
    assert unknown.profiles == 0                   # never contacted
    assert not caps.exists() or not list(caps.iterdir())
    assert not stub.ListCaptures(agent_pb2.ListCapturesRequest(), timeout=10).captures


def test_a_capture_of_a_process_on_none_of_the_gpus_is_refused(agent_server):
    """By pid, only a job on the agent's GPUs: this test process listens on
    nothing the agent knows, and a pid is no way around that."""
    stub, known, unknown, engine, caps = agent_server
    for pid in (os.getpid(), 1):
        with pytest.raises(grpc.RpcError) as err:
            stub.Capture(agent_pb2.CaptureRequest(pid=pid, duration_ms=100), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"pid {pid} is not a process on this host's GPUs" in err.value.details()
    assert unknown.profiles == known.profiles == 0
    assert not caps.exists() or not list(caps.iterdir())


def test_configured_targets_are_captured(agent_server):
    stub, known, unknown, engine, caps = agent_server
    reply = stub.Capture(agent_pb2.CaptureRequest(jax_address=known.address, duration_ms=100), timeout=30)
    assert reply.record.status == "ok" and reply.xspace == XSPACE and known.profiles == 1
    assert reply.record.path.startswith(str(caps))
    reply = stub.Capture(agent_pb2.CaptureRequest(jax_address=engine.url + "/", duration_ms=100), timeout=30)
    assert reply.record.status == "ok" and reply.record.kind == "torch-http" and reply.xspace == TRACE
    assert mode(Path(reply.record.path)) == 0o600
