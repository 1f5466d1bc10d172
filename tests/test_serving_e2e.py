"""A GPU that runs a serving engine: the agent scrapes the engine's
/metrics (a real prometheus_client server in vLLM's names), the samples
travel with the GPU's over gRPC, and the finding on that GPU carries the
engine's numbers in its evidence and its words."""
import time

import pytest

from gpuscope.collectors.nvml import NvmlCollector
from gpuscope.collectors.serving_sampler import ServingSampler
from gpuscope.daemon import clients
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.uplink import Uplink, UplinkConfig
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import AnalyzerServer, wait_for
from tests.serving_engines import FakeEngine
from tests.test_end_to_end import COMPUTE


def test_a_serving_gpus_finding_reads_with_its_engines_numbers(tmp_path):
    srv = AnalyzerServer(tmp_path / "s.duckdb", engine=True)
    engine = FakeEngine("vllm-0.32")
    fake = FakeNvml([h200(**COMPUTE), h200()])

    def uplink(boot_id, devices):
        return Uplink(UplinkConfig(target=srv.target, flush_interval_s=0.1, backoff_initial_s=0.1, backoff_max_s=0.5),
                      "host-s", boot_id, devices)
    agent = Agent(AgentConfig(host="host-s", interval_s=0.1, slow_interval_s=1.0, serving_interval_s=1.0),
                  NvmlCollector(nvml=fake), uplink)
    agent.serving = ServingSampler(lambda: [(engine.url, [0])])
    agent.start()
    try:
        deadline = time.monotonic() + 30
        found = None
        while time.monotonic() < deadline and not found:
            engine.load(running=7, waiting=40, kv=0.96, generation=600, prompt=100, requests=3,
                        ttft=[0.05] * 20, itl=[0.015] * 200)
            found = [f for f in clients.findings(srv.target, host="host-s", gpu=0, open_only=True)
                     if "serving_requests_waiting" in f["evidence"] and f["windows"] >= 2]
            time.sleep(0.5)
        assert found, "no finding with serving evidence"
        ev = found[0]["evidence"]
        assert ev["serving_requests_waiting"] == pytest.approx(40) and ev["serving_kv_cache_usage_ratio"] == 0.96
        assert ev["serving_generation_tokens_per_second"] > 0
        assert ev["serving_ttft_p99_seconds"] == pytest.approx(0.0598, abs=1e-3)
        assert found[0]["verdict"] == "compute-bound"          # the engine's numbers do not change the verdict
        assert "serving: 7 running, 40 waiting, KV cache 96 % full" in found[0]["summary"]
        q = clients.query(srv.target, "serving_requests_waiting", "host-s", 0, time.time() - 60, time.time(), "max", 0)
        assert q["unit"] == "count" and q["series"][0]["value"] == 40
        other = clients.query(srv.target, "serving_requests_waiting", "host-s", 1, time.time() - 60, time.time(), "max", 0)
        assert not other["series"] or other["series"][0]["value"] is None      # GPU 1 runs no engine
        assert agent.errors == {}
    finally:
        agent.stop()
        engine.stop()
        srv.stop()
