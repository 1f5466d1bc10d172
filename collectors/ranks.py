"""Which distributed job a GPU process is a rank of, from what its launcher
put in its environment.

Launchers, first that applies:
- Open MPI (`mpirun`): OMPI_COMM_WORLD_RANK / _SIZE; the job is Open MPI's job id
  (OMPI_MCA_ess_base_jobid), else the launcher's URI (OMPI_MCA_orte_hnp_uri /
  PMIX_NAMESPACE). MPICH and Intel MPI (Hydra): PMI_RANK / PMI_SIZE, the job
  from PMI_KVSNAME, else PMIX_NAMESPACE.
- torch.distributed (torchrun, accelerate, DeepSpeed): RANK and WORLD_SIZE, the
  job from TORCHELASTIC_RUN_ID, else the rendezvous MASTER_ADDR:MASTER_PORT.
- JAX (jax.distributed): JAX_PROCESS_ID and JAX_NUM_PROCESSES (or
  JAX_PROCESS_COUNT), the job from JAX_COORDINATOR_ADDRESS.
- Slurm (`srun`): SLURM_JOB_ID and SLURM_STEP_ID name the job step, SLURM_PROCID
  is the rank, SLURM_NTASKS the world. After MPI, torch.distributed and JAX: under
  `srun torchrun` or an `mpirun` in an allocation, Slurm's task is the node's
  launcher, and the ranks it starts all inherit its SLURM_PROCID.
- Kubernetes: LeaderWorkerSet (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX,
  LWS_GROUP_SIZE); JobSet (JOBSET_NAME, JOB_GLOBAL_INDEX, or JOB_INDEX within
  REPLICATED_JOB_NAME); an Indexed Job (JOB_COMPLETION_INDEX): the job is the
  pod's name without its index and suffix, which the caller knows (the pod
  name comes from the kubelet), so it is left to `kubernetes_job`.

A launcher's variables are inherited by the processes a rank starts (data
loader workers): they are the rank's, and share its GPU. The job is a
string the launcher chose, the same in every rank on every host; the
analyzer groups ranks by it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Every variable read (the attribution reader keeps only these of a process's environ).
RANK_ENV = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID", "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri",
    "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "PMI_KVSNAME",
    "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
    "JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "JAX_PROCESS_COUNT", "JAX_COORDINATOR_ADDRESS",
    "LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE",
    "JOBSET_NAME", "JOB_GLOBAL_INDEX", "JOB_INDEX", "REPLICATED_JOB_NAME", "JOB_COMPLETION_INDEX",
})


KUBERNETES_LAUNCHERS = ("jobset", "k8s-indexed-job")     # whose job the pod's namespace and name complete


@dataclass(frozen=True)
class Rank:
    launcher: str           # slurm, mpi, torch, jax, lws, jobset, k8s-indexed-job
    job: str                # the same in every rank: "slurm:4242.0", "torch:10.0.0.1:29500"
    rank: int
    world: int | None       # None: the launcher does not say


def _int(v: str | None) -> int | None:
    if v is None:
        return None
    v = v.strip()
    return int(v) if v.isdigit() and len(v) <= 9 else None


def rank_from_environ(env: dict[str, str]) -> Rank | None:
    """The process's rank in its job, or None when no launcher says."""
    g = env.get
    if _int(g("OMPI_COMM_WORLD_RANK")) is not None:
        job = g("OMPI_MCA_ess_base_jobid") or g("PMIX_NAMESPACE") or g("OMPI_MCA_orte_hnp_uri")
        if job:
            return Rank("mpi", f"mpi:{job}", _int(g("OMPI_COMM_WORLD_RANK")), _int(g("OMPI_COMM_WORLD_SIZE")))
    if _int(g("PMI_RANK")) is not None and (g("PMI_KVSNAME") or g("PMIX_NAMESPACE")):
        return Rank("mpi", f"mpi:{g('PMI_KVSNAME') or g('PMIX_NAMESPACE')}", _int(g("PMI_RANK")), _int(g("PMI_SIZE")))
    if _int(g("RANK")) is not None and _int(g("WORLD_SIZE")) is not None:
        job = g("TORCHELASTIC_RUN_ID")
        job = f"torch:{job}" if job and job != "none" else (
            f"torch:{g('MASTER_ADDR')}:{g('MASTER_PORT')}" if g("MASTER_ADDR") and g("MASTER_PORT") else None)
        if job:
            return Rank("torch", job, _int(g("RANK")), _int(g("WORLD_SIZE")))
    jax_id = _int(g("JAX_PROCESS_ID"))
    if jax_id is not None and g("JAX_COORDINATOR_ADDRESS"):
        return Rank("jax", f"jax:{g('JAX_COORDINATOR_ADDRESS')}", jax_id,
                    _int(g("JAX_NUM_PROCESSES")) or _int(g("JAX_PROCESS_COUNT")))
    # Slurm after MPI, torch.distributed and JAX: `srun torchrun` and `mpirun` inside an allocation start one
    # Slurm task per node, and every rank that task starts inherits its SLURM_PROCID (the node's index)
    slurm = g("SLURM_JOB_ID") or g("SLURM_JOBID")
    step = g("SLURM_STEP_ID") or g("SLURM_STEPID")
    if slurm and _int(g("SLURM_PROCID")) is not None and step is not None:
        return Rank("slurm", f"slurm:{slurm}.{step}", _int(g("SLURM_PROCID")), _int(g("SLURM_NTASKS")))
    if _int(g("LWS_WORKER_INDEX")) is not None and g("LWS_LEADER_ADDRESS"):
        return Rank("lws", f"lws:{g('LWS_LEADER_ADDRESS')}", _int(g("LWS_WORKER_INDEX")), _int(g("LWS_GROUP_SIZE")))
    if g("JOBSET_NAME"):
        index = _int(g("JOB_GLOBAL_INDEX"))
        if index is None and _int(g("JOB_INDEX")) is not None:
            return Rank("jobset", f"jobset:{g('JOBSET_NAME')}/{g('REPLICATED_JOB_NAME') or ''}",
                        _int(g("JOB_INDEX")), None)
        if index is not None:
            return Rank("jobset", f"jobset:{g('JOBSET_NAME')}", index, None)
    if _int(g("JOB_COMPLETION_INDEX")) is not None:
        return Rank("k8s-indexed-job", "", _int(g("JOB_COMPLETION_INDEX")), None)
    return None


_POD_SUFFIX = re.compile(r"-(\d+)-[a-z0-9]{5}$")


def kubernetes_job(rank: Rank, namespace: str, pod: str) -> Rank | None:
    """An Indexed Job's rank, its job named from its pod (`train-3-x7k2p` of
    index 3 is a rank of `k8s:NS/train`); a JobSet's, its namespace added."""
    if rank.launcher == "jobset" and namespace:
        return Rank(rank.launcher, f"{rank.job.replace('jobset:', f'jobset:{namespace}/', 1)}", rank.rank, rank.world)
    if rank.launcher != "k8s-indexed-job":
        return rank
    m = _POD_SUFFIX.search(pod or "")
    if not (m and int(m.group(1)) == rank.rank and namespace):
        return None
    return Rank(rank.launcher, f"k8s:{namespace}/{pod[:m.start()]}", rank.rank, rank.world)
