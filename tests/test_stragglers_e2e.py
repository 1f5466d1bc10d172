"""A straggler over real gRPC: a real four-process jax.distributed job on
the CPU (gloo), one rank held up by host work each step. Its processes are
read through /proc as an agent reads a GPU's processes, which groups them
into one job from their launcher's environment; each rank's counters are
what its measured step says (the share of the step it waited in the
all-gather moves data over NVLink while its SMs idle; the slow rank's host
work leaves its GPU silent while its CPU runs). The fleet check names the
slow rank, on its host and GPU, and the others as waiting for it."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from gpuscope.collectors.attribution import Attributor
from gpuscope.collectors.records import DeviceInfo, GpuSample, ProcessRecord
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer

RANKS, SLOW = 4, 2
HOSTS = ("node-a", "node-a", "node-b", "node-b")      # two ranks per host, one GPU each


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job():
    """The job's ranks: {rank: (pid, attribution read through /proc, wait share of a step)}."""
    port = _free_port()
    script = Path(__file__).parent / "jobs" / "jax_ranks.py"
    procs = []
    for rank in range(RANKS):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_PROCESS_ID=str(rank), JAX_NUM_PROCESSES=str(RANKS), SLOW_RANK=str(SLOW), STEPS="25")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    time.sleep(1.0)
    at = Attributor("/proc")
    attributions = [at.of(p.pid, None, "GPU-x", 0) for p in procs]     # while they run, as an agent reads them
    out = {}
    for rank, p in enumerate(procs):
        stdout, _ = p.communicate(timeout=180)
        steps = json.loads(stdout.strip().splitlines()[-1])["steps"][3:]          # after compilation
        wait = sum(s["wait"] for s in steps) / sum(s["wait"] + s["work"] for s in steps)
        out[rank] = (p.pid, attributions[rank], wait)
    return out


def _samples(rank: int, pid: int, attribution, wait: float, t0: float) -> list[GpuSample]:
    """What the rank's GPU counters read, from its measured step: waiting in the collective moves
    data while the SMs idle; a rank held up by host work leaves its GPU silent and its CPU busy."""
    if rank == SLOW:
        values = {"util_gpu_ratio": 0.005, "gpm_sm_util_ratio": 0.005, "procs_cpu_cores": 1.0 - wait,
                  "gpm_nvlink_tx_bytes_per_second": 1e8 * wait, "gpm_nvlink_rx_bytes_per_second": 1e8 * wait}
    else:
        values = {"util_gpu_ratio": 1.0 - wait / 2, "gpm_sm_util_ratio": 0.9 * (1.0 - wait),
                  "procs_cpu_cores": 0.1, "gpm_nvlink_tx_bytes_per_second": 40e9 * wait,
                  "gpm_nvlink_rx_bytes_per_second": 40e9 * wait}
    values.update(power_watts=300.0, sm_clock_hertz=1.98e9)
    proc = ProcessRecord(pid=pid, used_memory_bytes=1 << 30, cpu_cores=values["procs_cpu_cores"],
                         command="python3 train.py --steps 25", attribution=attribution)
    return [GpuSample(rank % 2, t0 + i, values, (proc,)) for i in range(90)]


def test_the_rank_the_others_wait_for_is_named_with_its_job(tmp_path, job):
    assert {a.dist_job for _, a, _ in job.values()} == {next(iter(job.values()))[1].dist_job}
    waits = {rank: w for rank, (_, _, w) in job.items()}
    assert waits[SLOW] < min(w for r, w in waits.items() if r != SLOW)          # the job measured its straggler
    srv = AnalyzerServer(tmp_path / "s.duckdb", window_s=5.0, fleet_check_s=0)
    try:
        now = time.time()
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            for host in sorted(set(HOSTS)):
                samples = [s for rank, (pid, a, w) in job.items() if HOSTS[rank] == host
                           for s in _samples(rank, pid, a, w, now - 150)]
                devices = [DeviceInfo(gpu=g, uuid=f"GPU-{host}-{g}", name="NVIDIA H200") for g in (0, 1)]
                assert stub.Push(encode_batch(host, "boot", 1, samples, devices)).status == pb.BatchAck.COMMITTED
        time.sleep(1.0)
        srv.analyzer.sweep().result(timeout=30)
        srv.analyzer.run_fleet_checks(now).result(timeout=60)

        found = clients.findings(srv.target, kinds=["straggler"])
        assert [(f["host"], f["gpu"]) for f in found] == [("node-b", 0)]
        f = found[0]
        name = job[SLOW][1].dist_job
        assert f["job"] == f"{name} rank {SLOW}" and f["flags"] == ["host-bound"]
        assert f["summary"].startswith(f"rank {SLOW} of {RANKS} of {name} (4 ranks seen on 2 hosts) is the straggler "
                                       "on node-b: host-bound, while 3 of 4 ranks wait (communication-bound)")
        assert "likely cause: its host keeps its GPU waiting" in f["summary"]

        (listed,) = clients.dist_jobs(srv.target)
        assert (listed["job"], listed["ranks"], listed["world_size"], listed["hosts"]) == (
            name, 4, 4, ["node-a", "node-b"])
        assert [s["host"] for s in listed["stragglers"]] == ["node-b"]
        out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "job", name, "--server", srv.target,
                              "--insecure"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out
        lines = out.stdout.splitlines()
        ranks = [line for line in lines if line.split()[:1] and line.split()[0].isdigit()]
        assert [r.split()[0] for r in ranks] == ["0", "1", "2", "3"]
        assert ranks[SLOW].endswith("STRAGGLER") and not ranks[0].endswith("STRAGGLER")
        report = clients.report(srv.target, f["id"])
        advice = report["what_to_try"]
        assert advice[0].startswith("the rank's host starves its GPU")
        # found in a trial: the advice asked for a capture per pid, and the report showed no decision though
        # the finding had its job traced (here no agent is connected: the decision says so)
        assert f"`gpuscope capture --job {name}`" in advice[1]
        assert [(d["action"], d["status"]) for d in report["decisions"]] == [("capture-job", "failed")]
    finally:
        srv.stop()


def test_a_coordinated_capture_of_every_rank_shows_who_arrives_last(tmp_path):
    """Two agents (two ranks each, their real processes on fake GPUs) and
    the analyzer; `gpuscope capture --job` asks every rank's agent to trace
    the same window with JAX's profiler, and the traces name the slow rank."""
    from gpuscope.analyzers.programs import ProgramsConfig
    from tests.helpers import capturing_agent, wait_for

    port = _free_port()
    script = Path(__file__).parent / "jobs" / "jax_ranks.py"
    procs = []
    for rank in range(RANKS):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_PROCESS_ID=str(rank), JAX_NUM_PROCESSES=str(RANKS), SLOW_RANK=str(SLOW), STEPS="400",
                   GPUSCOPE_PROFILER_PORT=str(_free_port()))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    srv = AnalyzerServer(tmp_path / "c.duckdb", window_s=5.0, fleet_check_s=0, programs=ProgramsConfig(lag_s=0.0))
    agents = []
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for host in sorted(set(HOSTS)):
            pids = [procs[r].pid for r in range(RANKS) if HOSTS[r] == host]
            agents.append(capturing_agent(pids, srv.target, host, tmp_path / host))
        wait_for(lambda: all(srv.analyzer.commands.connected(h) for h in set(HOSTS)), timeout=20)
        wait_for(lambda: srv.analyzer.store.count("processes") >= 8, timeout=20)
        time.sleep(1.0)
        srv.analyzer.run_fleet_checks(time.time()).result(timeout=60)
        (job,) = clients.dist_jobs(srv.target)
        assert job["ranks"] == RANKS

        out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "capture", "--job", job["job"],
                              "--duration-ms", "1500", "--server", srv.target, "--insecure", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out
        result = json.loads(out.stdout)
        assert sorted(c["rank"] for c in result["captures"]) == ["0", "1", "2", "3"]
        assert all(c["status"] == "ok" and c["collectives"] > 5 for c in result["captures"]), result["captures"]
        assert result["collectives"] > 5
        s = result["straggler"]
        # last in over half of the collectives, twice chance (4 ranks): on 2 cores the scheduler sometimes
        # holds another rank back, and 0.75 was seen under CI's load (2026-12-07) where 0.8 was asked
        assert (s["rank"], s["host"]) == (str(SLOW), "node-b") and s["last_share"] > 0.5
        # the others waited for it: about its 50 ms of host work a step
        assert 0.02 < s["arrives_late_by_seconds"] < 0.2
        # the ranks' traces started together (the agents asked JAX's profiler for the same instant): the
        # profile start each trace records, on two agents' clocks
        rows = srv.analyzer.store.captures(limit=10)
        starts = [json.loads(r["summary"])["start_unix"] for r in rows]
        assert max(starts) - min(starts) < 0.1

        # a straggler finding has every rank traced by itself, once per job per cooldown
        f = dict(id="f1", host="node-b", gpu=0, attribution={"dist_job": job["job"]})
        srv.analyzer.writer.call(lambda _s: srv.analyzer._trace_job(f, time.time())).result(timeout=30)
        srv.analyzer.writer.call(lambda _s: srv.analyzer._trace_job(f, time.time())).result(timeout=30)
        decisions = [d for d in clients.records(srv.target, "decisions") if "straggler f1" in d["reason"]]
        assert sorted(d["action"] for d in decisions) == ["capture-job", "skip"]
        group = next(d["capture_id"] for d in decisions if d["action"] == "capture-job")
        traced = wait_for(lambda: (lambda r: r if len(r["captures"]) == RANKS else None)(
            clients.job_skew(srv.target, group)), timeout=60)
        assert traced["straggler"]["rank"] == str(SLOW)
    finally:
        for agent, listener in agents:
            listener.stop()
            agent.stop()
        srv.stop()
        for p in procs:
            p.kill()
            p.wait()
