"""Whose job it is, end to end: an agent sampling a fake NVML whose GPU
processes have a fake /proc (a pod's containerd cgroup; a Slurm step's
cgroup and environ) and a kubelet pod-resources server on a Unix socket,
streaming to a real analyzer; findings are asked for by pod and Slurm job
over real gRPC, and the CLI names the pod and the Slurm job."""
from __future__ import annotations

import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest

from gpuscope.collectors.jobs import JobDiscovery
from gpuscope.daemon import clients
from gpuscope.daemon.serve import build_server, shutdown
from gpuscope.daemon.service import AgentServicer
from gpuscope.v1 import agent_pb2_grpc
from gpuscope.k8s.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.collectors.test_attribution import CID, POD, fake_proc
from tests.collectors.test_kubelet import Kubelet, pod
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import AnalyzerServer, fake_agent, wait_for
from tests.test_watch_report import BUSY, MEMORY

IN_POD = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
          f"cri-containerd-{CID}.scope\n")
IN_SLURM = "12:memory:/slurm/uid_1001/job_81234/step_0/task_0\n1:name=systemd:/system.slice/slurmd.service\n"


@pytest.fixture
def kubelet(tmp_path):
    servicer = Kubelet()
    servicer.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", ["GPU-fake-0000"]))]
    servicer.allocatable = ["GPU-fake-0000", "GPU-fake-0001"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    servicer.path = str(tmp_path / "kubelet.sock")
    server.add_insecure_port(f"unix://{servicer.path}")
    server.start()
    yield servicer
    server.stop(grace=None)


def cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", *args, "--insecure"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("engine", [False, True], ids=["thread", "process"])
def test_findings_say_whose_job_it_is_down_to_the_pod_and_the_slurm_job(tmp_path, kubelet, engine):
    proc = tmp_path / "proc"
    fake_proc(proc, 4242, IN_POD, environ={"HOSTNAME": "trainer-0"}, uid=0, cmd="python train.py --lr 3e-4")
    fake_proc(proc, 5151, IN_SLURM, uid=1001, cmd="python sim.py --hf-token=hf_SECRET",
              environ={"SLURM_JOB_ID": "81234", "SLURM_STEP_ID": "0", "SLURM_JOB_USER": "alice",
                       "GPUSCOPE_PROFILER_PORT": "9012"})
    srv = AnalyzerServer(tmp_path / "a.duckdb", engine=engine)
    fake = FakeNvml([h200(**MEMORY, processes=[(4242, 8 << 30)]), h200(**BUSY, processes=[(5151, 8 << 30)])])
    agent = fake_agent(fake, srv.target, host="gpu-node", proc_root=proc, kubelet_socket=kubelet.path)
    try:
        mine = wait_for(lambda: [f for f in clients.findings(srv.target, pod="trainer-0", open_only=True)
                                 if f["windows"] >= 2], timeout=30)
        assert len(mine) == 1 and mine[0]["gpu"] == 0 and mine[0]["verdict"] == "memory-bound"
        assert mine[0]["job"] == "pid:4242 python train.py --lr 3e-4"
        assert mine[0]["attribution"] == dict(user="root", container_id=CID, runtime="containerd", pod="trainer-0",
                                              namespace="ml", container="main", pod_uid=POD)
        slurm = wait_for(lambda: clients.findings(srv.target, slurm_job="81234", open_only=True), timeout=30)
        assert [f["gpu"] for f in slurm] == [1] and slurm[0]["verdict"] == "compute-bound"
        assert slurm[0]["job"] == "pid:5151 python sim.py --hf-token=<redacted>"         # redacted as ever
        assert {k: slurm[0]["attribution"].get(k) for k in ("slurm_job", "slurm_step", "slurm_user", "pod",
                                                            "workload")} == \
            dict(slurm_job="81234", slurm_step="0", slurm_user="alice", pod=None, workload="jax 127.0.0.1:9012")
        assert clients.findings(srv.target, pod="ml/trainer-0") and not clients.findings(srv.target, pod="ml/other")
        assert [f["gpu"] for f in clients.findings(srv.target, namespace="ml")] == [0]

        # the same, as people read it
        out = cli("findings", "--server", srv.target, "--pod", "ml/trainer-0")
        assert "job pid:4242 python train.py --lr 3e-4 — pod ml/trainer-0 (container main), user root" in out
        out = cli("findings", "--server", srv.target, "--slurm-job", "81234")
        assert "slurm job 81234 step 0, user alice" in out and "trainer-0" not in out
        assert "no findings for pod nope" in cli("findings", "--server", srv.target, "--pod", "nope")

        # pooled and ranked by pod and Slurm job
        q = clients.query(srv.target, "util_gpu_ratio", "", None, time.time() - 120, time.time(), "mean", 0,
                          group_by="pod")
        assert [(s["group"], s["gpus"]) for s in q["series"]] == [("ml/trainer-0", 1)]
        assert q["series"][0]["value"] == pytest.approx(0.95)
        out = cli("query", "--server", srv.target, "--metric", "util_gpu_ratio", "--aggregate", "mean",
                  "--group-by", "slurm-job")
        assert "slurm job 81234 (1 GPU) mean(util_gpu_ratio) = 95" in out
        out = cli("query", "--server", srv.target, "--metric", "gpuscope_gpu_util_gpu_ratio", "--aggregate", "mean",
                  "--group-by", "slurm-job")                     # the name a Grafana panel shows works too
        assert "slurm job 81234 (1 GPU) mean(util_gpu_ratio) = 95" in out
        top = clients.top(srv.target, by="pod")
        assert [(r["attribution"]["pod"], r["now_verdict"]) for r in top["rows"]] == [("trainer-0", "memory-bound")]

        # the agent's own API says how each source fares, and whose each job it can trace is
        agent.discovery = JobDiscovery(lambda _address: False, proc_root=proc)
        server, port, health = build_server("127.0.0.1:0", [
            (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, srv.target), "gpuscope.v1.Agent")])
        server.start()
        try:
            st = clients.status(f"127.0.0.1:{port}")
            assert st["kind"] == "agent"
            assert st["attribution"]["kubelet"].startswith("ok: 1 GPUs held by 1 pods; 2 allocatable nvidia.com/gpu")
            assert st["attribution"]["cgroup"] == "ok" and st["attribution"]["environ"] == "ok"
            out = cli("status", "--server", f"127.0.0.1:{port}")
            assert "whose jobs (attribution sources):" in out and "kubelet    ok: 1 GPUs held by 1 pods" in out
            jobs = clients.jobs(f"127.0.0.1:{port}")
            assert [(j["pid"], j["attribution"]["slurm_job"]) for j in jobs] == [(5151, "81234")]
            out = cli("jobs", "--server", f"127.0.0.1:{port}")
            assert "whose: slurm job 81234 step 0, user alice, jax 127.0.0.1:9012" in out
        finally:
            shutdown(server, health, grace_s=0.1)
        assert agent.owners()[5151].slurm_job == "81234"
    finally:
        agent.stop()
        srv.stop()


def test_sampling_goes_on_when_the_kubelet_goes_away_and_pods_are_then_known_by_uid(tmp_path, kubelet):
    proc = tmp_path / "proc"
    fake_proc(proc, 4242, IN_POD, uid=0)
    srv = AnalyzerServer(tmp_path / "b.duckdb")
    fake = FakeNvml([h200(**MEMORY, processes=[(4242, 8 << 30)])])
    agent = fake_agent(fake, srv.target, host="gpu-node", proc_root=proc, kubelet_socket=kubelet.path)
    try:
        wait_for(lambda: clients.findings(srv.target, pod="trainer-0"), timeout=30)
        kubelet.refuse = grpc.StatusCode.PERMISSION_DENIED
        wait_for(lambda: agent.status()["attribution"]["kubelet"].startswith("permission denied"), timeout=10)
        before = agent.samples
        wait_for(lambda: agent.samples > before + 20)                          # sampling went on
        latest = "SELECT pod, pod_uid FROM processes WHERE host = 'gpu-node' ORDER BY t DESC LIMIT 1"
        # no pod named from an answer that can no longer be checked; the cgroup's pod UID stays
        wait_for(lambda: srv.analyzer.store.reader().execute(latest).fetchall() == [(None, POD)], timeout=10)
    finally:
        agent.stop()
        srv.stop()
