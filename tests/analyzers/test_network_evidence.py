"""Communication-bound evidence names the network port a GPU's traffic
takes and its utilisation against its line rate: samples pushed over gRPC
as an agent's network sampler adds them (rows of their own beside the
GPU's), judged by the live rules."""
import time

import grpc

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer, wait_for


def test_a_gpu_waiting_on_a_saturated_port_is_communication_bound_and_the_port_is_named(tmp_path):
    srv = AnalyzerServer(tmp_path / "n.duckdb", fleet_check_s=0)
    try:
        t0 = time.time() - 20
        gpu = [GpuSample(0, t0 + i * 0.1, {"util_gpu_ratio": 0.3, "gpm_sm_util_ratio": 0.1,
                                           "gpm_pcie_tx_bytes_per_second": 2e8, "gpm_pcie_rx_bytes_per_second": 2e8})
               for i in range(60)]
        port = [GpuSample(0, t0 + i, {"nic_tx_bytes_per_second": 45e9, "nic_rx_bytes_per_second": 10e9,
                                      "nic_link_util_ratio": 0.9, "nic_congestion_per_second": 1200.0})
                for i in range(6)]
        with grpc.insecure_channel(srv.target) as ch:
            ack = analyzer_pb2_grpc.AnalyzerStub(ch).Push(encode_batch(
                "n1", "boot", 1, gpu + port, [DeviceInfo(gpu=0, uuid="GPU-n", name="NVIDIA H200")]))
            assert ack.status == pb.BatchAck.COMMITTED
        f = wait_for(lambda: next(iter(clients.findings(srv.target, verdicts=["communication-bound"])), None),
                     timeout=20)
        assert "its network port 55.0 GB/s = 90 % of its line rate, 1,200 congestion notifications/s" in f["summary"]
        assert f["evidence"]["nic_link_util_ratio"] == 0.9
    finally:
        srv.stop()


def test_one_nvlink_link_near_its_peak_is_named(tmp_path):
    srv = AnalyzerServer(tmp_path / "l.duckdb", fleet_check_s=0)
    try:
        t0 = time.time() - 20
        gpu = [GpuSample(0, t0 + i * 0.1, {"util_gpu_ratio": 0.9, "gpm_sm_util_ratio": 0.6,
                                           "gpm_nvlink_tx_bytes_per_second": 30e9,
                                           "gpm_nvlink_rx_bytes_per_second": 2e9}) for i in range(60)]
        links = [GpuSample(0, t0 + i, {"nvlink_link_max_util_ratio": 0.85, "nvlink_links_active": 18.0})
                 for i in range(0, 6, 2)]
        with grpc.insecure_channel(srv.target) as ch:
            ack = analyzer_pb2_grpc.AnalyzerStub(ch).Push(encode_batch(
                "l1", "boot", 1, gpu + links, [DeviceInfo(gpu=0, uuid="GPU-l", name="NVIDIA H200")]))
            assert ack.status == pb.BatchAck.COMMITTED
        f = wait_for(lambda: next(iter(clients.findings(srv.target, verdicts=["communication-bound"])), None),
                     timeout=20)
        assert "NVLink 32.0 GB/s (busiest link 85 % of its peak)" in f["summary"]
    finally:
        srv.stop()
