"""`gpuscope degraded` over real gRPC: two hosts of H200s pushed to an
analyzer, one GPU holding a lower clock at its power limit, one card
trained at x8 in an x16 slot and one whose link ran at Gen4 while busy;
the rest within noise of each other, some never seen busy."""
import json
import subprocess
import sys
import threading
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
GEN4_LINK = ("h1", 2)          # Gen4 while busy in a Gen5 GPU


def _devices(host: str, gpus: int = 8) -> list[DeviceInfo]:
    # h2's agent never saw its GPUs busy: no busy link, nothing said of their generation
    return [DeviceInfo(gpu=g, uuid=f"GPU-{host}-{g}", name="NVIDIA H200", pcie_generation=1,
                       pcie_width=8 if (host, g) == NARROW_LINK else 16, pcie_max_generation=5, pcie_max_width=16,
                       pcie_busy_generation=(4 if (host, g) == GEN4_LINK else 5) if host == "h1" else None,
                       pcie_busy_width=16 if host == "h1" else None, driver_version="570.124.06")
            for g in range(gpus)]


def _batch(host: str, rng: np.random.Generator, gpus: int = 8) -> pb.SampleBatch:
    now = time.time()
    samples = []
    for gpu in range(gpus):
        clock = 1.60e9 if (host, gpu) == SLOW_CLOCK else 1.98e9 * (1 + rng.normal(0, 0.005))
        samples += [GpuSample(gpu, now - 60 + i, {"sm_clock_hertz": clock, "power_watts": 690.0,
                                                  "power_limit_watts": 700.0, "util_gpu_ratio": 1.0})
                    for i in range(40)]
    return encode_batch(host, "boot", 1, samples, _devices(host, gpus))


def _push_fleet(target: str, rng: np.random.Generator) -> None:
    with grpc.insecure_channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        for host in ("h1", "h2"):
            assert stub.Push(_batch(host, rng)).status == pb.BatchAck.COMMITTED


@pytest.mark.parametrize("engine", [False, True], ids=["thread", "process"])
def test_degraded_names_the_slow_clock_and_the_narrow_link_and_nothing_else(tmp_path, engine):
    srv = AnalyzerServer(tmp_path / "d.duckdb", engine=engine)
    rng = np.random.default_rng(7)
    try:
        _push_fleet(srv.target, rng)
        wait_for(lambda: len(clients.degraded(srv.target)) == 3, timeout=20)
        found = {(r["host"], r["gpu"]): r for r in clients.degraded(srv.target)}
        assert set(found) == {SLOW_CLOCK, NARROW_LINK, GEN4_LINK}
        clock = found[SLOW_CLOCK]
        assert clock["dimension"] == "clocks" and clock["peers"] == 16 and clock["z"] < -3.5
        assert clock["shortfall"] == pytest.approx(1 - 1.60 / 1.98, abs=0.01)
        assert "SM clock at the power limit" in clock["summary"]
        assert "16 peers (NVIDIA H200, driver 570.124.06)" in clock["summary"]
        link = found[NARROW_LINK]
        # never seen busy: its Gen1 at start-up is a resting link, not judged; its width is
        assert link["link"] == dict(pcie_generation=None, pcie_width=8, pcie_max_generation=5, pcie_max_width=16)
        assert link["peers"] is None and link["value"] is None and link["driver"] == "570.124.06"
        assert link["dimension"] == "pcie" and "PCIe ×8, the device supports Gen5 ×16" in link["summary"]
        gen4 = found[GEN4_LINK]
        assert gen4["link"] == dict(pcie_generation=4, pcie_width=16, pcie_max_generation=5, pcie_max_width=16)
        assert "PCIe Gen4 ×16, the device supports Gen5 ×16" in gen4["summary"]
        # samples older than the span asked for give no clock figure; the link needs none
        old = clients.degraded(srv.target, start=time.time() - 30, end=time.time())
        assert [(r["host"], r["gpu"]) for r in old] == [GEN4_LINK, NARROW_LINK]
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
        assert set(found) == {SLOW_CLOCK + ("clocks",), NARROW_LINK + ("pcie",), WEAK_HBM + ("hbm",),
                              GEN4_LINK + ("pcie",)}
        assert "HBM 3.50 TB/s, 18 % under the median" in found[WEAK_HBM + ("hbm",)]["summary"]
        cli = [sys.executable, "-m", "gpuscope.daemon.cli", "degraded", "--server", srv.target, "--insecure"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "h1 gpu 5  clocks" in out.stdout and "h2 gpu 3  pcie" in out.stdout, out
        out = subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=60)
        assert {(r["host"], r["gpu"]) for r in json.loads(out.stdout)} == {SLOW_CLOCK, NARROW_LINK, WEAK_HBM,
                                                                            GEN4_LINK}
    finally:
        srv.stop()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", *args, "--insecure"], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("engine", [False, True], ids=["thread", "process"])
def test_fleet_checks_open_degraded_findings_show_them_and_close_them_when_the_gpu_recovers(tmp_path, engine):
    """The analyzer's own schedule, not a request: degraded GPUs become
    findings of kind `degraded` in findings, top, watch and report, and a
    finding ends at the last check that found it once the GPU is back
    among its peers."""
    srv = AnalyzerServer(tmp_path / "d.duckdb", engine=engine, fleet_check_s=1.0)
    rng = np.random.default_rng(11)
    events: list[dict] = []
    try:
        watching = threading.Event()

        def watch() -> None:
            try:
                events.extend(clients.watch(srv.target, verdicts=["degraded"], on_open=watching.set))
            except clients.ConnectionLost:      # the server stops at the end of the test
                pass
        threading.Thread(target=watch, daemon=True).start()
        assert watching.wait(10)
        _push_fleet(srv.target, rng)
        opened = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(
            clients.findings(srv.target, kinds=["degraded"], open_only=True)), timeout=30)
        by_gpu = {(f["host"], f["gpu"]): f for f in opened}
        assert set(by_gpu) == {SLOW_CLOCK, NARROW_LINK, GEN4_LINK}
        clock = by_gpu[SLOW_CLOCK]
        assert clock["kind"] == "degraded" and clock["verdict"] == "degraded" and clock["flags"] == ["clocks"]
        assert clock["evidence"]["sm_clock_at_power_hertz"] == pytest.approx(1.60e9)
        assert clock["evidence"]["peers"] == 16 and clock["evidence"]["robust_z"] < -3.5
        assert 0.5 <= clock["confidence"] <= 1.0 and clock["decided_by"] == "fleet check"
        assert "SM clock at the power limit" in clock["summary"]
        link = by_gpu[NARROW_LINK]
        assert link["flags"] == ["pcie"] and link["confidence"] == 1.0
        assert link["evidence"] == {"pcie_width": 8.0, "pcie_max_generation": 5.0, "pcie_max_width": 16.0}
        assert by_gpu[GEN4_LINK]["evidence"]["pcie_generation"] == 4.0
        # the GPUs' busy windows are bottleneck findings of their own; kinds and verdicts keep them apart
        bottlenecks = clients.findings(srv.target, kinds=["bottleneck"])
        assert bottlenecks and {(f["kind"], f["verdict"]) for f in bottlenecks} == {("bottleneck", "launch-bound")}
        assert {f["id"] for f in clients.findings(srv.target, verdicts=["degraded"])} == {f["id"] for f in opened}
        # checks go on finding them: one finding each, counting checks, not one per check
        wait_for(lambda: all(f["windows"] >= 3 for f in clients.findings(srv.target, kinds=["degraded"])),
                 timeout=30)
        assert len(clients.findings(srv.target, kinds=["degraded"])) == 3
        out = _run("findings", "--server", srv.target, "--kind", "degraded")
        assert out.returncode == 0 and "h1/gpu5 degraded" in out.stdout and "found by" in out.stdout, out
        assert "peers: NVIDIA H200, driver 570.124.06" in out.stdout
        top = clients.top(srv.target)
        assert {(f["host"], f["gpu"]) for f in top["conditions"]} == {SLOW_CLOCK, NARROW_LINK, GEN4_LINK}
        out = _run("top", "--server", srv.target)
        assert out.returncode == 0 and "open now, not bottlenecks" in out.stdout and "clocks" in out.stdout, out
        rep = clients.report(srv.target, clock["id"])
        assert any("PERFORMANCE,TEMPERATURE" in t for t in rep["what_to_try"])
        # the GPU recovers: an hour of its samples now holds the clock its peers hold
        now = time.time()
        recovered = [GpuSample(5, now - 30 + i * 0.1, {"sm_clock_hertz": 1.98e9, "power_watts": 690.0,
                                                       "power_limit_watts": 700.0}) for i in range(200)]
        with grpc.insecure_channel(srv.target) as ch:
            ack = analyzer_pb2_grpc.AnalyzerStub(ch).Push(encode_batch("h1", "boot", 2, recovered, _devices("h1")))
            assert ack.status == pb.BatchAck.COMMITTED
        closed = wait_for(lambda: [f for f in clients.findings(srv.target, kinds=["degraded"])
                                   if f["end"] is not None], timeout=30)
        assert [(f["host"], f["gpu"]) for f in closed] == [SLOW_CLOCK]
        f = closed[0]
        assert "ended: no longer under its peers (2 checks in a row)" in f["summary"]
        assert f["start"] <= f["end"] < time.time() - 0.5      # at the last check that found it, not at closing
        assert {(x["host"], x["gpu"]) for x in clients.findings(srv.target, kinds=["degraded"], open_only=True)} \
            == {NARROW_LINK, GEN4_LINK}
        wait_for(lambda: len(events) >= 3, timeout=10)
        said = [(e["host"], e["gpu"], e["record"]["end"] is None) for e in events]
        assert said.count(("h1", 5, True)) == 1 and said.count(("h1", 5, False)) == 1 and ("h2", 3, True) in said
    finally:
        srv.stop()


def test_degraded_findings_resume_after_a_restart(tmp_path):
    """An analyzer restarted over its DB keeps one finding per condition: the
    open one is found again, not opened anew."""
    db = tmp_path / "d.duckdb"
    rng = np.random.default_rng(3)
    srv = AnalyzerServer(db, fleet_check_s=0)
    try:
        _push_fleet(srv.target, rng)
        wait_for(lambda: len(clients.degraded(srv.target)) == 3, timeout=20)
        assert srv.analyzer.run_fleet_checks().result(timeout=30)["degraded"] == 3
        first = {f["id"] for f in clients.findings(srv.target, kinds=["degraded"])}
    finally:
        srv.stop()
    srv = AnalyzerServer(db, fleet_check_s=0)
    try:
        assert srv.analyzer.run_fleet_checks().result(timeout=30)["degraded"] == 3
        again = clients.findings(srv.target, kinds=["degraded"])
        assert {f["id"] for f in again} == first and all(f["windows"] == 2 for f in again)
    finally:
        srv.stop()


def test_a_four_gpu_box_says_it_was_not_judged(tmp_path):
    """Found in a trial: 4 GPUs, fewer than the 8 peers a comparison needs,
    read "no degraded GPU" though none was compared."""
    srv = AnalyzerServer(tmp_path / "d.duckdb")
    try:
        with grpc.insecure_channel(srv.target) as ch:
            assert analyzer_pb2_grpc.AnalyzerStub(ch).Push(_batch("h3", np.random.default_rng(1), gpus=4)).status \
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
