"""Program regressions over real gRPC: four hosts ran one training job
(their agents listed its process on GPU 0), each traced once with
jax.profiler; the run on h9 waits on its host every step. The fleet check
makes the runs, matches each capture's HLO to its run, and opens a
regression finding for h9 only, which `findings --kind regression`,
`gpuscope programs` and a reader's view show."""
import json
import subprocess
import sys
import time

import grpc
import pytest

from gpuscope.analyzers.programs import ProgramsConfig
from gpuscope.collectors.records import DeviceInfo, GpuSample, ProcessRecord
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer
from tests.jax_jobs import traced_job

COMMAND = "python3 /srv/jobs/run-{n}/train.py --model mlp --seed {n} --output-dir /ckpt/{n} --hf-token=abc123"
HOSTS = ("h1", "h2", "h3", "h9")


def _push(stub, host: str, n: int, t0: float, dram: float) -> None:
    proc = ProcessRecord(pid=4000 + n, used_memory_bytes=1 << 30, command=COMMAND.format(n=n))
    samples = [GpuSample(0, t0 + i, {"util_gpu_ratio": 1.0, "gpm_sm_util_ratio": 0.9,
                                     "gpm_dram_bw_util_ratio": dram, "power_watts": 500.0}, (proc,))
               for i in range(40)]
    devices = [DeviceInfo(gpu=0, uuid=f"GPU-{host}", name="NVIDIA H200", driver_version="570.124.06")]
    assert stub.Push(encode_batch(host, "boot", 1, samples, devices)).status == pb.BatchAck.COMMITTED


def _capture(target: str, host: str, n: int, t0: float, xspace: bytes) -> None:
    record = pb.CaptureRecord(id=f"cap-{host}", host=host, pid=4000 + n, gpus=[0], job=f"pid:{4000 + n} x",
                              start=t0 + 10, end=t0 + 11, duration_ms=1000, status="ok", kind="jax",
                              trigger="on-call", size_bytes=len(xspace))
    clients.report_capture(target, record, xspace)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e-jobs")
    return traced_job(tmp, "usual", "same"), traced_job(tmp, "slow", "slow")


def gpuscope(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", *args, "--insecure"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out
    return out.stdout


def test_a_run_slower_than_its_program_s_earlier_runs_is_a_regression_finding(tmp_path, traces):
    usual, slow = traces
    srv = AnalyzerServer(tmp_path / "p.duckdb", fleet_check_s=0,
                         programs=ProgramsConfig(min_run_s=30.0, lag_s=0.0))
    try:
        now = time.time()
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            for n, host in enumerate(HOSTS):
                t0 = now - 400 + n * 90
                _push(stub, host, n, t0, dram=0.55 if host == "h9" else 0.80 + 0.01 * n)
                _capture(srv.target, host, n, t0, slow if host == "h9" else usual)
        srv.analyzer.run_fleet_checks(now).result(timeout=60)

        found = clients.findings(srv.target, kinds=["regression"])
        assert [(f["host"], f["gpu"], f["verdict"]) for f in found] == [("h9", 0, "regression")]
        f = found[0]
        assert f["flags"] == ["slower-step", "lower-activity"]
        assert f["summary"].startswith("jit_train_step (same HLO as 3 earlier runs) is ")
        assert "slower on h9: " in f["summary"] and "DRAM activity 55 % vs baseline 81 %" in f["summary"]
        assert f["evidence"]["step_ratio"] > 1.15
        assert "abc123" not in json.dumps(f)

        (program,) = json.loads(gpuscope("programs", "--server", srv.target, "--json"))["programs"]
        assert (program["kind"], program["name"], program["runs"], program["hosts"]) == ("hlo", "jit_train_step", 4, 4)
        assert program["open_regressions"] == 1
        out = gpuscope("programs", program["fingerprint"], "--server", srv.target)
        assert out.splitlines()[0] == f"program {program['fingerprint']} (hlo): jit_train_step, 4 runs"
        assert out.splitlines()[1].startswith("baseline of 3 runs long enough to judge: launch-bound, step ")
        assert [line.split()[0] for line in out.splitlines()[3:]] == ["h9", "h3", "h2", "h1"]
        assert "REGRESSION" in out.splitlines()[3] and "REGRESSION" not in out.splitlines()[4]

        # its report says what to try for each departure
        advice = clients.report(srv.target, f["id"])["what_to_try"]
        assert advice[0].startswith("trace the run now (`gpuscope capture") and len(advice) == 3

        # the run goes on as its baseline's: two checks without the departure close the finding
        srv.analyzer.run_fleet_checks(now + 1).result(timeout=60)
        srv.analyzer.run_fleet_checks(now + 2).result(timeout=60)
        assert clients.findings(srv.target, kinds=["regression"], open_only=True) == []
    finally:
        srv.stop()
