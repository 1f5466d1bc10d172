"""Capture overhead: wall time of a capture request minus the duration asked
for, on loopback, against a real JAX program on the CPU with its profiler
server. Measured for the profiler client alone and through the agent's gRPC
API (`gpuscope capture`'s path: agent -> job -> analyzer report).

    python bench/capture_overhead.py [--repeats 3]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.collectors.jobs import JobDiscovery  # noqa: E402
from gpuscope.collectors.xla_profiler import XlaProfilerClient  # noqa: E402
from gpuscope.daemon import clients  # noqa: E402
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner  # noqa: E402
from gpuscope.daemon.convert import capture_pb  # noqa: E402
from gpuscope.daemon.serve import build_server, shutdown  # noqa: E402
from gpuscope.daemon.service import AgentServicer  # noqa: E402
from gpuscope.v1 import agent_pb2_grpc  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.fakes.nvml import FakeNvml, h200  # noqa: E402
from tests.helpers import AnalyzerServer, fake_agent  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args()
    port = free_port()
    job = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "tests" / "jobs" / "jax_job.py"),
                            "--port", str(port), "--seconds", "600"], stdout=subprocess.PIPE, text=True)
    job.stdout.readline()
    tmp = Path(tempfile.mkdtemp())
    srv = AnalyzerServer(tmp / "a.duckdb")
    agent = fake_agent(FakeNvml([h200(processes=[(job.pid, 1 << 30)])]), srv.target)
    agent.captures = CaptureRunner(CaptureConfig(tmp / "captures"), "bench")
    agent.discovery = JobDiscovery(lambda a: XlaProfilerClient(a).probe())
    agent.capture_reporter = lambda rec, data: clients.report_capture(srv.target, capture_pb(rec), data)
    server, aport, health = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, srv.target), "gpuscope.v1.Agent")])
    server.start()
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu", results={})
    try:
        time.sleep(1)
        for duration in (500, 1000, 2000):
            direct, via_agent = [], []
            for i in range(ns.repeats):
                t0 = time.perf_counter()
                XlaProfilerClient(f"127.0.0.1:{port}").capture(duration, tmp / f"d{duration}-{i}", "s")
                direct.append(time.perf_counter() - t0 - duration / 1e3)
                t0 = time.perf_counter()
                rec, _ = clients.capture(f"127.0.0.1:{aport}", None, job.pid, duration)
                via_agent.append(time.perf_counter() - t0 - duration / 1e3)
                assert rec["status"] == "ok", rec
            out["results"][f"{duration}ms"] = dict(
                client_overhead_s_median=round(statistics.median(direct), 3),
                agent_overhead_s_median=round(statistics.median(via_agent), 3),
                agent_overhead_s_max=round(max(via_agent), 3))
    finally:
        agent.stop()
        shutdown(server, health)
        srv.stop()
        job.kill()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
