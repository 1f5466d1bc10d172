"""Agent -> real gRPC over loopback -> analyzer -> real DuckDB file, with a
fake NVML as the only stand-in."""
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.daemon.uplink import Uplink, UplinkConfig
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.conftest import free_port
from tests.fakes.nvml import FakeNvml, h200, older_gpu
from tests.helpers import AnalyzerServer, fake_agent, wait_for

COMPUTE = dict(util_gpu=95, util_mem=23, gpm_values={2: 91.0, 3: 14.0, 5: 89.0, 10: 17.0, 12: 1.0, 13: 0.0, 20: 7.0, 21: 16.0})
IDLE = dict(util_gpu=0, util_mem=0, gpm_values={2: 0.0, 3: 0.0, 5: 0.0, 10: 0.0, 12: 0.0, 13: 0.0, 20: 2.0, 21: 1.0})


def _set(gpu, spec):
    for k, v in spec.items():
        setattr(gpu, k, dict(v) if isinstance(v, dict) else v)


@pytest.fixture
def analyzer(tmp_path):
    srv = AnalyzerServer(tmp_path / "a.duckdb")
    yield srv
    srv.stop()


def test_bottleneck_opens_and_closes_a_finding_queryable_over_grpc(analyzer):
    fake = FakeNvml([h200(**IDLE), older_gpu()])
    agent = fake_agent(fake, analyzer.target)
    try:
        wait_for(lambda: analyzer.analyzer.writer.samples > 10)
        _set(fake.gpus[0], COMPUTE)
        found = wait_for(lambda: [f for f in clients.findings(analyzer.target, host="host-a", gpu=0, open_only=True)
                                  if f["windows"] >= 3])
        assert found[0]["verdict"] == "compute-bound" and found[0]["end"] is None
        # evidence is the mean over the episode's windows; the first one may straddle the onset
        assert found[0]["evidence"]["tensor_util_ratio"] > 0.5
        _set(fake.gpus[0], IDLE)
        closed = wait_for(lambda: [f for f in clients.findings(analyzer.target, gpu=0, verdicts=["compute-bound"])
                                   if f["end"] is not None])
        assert closed[0]["end"] > closed[0]["start"] and closed[0]["windows"] >= 1
        st = clients.status(analyzer.target)
        assert st["kind"] == "analyzer" and {g["gpu"] for g in st["gpus"]} == {0, 1}
        q = clients.query(analyzer.target, "util_gpu_ratio", "host-a", 0, time.time() - 60, time.time(), "max", 0)
        assert q["unit"] == "ratio" and q["series"][0]["value"] == pytest.approx(0.95)
    finally:
        agent.stop()


def test_analyzer_restart_loses_nothing_and_stores_nothing_twice(tmp_path):
    port = free_port()
    srv = AnalyzerServer(tmp_path / "r.duckdb", port=port)
    fake = FakeNvml([h200(**COMPUTE), h200(**IDLE)])
    agent = fake_agent(fake, srv.target)
    wait_for(lambda: srv.analyzer.writer.samples > 20)
    srv.stop()                                 # analyzer goes away; the agent keeps sampling
    before = agent.samples
    wait_for(lambda: agent.samples > before + 20)
    assert agent.uplink.buffered > 0
    srv = AnalyzerServer(tmp_path / "r.duckdb", port=port)
    try:
        wait_for(lambda: agent.uplink.stats()["connected"] and agent.uplink.buffered < 4, timeout=20)
        agent.stop()
        wait_for(lambda: srv.analyzer.store.count("samples") == agent.samples)
        st = agent.uplink.stats()
        assert st["dropped_samples"] == 0 and st["unacked_samples"] == 0
        dup = srv.analyzer.store.reader().execute(
            "SELECT count(*) FROM (SELECT host, gpu, t FROM samples GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
        assert dup == 0
    finally:
        srv.stop()


def _one_batch(seq=1, power=300.0):
    s = [GpuSample(0, time.time() - 1, {"util_gpu_ratio": 0.5, "power_watts": power})]
    return encode_batch("host-p", "boot-1", seq, s, [DeviceInfo(gpu=0, name="NVIDIA H200")])


def test_push_dedupes_by_host_boot_and_seq(analyzer):
    with grpc.insecure_channel(analyzer.target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        assert stub.Push(_one_batch(1)).status == pb.BatchAck.COMMITTED
        assert stub.Push(_one_batch(1)).status == pb.BatchAck.DUPLICATE
        assert stub.Push(_one_batch(2)).status == pb.BatchAck.COMMITTED
    assert analyzer.analyzer.store.count("samples") == 2


def test_invalid_batch_is_invalid_argument_naming_the_field_and_nothing_is_lost(analyzer):
    with grpc.insecure_channel(analyzer.target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        stub.Push(_one_batch(1))
        with pytest.raises(grpc.RpcError) as err:
            stub.Push(_one_batch(2, power=-1.0))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "seq=2" in err.value.details() and "power_watts" in err.value.details()
        assert stub.Push(_one_batch(3)).status == pb.BatchAck.COMMITTED
    assert analyzer.analyzer.store.count("samples") == 2


def test_streaming_agent_drops_a_rejected_batch_and_goes_on(analyzer):
    up = Uplink(UplinkConfig(target=analyzer.target, flush_interval_s=0.05, backoff_initial_s=0.05),
                "host-s", "boot-s", lambda: [DeviceInfo(gpu=0)])
    up.start()
    try:
        t = time.time() - 5
        up.submit([GpuSample(0, t, {"power_watts": 100.0})])
        wait_for(lambda: up.stats()["batches_acked"] == 1)
        up.submit([GpuSample(0, t + 1, {"power_watts": -100.0})])
        wait_for(lambda: up.stats()["batches_rejected"] == 1)
        up.submit([GpuSample(0, t + 2, {"power_watts": 120.0})])
        wait_for(lambda: up.stats()["batches_acked"] == 2)
        assert "power_watts" in up.stats()["last_error"]
    finally:
        up.stop()
    assert analyzer.analyzer.store.count("samples") == 2


def test_buffer_is_bounded_and_drops_are_counted():
    up = Uplink(UplinkConfig(target=f"127.0.0.1:{free_port()}", buffer_samples=100, flush_interval_s=0.05,
                             backoff_initial_s=0.05), "h", "b", lambda: [DeviceInfo(gpu=0)])
    up.start()
    try:
        for i in range(25):
            up.submit([GpuSample(0, 1e9 + i * 10 + k, {"power_watts": 1.0}) for k in range(10)])
            time.sleep(0.01)
            assert up.buffered <= 100
        # the oldest whole batch goes first, so fewer than 100 may stay when flushes are slow and batches
        # large (a busy machine: 60 left); every sample is still either buffered or counted as dropped
        assert 0 < up.buffered <= 100
        assert up.buffered + up.stats()["dropped_samples"] == 250
    finally:
        up.stop(drain_s=0)


def test_health_service_and_agent_api(tmp_path):
    from gpuscope.daemon.serve import build_server, shutdown
    from gpuscope.daemon.service import AgentServicer
    from gpuscope.v1 import agent_pb2, agent_pb2_grpc
    srv = AnalyzerServer(tmp_path / "h.duckdb")
    fake = FakeNvml([h200(**COMPUTE)])
    agent = fake_agent(fake, srv.target)
    server, port, health = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, srv.target), "gpuscope.v1.Agent")])
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="gpuscope.v1.Agent"))
            assert h.status == health_pb2.HealthCheckResponse.SERVING
            wait_for(lambda: agent.samples >= 5)
            recent = agent_pb2_grpc.AgentStub(ch).RecentSamples(agent_pb2.RecentSamplesRequest(seconds=60))
            assert recent.count >= 5 and np.frombuffer(recent.t_f64le, "<f8")[-1] <= time.time()
            assert agent_pb2_grpc.AgentStub(ch).RecentSamples(agent_pb2.RecentSamplesRequest(gpu=0)).count >= 5
            for bad, said in ((dict(seconds=float("nan")), "seconds: nan"), (dict(seconds=-5), "seconds: -5"),
                              (dict(gpu=4294967295), "gpu: 4294967295; this host's GPUs are 0")):
                with pytest.raises(grpc.RpcError) as refused:        # found in a trial: all three answered OK
                    agent_pb2_grpc.AgentStub(ch).RecentSamples(agent_pb2.RecentSamplesRequest(**bad))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and said in refused.value.details()
        st = clients.status(f"127.0.0.1:{port}")
        assert st["kind"] == "agent" and st["devices"][0]["name"] == "NVIDIA H200"
        wait_for(lambda: clients.status(f"127.0.0.1:{port}")["uplink_connected"])
    finally:
        agent.stop()
        shutdown(server, health)
        srv.stop()


def test_gpu_lost_mid_run_is_recorded_and_other_gpus_continue(analyzer):
    fake = FakeNvml([h200(**IDLE), h200(**IDLE)])
    agent = fake_agent(fake, analyzer.target)
    try:
        wait_for(lambda: analyzer.analyzer.writer.samples > 4)
        fake.gpus[1].lost = True
        wait_for(lambda: analyzer.analyzer.store.count("health") == 1)
        n0 = analyzer.analyzer.store.reader().execute("SELECT count(*) FROM samples WHERE gpu = 0").fetchone()[0]
        wait_for(lambda: analyzer.analyzer.store.reader().execute(
            "SELECT count(*) FROM samples WHERE gpu = 0").fetchone()[0] > n0 + 5)
        kind, = analyzer.analyzer.store.reader().execute("SELECT kind FROM health").fetchone()
        assert kind == "gpu_lost"
        st = clients.status(analyzer.target)
        assert [g["lost"] for g in sorted(st["gpus"], key=lambda g: g.get("gpu", 0))] == [False, True]
    finally:
        agent.stop()
