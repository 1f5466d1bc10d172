"""Deep captures of a real JAX program on the CPU: discovered by its
listening port, captured over the real profiler RPC through the agent, its
XSpace parsed and stored by the analyzer. No mocks on that path; the GPU
list the agent sees comes from the fake NVML (the job runs on no GPU)."""
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuscope.collectors.jobs import JobDiscovery
from gpuscope.collectors.xla_profiler import XlaProfilerClient
from gpuscope.collectors.xspace_reader import parse_xspace
from gpuscope.daemon import clients
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
from gpuscope.daemon.convert import capture_pb
from gpuscope.daemon.serve import build_server, shutdown
from gpuscope.daemon.service import AgentServicer
from gpuscope.v1 import agent_pb2_grpc
from tests.conftest import free_port
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import AnalyzerServer, fake_agent, wait_for

JOB = Path(__file__).parent / "jobs" / "jax_job.py"


def start_job(seconds=120, env=None):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(JOB), "--port", str(port), "--seconds", str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout.readline().strip() == "ready"
    return proc, port


@pytest.fixture(scope="module")
def jax_job():
    proc, port = start_job()
    yield proc, port
    proc.kill()
    proc.wait()


def probe(addr):
    return XlaProfilerClient(addr).probe()


def test_discovery_finds_the_profiler_port_of_a_gpu_process(jax_job):
    proc, port = jax_job
    d = JobDiscovery(probe)
    assert port in d.listening_ports(proc.pid)
    job = d.find(proc.pid, [0])
    assert job.address == f"127.0.0.1:{port}" and job.found_by == "port" and "jax_job.py" in job.command
    assert d.find(os.getpid()) is None                     # pytest itself serves no profiler


def test_discovery_from_the_job_environment():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(JOB), "--port", str(port), "--seconds", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "GPUSCOPE_PROFILER_PORT": str(port)})
    bad, _ = start_job(seconds=30, env={"GPUSCOPE_PROFILER_PORT": "0"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        job = JobDiscovery(lambda a: False).find(proc.pid)     # no probing needed: the job said where
        assert job.found_by == "environ" and job.address == f"127.0.0.1:{port}"
        assert JobDiscovery(probe).find(bad.pid).found_by == "port"   # an invalid env port: scan instead
    finally:
        for p in (proc, bad):
            p.kill()
            p.wait()


def test_capture_through_agent_and_analyzer_end_to_end(jax_job, tmp_path):
    proc, port = jax_job
    srv = AnalyzerServer(tmp_path / "cap.duckdb")
    fake = FakeNvml([h200(util_gpu=95, util_mem=20, processes=[(proc.pid, 1 << 30)],
                          gpm_values={2: 90.0, 5: 88.0, 10: 15.0, 12: 1.0, 13: 0.0})])
    agent = fake_agent(fake, srv.target)
    agent.captures = CaptureRunner(CaptureConfig(tmp_path / "captures"), "host-a")
    agent.discovery = JobDiscovery(probe)
    agent.capture_reporter = lambda rec, data: clients.report_capture(srv.target, capture_pb(rec), data)
    server, aport, health = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, srv.target), "gpuscope.v1.Agent")])
    server.start()
    try:
        wait_for(lambda: clients.findings(srv.target, open_only=True))
        t0 = time.monotonic()
        record, xspace = clients.capture(f"127.0.0.1:{aport}", None, proc.pid, 500)
        took = time.monotonic() - t0
        assert record["status"] == "ok", record
        assert record["pid"] == proc.pid and record["gpus"] == [0] and record["target"] == f"127.0.0.1:{port}"
        assert Path(record["path"]).is_file() and str(tmp_path / "captures") in record["path"]
        assert took < 0.5 + 5                               # duration + margin; the benchmark measures it
        trace = parse_xspace(xspace, record["path"])
        assert trace.span_ns > 0 and trace.host.threads > 0 and not trace.devices   # the job runs on the CPU
        assert trace.programs, "the capture asks for the programs' HLO (enable_hlo_proto)"
        stored = wait_for(lambda: clients.captures(srv.target))      # reported in the background
        assert stored[0]["id"] == record["id"] and stored[0]["finding_id"]
        finding = clients.findings(srv.target, open_only=True)[0]
        assert finding["id"] == stored[0]["finding_id"] and record["id"] in finding["captures"]
        assert finding["decided_by"] == "counters" and finding["trace_verdict"] is None   # a CPU trace names nothing
        listed = clients.captures(f"127.0.0.1:{aport}")
        assert listed[0]["id"] == record["id"]
    finally:
        agent.stop()
        shutdown(server, health)
        srv.stop()


def test_never_two_captures_of_one_process(jax_job, tmp_path):
    proc, port = jax_job
    runner = CaptureRunner(CaptureConfig(tmp_path), "h")
    results = {}

    def go(k):
        results[k] = runner.capture(f"127.0.0.1:{port}", 1500, pid=proc.pid)[0]
    first = threading.Thread(target=go, args=("first",))
    first.start()
    time.sleep(0.3)
    go("second")
    first.join()
    assert results["first"].status == "ok"
    assert results["second"].status == "busy" and "already running" in results["second"].error


def test_a_second_client_is_refused_by_the_profiler_itself(jax_job, tmp_path):
    proc, port = jax_job
    a, b = CaptureRunner(CaptureConfig(tmp_path / "a"), "h"), CaptureRunner(CaptureConfig(tmp_path / "b"), "h")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("a", a.capture(f"127.0.0.1:{port}", 1500)[0]))
    th.start()
    time.sleep(0.3)
    out["b"] = b.capture(f"127.0.0.1:{port}", 200)[0]     # no pid: our lock cannot see it, the server refuses
    th.join()
    assert out["a"].status == "ok" and out["b"].status == "busy"


def test_ports_that_are_not_profilers(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    srv = AnalyzerServer(tmp_path / "np.duckdb")
    runner = CaptureRunner(CaptureConfig(tmp_path / "c"), "h")
    try:
        for addr in (f"127.0.0.1:{httpd.server_address[1]}", srv.target):
            assert not XlaProfilerClient(addr).probe()
            rec, data = runner.capture(addr, 100)
            assert rec.status == "not-a-profiler" and not data, rec
        rec, _ = runner.capture(f"127.0.0.1:{free_port()}", 100)
        assert rec.status == "unreachable"
        assert not list((tmp_path / "c").iterdir())            # failed captures leave no files
    finally:
        httpd.shutdown()
        srv.stop()


def test_job_killed_mid_capture(tmp_path):
    proc, port = start_job(seconds=60)
    runner = CaptureRunner(CaptureConfig(tmp_path), "h")
    threading.Timer(0.5, proc.kill).start()
    rec, data = runner.capture(f"127.0.0.1:{port}", 4000, pid=proc.pid)
    proc.wait(10)
    assert rec.status in ("unreachable", "failed") and rec.error and not data, rec
    assert runner.records[-1] is rec and not list(tmp_path.iterdir())


def test_full_capture_directory_is_recorded_not_attempted(jax_job, tmp_path):
    proc, port = jax_job
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "big.xplane.pb").write_bytes(b"x" * 2048)
    runner = CaptureRunner(CaptureConfig(tmp_path, max_bytes=1024), "h")
    rec, _ = runner.capture(f"127.0.0.1:{port}", 100, pid=proc.pid)
    assert rec.status == "disk-full" and "is full" in rec.error
