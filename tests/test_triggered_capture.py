"""Anomaly -> decision -> command -> agent -> target -> report, end to end on
loopback: a real JAX program with its profiler server, and a real HTTP server
speaking the /start_profile and /stop_profile protocol that writes a real
trace. The GPUs the agents see come from the fake NVML."""
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscope.analyzers.detector import DetectorConfig
from gpuscope.analyzers.trigger import TriggerConfig
from gpuscope.collectors.jobs import JobDiscovery
from gpuscope.collectors.xla_profiler import XlaProfilerClient
from gpuscope.daemon import clients
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
from gpuscope.daemon.commands import CommandListener
from gpuscope.daemon.convert import capture_pb
from tests.conftest import free_port
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import AnalyzerServer, fake_agent, wait_for

JOBS = Path(__file__).parent / "jobs"
BUSY = dict(util_gpu=95, util_mem=20, gpm_values={2: 90.0, 3: 14.0, 5: 88.0, 10: 15.0, 12: 1.0, 13: 0.0,
                                                  20: 7.0, 21: 16.0})
STARVED = dict(util_gpu=4, util_mem=0, gpm_values={2: 0.0, 3: 0.0, 5: 0.0, 10: 0.0, 12: 0.0, 13: 0.0,
                                                   20: 6.0, 21: 32.0})


def _start(args):
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _agent(analyzer, host, pid, tmp, serving=None):
    fake = FakeNvml([h200(processes=[(pid, 1 << 30)], **BUSY)])
    agent = fake_agent(fake, analyzer.target, host=host)
    agent.captures = CaptureRunner(CaptureConfig(tmp / host), host)
    agent.discovery = JobDiscovery(lambda a: XlaProfilerClient(a).probe(), serving=serving)
    agent.capture_reporter = lambda rec, data: clients.report_capture(analyzer.target, capture_pb(rec), data)
    listener = CommandListener(analyzer.target, host, agent.boot_id, agent.run_command)
    listener.start()
    return fake, agent, listener


def _set(gpu, spec):
    for k, v in spec.items():
        setattr(gpu, k, dict(v) if isinstance(v, dict) else v)


@pytest.mark.parametrize("separate", [False, True], ids=["thread", "process"])
def test_anomalies_trigger_jax_and_http_captures_end_to_end(tmp_path, separate):
    jport, hport = free_port(), free_port()
    trace_dir = tmp_path / "engine-traces"
    jax_job = _start([str(JOBS / "jax_job.py"), "--port", str(jport), "--seconds", "120"])
    engine = _start([str(JOBS / "profile_http_server.py"), "--port", str(hport), "--trace-dir", str(trace_dir)])
    srv = AnalyzerServer(tmp_path / "t.duckdb", window_s=1.0, engine=separate,
                         detector=DetectorConfig(baseline_windows=5, warmup_windows=3),
                         trigger=TriggerConfig(host_cooldown_s=0, fleet_fraction=1.0, capture_duration_ms=500))
    a = _agent(srv, "host-jax", jax_job.pid, tmp_path)
    b = _agent(srv, "host-vllm", engine.pid, tmp_path, serving={f"http://127.0.0.1:{hport}": str(trace_dir)})
    try:
        wait_for(lambda: srv.analyzer.commands.connected("host-jax") and srv.analyzer.commands.connected("host-vllm"))
        wait_for(lambda: len(clients.findings(srv.target, open_only=True)) == 2, timeout=20)
        wait_for(lambda: srv.analyzer.store.count("windows") >= 10, timeout=20)
        for fake, _, _ in (a, b):
            _set(fake.gpus[0], STARVED)                     # the jobs stop feeding their GPUs
        done = wait_for(lambda: [d for d in clients.records(srv.target, "decisions") if d["status"] == "done"
                                 and d["host"] in ("host-jax", "host-vllm")
                                 and {x["host"] for x in clients.records(srv.target, "decisions")
                                      if x["status"] == "done"} == {"host-jax", "host-vllm"}], timeout=60)
        assert {d["action"] for d in done} == {"capture"}
        caps = {c["host"]: c for c in clients.captures(srv.target)}
        assert caps["host-jax"]["kind"] == "jax" and caps["host-jax"]["status"] == "ok"
        assert caps["host-vllm"]["kind"] == "torch-http" and caps["host-vllm"]["status"] == "ok"
        assert str(tmp_path / "host-vllm") in caps["host-vllm"]["path"]       # copied under the agent's directory
        assert caps["host-vllm"]["path"].endswith((".trace.json.gz", ".xplane.pb"))
        anomalies = clients.records(srv.target, "anomalies")
        assert {x["host"] for x in anomalies} >= {"host-jax", "host-vllm"}
        assert all(d["capture_id"] for d in done)
    finally:
        for _, agent, listener in (a, b):
            listener.stop()
            agent.stop()
        srv.stop()
        jax_job.kill()
        engine.kill()


def test_http_protocol_errors_are_recorded(tmp_path):
    from gpuscope.collectors.serving_profiler import TorchProfilerHttp
    hport, dport = free_port(), free_port()
    engine = _start([str(JOBS / "profile_http_server.py"), "--port", str(hport), "--trace-dir", str(tmp_path / "t")])
    disabled = _start([str(JOBS / "profile_http_server.py"), "--port", str(dport), "--trace-dir", str(tmp_path / "d"),
                       "--disabled"])
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h")
    try:
        url = f"http://127.0.0.1:{hport}"
        off = TorchProfilerHttp(f"http://127.0.0.1:{dport}", tmp_path / "d")   # vLLM without --profiler-config: 404
        rec, _ = runner.capture(off.base_url, 100, kind="torch-http", client=off)
        assert rec.status == "not-a-profiler" and "--profiler-config" in rec.error
        ok = TorchProfilerHttp(url, tmp_path / "t")
        import threading
        first = {}
        th = threading.Thread(target=lambda: first.setdefault("r", runner.capture(url, 1500, kind="torch-http",
                                                                                   client=ok)[0]))
        th.start()
        import time
        time.sleep(0.4)
        other = CaptureRunner(CaptureConfig(tmp_path / "caps2"), "h")
        rec2, _ = other.capture(url, 100, kind="torch-http", client=TorchProfilerHttp(url, tmp_path / "t"))
        th.join()
        assert first["r"].status == "ok" and rec2.status == "busy"     # the engine's 409
    finally:
        engine.kill()
        disabled.kill()
    rec3, _ = runner.capture(url, 100, kind="torch-http", client=TorchProfilerHttp(url, tmp_path / "t"))
    assert rec3.status == "unreachable"
