"""Ranks of distributed jobs from their launchers' environments: each
launcher's variables as it sets them, and real processes read through
/proc by the agent's attribution reader."""
import os
import subprocess
import sys
import time

import pytest

from gpuscope.collectors.attribution import Attributor, PodRef
from gpuscope.collectors.ranks import Rank, kubernetes_job, rank_from_environ
from tests.collectors.test_attribution import POD, Pods, fake_proc


@pytest.mark.parametrize("env, want", [
    # srun -n 16: each task of step 0 of job 4242
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "16",
      "SLURM_LOCALID": "1"}, Rank("slurm", "slurm:4242.0", 5, 16)),
    # sbatch's batch script holds SLURM_JOB_ID but is no task of a step: not a rank
    ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0"}, None),
    # mpirun (Open MPI 4 and 5)
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_MCA_ess_base_jobid": "3627810817"},
     Rank("mpi", "mpi:3627810817", 3, 8)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "PMIX_NAMESPACE": "prterun-node1-3187@1"},
     Rank("mpi", "mpi:prterun-node1-3187@1", 3, 8)),
    # MPICH / Intel MPI (Hydra)
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_KVSNAME": "kvs_4711_0"}, Rank("mpi", "mpi:kvs_4711_0", 2, 4)),
    # torchrun: its run id; a plain launch: the rendezvous address
    ({"RANK": "7", "WORLD_SIZE": "32", "LOCAL_RANK": "7", "TORCHELASTIC_RUN_ID": "llama-ft-0931",
      "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, Rank("torch", "torch:llama-ft-0931", 7, 32)),
    ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1",
      "MASTER_PORT": "29500"}, Rank("torch", "torch:10.0.0.1:29500", 1, 2)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, None),                       # a RANK of something else
    # jax.distributed
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_PROCESS_ID": "3", "JAX_NUM_PROCESSES": "4"},
     Rank("jax", "jax:10.0.0.1:1234", 3, 4)),
    # Kubernetes: LeaderWorkerSet, JobSet, an Indexed Job
    ({"LWS_LEADER_ADDRESS": "vllm-0.vllm.ml", "LWS_WORKER_INDEX": "2", "LWS_GROUP_SIZE": "4"},
     Rank("lws", "lws:vllm-0.vllm.ml", 2, 4)),
    ({"JOBSET_NAME": "pretrain", "REPLICATED_JOB_NAME": "workers", "JOB_INDEX": "3", "JOB_GLOBAL_INDEX": "3",
      "JOB_COMPLETION_INDEX": "0"}, Rank("jobset", "jobset:pretrain", 3, None)),
    ({"JOB_COMPLETION_INDEX": "5"}, Rank("k8s-indexed-job", "", 5, None)),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "x"}, None),      # garbage is no rank
    ({}, None),
])
def test_each_launcher_names_the_job_and_the_rank(env, want):
    assert rank_from_environ(env) == want


def test_a_kubernetes_rank_s_job_is_named_after_its_pod():
    r = rank_from_environ({"JOB_COMPLETION_INDEX": "3"})
    assert kubernetes_job(r, "ml", "train-3-x7k2p") == Rank("k8s-indexed-job", "k8s:ml/train", 3, None)
    assert kubernetes_job(r, "ml", "train-4-x7k2p") is None          # the pod is not that index's
    js = rank_from_environ({"JOBSET_NAME": "pretrain", "JOB_GLOBAL_INDEX": "1"})
    assert kubernetes_job(js, "ml", "pretrain-workers-1-0-abcde").job == "jobset:ml/pretrain"


def test_an_indexed_job_s_ranks_are_grouped_through_the_kubelet(tmp_path):
    slice_ = f"kubepods-burstable-pod{POD.replace('-', '_')}.slice"
    fake_proc(tmp_path, 1, f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{'a' * 64}.scope\n",
              environ={"JOB_COMPLETION_INDEX": "2"})
    at = Attributor(tmp_path, pods=Pods({"GPU-a": (PodRef("ml", "train-2-q8z4k", "main"),)}))
    a = at.of(1, 5000, "GPU-a", 0)
    assert (a.dist_job, a.rank, a.world_size) == ("k8s:ml/train", "2", "")
    assert Attributor(tmp_path).of(1, 5000, "GPU-a", 0).dist_job == ""      # no kubelet: no name for the job


def test_real_processes_of_one_jax_job_are_ranks_of_it_through_proc():
    """Four real processes started as jax.distributed's launcher would
    start them, read through /proc as the agent reads a GPU's processes."""
    procs = []
    try:
        for rank in range(4):
            env = dict(os.environ, JAX_COORDINATOR_ADDRESS="127.0.0.1:47011", JAX_PROCESS_ID=str(rank),
                       JAX_NUM_PROCESSES="4")
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env))
        time.sleep(0.2)
        at = Attributor("/proc")
        got = [at.of(p.pid, None, "GPU-x", 0) for p in procs]
        assert {(a.dist_job, a.world_size) for a in got} == {("jax:127.0.0.1:47011", "4")}
        assert [a.rank for a in got] == ["0", "1", "2", "3"]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("env, want", [
    # srun --ntasks-per-node=1 torchrun --nproc-per-node 8 on 4 nodes: worker 5 of node 2 is rank 21 of 32,
    # though it inherits the Slurm task's SLURM_PROCID (2, the node) and SLURM_NTASKS (4, the nodes)
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "RANK": "21",
      "LOCAL_RANK": "5", "WORLD_SIZE": "32", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "n1",
      "MASTER_PORT": "29500"}, Rank("torch", "torch:n1:29500", 21, 32)),
    # mpirun in an sbatch script: Open MPI starts its daemons with srun, one task per node
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
      "OMPI_COMM_WORLD_RANK": "13", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_MCA_ess_base_jobid": "123"},
     Rank("mpi", "mpi:123", 13, 16)),
])
def test_a_launcher_started_by_a_slurm_task_names_the_rank(env, want):
    assert rank_from_environ(env) == want


def test_real_workers_of_srun_torchrun_are_distinct_ranks_through_proc():
    """Eight workers one torchrun started under one Slurm task: each is its own rank."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "JAX_"))
            and k not in ("RANK", "WORLD_SIZE")}
    procs = []
    try:
        for local in range(8):
            env = dict(base, SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="2", SLURM_NTASKS="4",
                       SLURM_LOCALID="0", RANK=str(16 + local), LOCAL_RANK=str(local), WORLD_SIZE="32",
                       TORCHELASTIC_RUN_ID="4242", MASTER_ADDR="n1", MASTER_PORT="29500")
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env))
        time.sleep(0.2)
        at = Attributor("/proc")
        got = [at.of(p.pid, None, "GPU-x", local) for local, p in enumerate(procs)]
        assert {(a.dist_job, a.world_size, a.slurm_job) for a in got} == {("torch:4242", "32", "4242")}
        assert [a.rank for a in got] == [str(16 + i) for i in range(8)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
