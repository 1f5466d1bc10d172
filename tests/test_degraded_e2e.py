"""`gpuscope degraded` over real gRPC: two hosts of H200s pushed to an
analyzer, one GPU holding a lower clock at its power limit and one card
trained at x8 in an x16 slot; the rest within noise of each other."""
import json
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from gpuscope.security.tls import ClientSecurity
from tests.helpers import AnalyzerServer, calibration_record, wait_for

SLOW_CLOCK = ("h1", 5)         # 1.60 GHz at the limit against ~1.98 GHz
NARROW_LINK = ("h2", 3)        # x8 of x16
WEAK_HBM = ("h2", 6)           # calibrated at 3.5 TB/s against ~4.3 TB/s


def _batch(host: str, rng: np.random.Generator, gpus: int = 8) -> pb.SampleBatch:
    now = time.time()
    samples = []
    for gpu in range(gpus):
        clock = 1.60e9 if (host, gpu) == SLOW_CLOCK else 1.98e9 * (1 + rng.normal(0, 0.005))
        samples += [GpuSample(gpu, now - 60 + i, {"sm_clock_hertz": clock, "power_watts": 690.0,
                                                  "power_limit_watts": 700.0, "util_gpu_ratio": 1.0})
                    for i in range(40)]
    devices = [DeviceInfo(gpu=g, uuid=f"GPU-{host}-{g}", name="NVIDIA H200", pcie_generation=5,
                          pcie_width=8 if (host, g) == NARROW_LINK else 16, pcie_max_generation=5, pcie_max_width=16,
                          driver_version="570.124.06")
               for g in range(gpus)]
    return encode_batch(host, "boot", 1, samples, devices)


@pytest.mark.parametrize("engine", [False, True], ids=["thread", "process"])
def test_degraded_names_the_slow_clock_and_the_narrow_link_and_nothing_else(tmp_path, engine):
    srv = AnalyzerServer(tmp_path / "d.duckdb", engine=engine)
    rng = np.random.default_rng(7)
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            for host in ("h1", "h2"):
                assert stub.Push(_batch(host, rng)).status == pb.BatchAck.COMMITTED
        wait_for(lambda: len(clients.degraded(srv.target)) == 2, timeout=20)
        found = {(r["host"], r["gpu"]): r for r in clients.degraded(srv.target)}
        assert set(found) == {SLOW_CLOCK, NARROW_LINK}
        clock = found[SLOW_CLOCK]
        assert clock["dimension"] == "clocks" and clock["peers"] == 16 and clock["z"] < -3.5
        assert clock["shortfall"] == pytest.approx(1 - 1.60 / 1.98, abs=0.01)
        assert "SM clock at the power limit" in clock["summary"]
        assert "16 peers (NVIDIA H200, driver 570.124.06)" in clock["summary"]
        link = found[NARROW_LINK]
        # widths only: the generation the agent read once may be an idle link's Gen1
        assert link["link"] == dict(pcie_generation=None, pcie_width=8, pcie_max_generation=None, pcie_max_width=16)
        assert link["peers"] is None and link["value"] is None and link["driver"] == "570.124.06"
        assert link["dimension"] == "pcie" and "PCIe ×8, the device supports ×16" in link["summary"]
        # samples older than the span asked for give no clock figure; the link needs none
        old = clients.degraded(srv.target, start=time.time() - 30, end=time.time())
        assert [(r["host"], r["gpu"]) for r in old] == [NARROW_LINK]
        # a host not heard from since the span began is no one's peer, and not listed
        assert clients.degraded(srv.target, start=time.time() + 1, end=time.time() + 2) == []
        with pytest.raises(clients.ClientError, match="start"):
            clients.degraded(srv.target, start=float("nan"))
        # calibrations: each GPU's measured HBM; one GPU's well under the others'
        plain = ClientSecurity(insecure=True)
        for host in ("h1", "h2"):
            for g in range(8):
                hbm = 3.5e12 if (host, g) == WEAK_HBM else 4.3e12 * (1 + rng.normal(0, 0.01))
                clients.report_calibration(srv.target, host, calibration_record(uuid=f"GPU-{host}-{g}", index=g,
                                                                                hbm=hbm), security=plain)
        found = {(r["host"], r["gpu"], r["dimension"]): r for r in clients.degraded(srv.target)}
        assert set(found) == {SLOW_CLOCK + ("clocks",), NARROW_LINK + ("pcie",), WEAK_HBM + ("hbm",)}
        assert "HBM 3.50 TB/s, 18 % under the median" in found[WEAK_HBM + ("hbm",)]["summary"]
        cli = [sys.executable, "-m", "gpuscope.daemon.cli", "degraded", "--server", srv.target, "--insecure"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "h1 gpu 5  clocks" in out.stdout and "h2 gpu 3  pcie" in out.stdout, out
        out = subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=60)
        assert {(r["host"], r["gpu"]) for r in json.loads(out.stdout)} == {SLOW_CLOCK, NARROW_LINK, WEAK_HBM}
    finally:
        srv.stop()


def test_a_four_gpu_box_says_it_was_not_judged(tmp_path):
    """Found in a trial: 4 GPUs, fewer than the 8 peers a comparison needs,
    read "no degraded GPU" though none was compared."""
    srv = AnalyzerServer(tmp_path / "d.duckdb")
    try:
        with grpc.insecure_channel(srv.target) as ch:
            assert analyzer_pb2_grpc.AnalyzerStub(ch).Push(_batch("h1", np.random.default_rng(1), gpus=4)).status \
                == pb.BatchAck.COMMITTED
        unjudged = dict(kind="unjudged", model="NVIDIA H200", driver="570.124.06", dimension="clocks", gpus=4,
                        min_peers=8)
        wait_for(lambda: clients.degraded(srv.target) == [unjudged], timeout=20)
        cli = [sys.executable, "-m", "gpuscope.daemon.cli", "degraded", "--server", srv.target, "--insecure"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.splitlines() == [
            "no degraded GPU among the groups judged (docs/degraded.md); the others were not compared:",
            "not judged: 4 NVIDIA H200 GPUs (driver 570.124.06) for clocks: fewer than 8 peers"], out
        out = subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=60)
        assert json.loads(out.stdout) == [unjudged]
    finally:
        srv.stop()
