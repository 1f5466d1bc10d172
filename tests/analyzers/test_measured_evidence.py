"""Counter evidence against the GPU's own measured ceiling: NVML's DRAM
ratio is of the datasheet's 4.8 TB/s, which no H200 reaches; a calibrated
GPU's memory-bound finding says how near it runs to what it can do."""
import time

import grpc

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.security.tls import ClientSecurity
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer, calibration_record, wait_for

DEVICES = [DeviceInfo(gpu=g, uuid=f"GPU-m-{g}", name="NVIDIA H200", pcie_generation=5, pcie_width=16,
                      driver_version="570.124.06") for g in range(2)]


def _push(target: str, seq: int, t0: float) -> None:
    decode = {"util_gpu_ratio": 1.0, "gpm_sm_util_ratio": 0.9, "gpm_tensor_util_ratio": 0.05,
              "gpm_dram_bw_util_ratio": 0.8}
    samples = [GpuSample(g, t0 + i * 0.1, decode) for g in range(2) for i in range(60)]
    with grpc.insecure_channel(target) as ch:
        ack = analyzer_pb2_grpc.AnalyzerStub(ch).Push(encode_batch("m1", "boot", seq, samples, DEVICES))
        assert ack.status == pb.BatchAck.COMMITTED


def _memory_bound(target: str, gpu: int) -> dict | None:
    rows = [f for f in clients.findings(target, verdicts=["memory-bound"]) if f["gpu"] == gpu]
    return rows[0] if rows else None


def test_a_calibrated_gpu_s_dram_is_told_against_its_measured_ceiling_and_an_uncalibrated_one_s_is_not(tmp_path):
    db = tmp_path / "m.duckdb"
    srv = AnalyzerServer(db, fleet_check_s=0)
    try:
        clients.report_calibration(srv.target, "m1", calibration_record(uuid="GPU-m-0", hbm=4.2e12),
                                   security=ClientSecurity(insecure=True))
        _push(srv.target, 1, time.time() - 20)
        f = wait_for(lambda: _memory_bound(srv.target, 0), timeout=20)
        assert "DRAM bandwidth 80 % of peak (91 % of this GPU's measured 4.20 TB/s)" in f["summary"]
        assert abs(f["evidence"]["dram_measured_util_ratio"] - 0.8 * 4.8 / 4.2) < 1e-3
        assert f["evidence"]["hbm_measured_bytes_per_second"] == 4.2e12
        other = wait_for(lambda: _memory_bound(srv.target, 1), timeout=20)
        assert "measured" not in other["summary"] and "dram_measured_util_ratio" not in other["evidence"]
    finally:
        srv.stop()
    # a restarted analyzer knows the ceiling from its store
    srv = AnalyzerServer(db, fleet_check_s=0)
    try:
        assert srv.analyzer.live.hbm_measured == {"GPU-m-0": 4.2e12}
    finally:
        srv.stop()
