"""The records every package shares: what a collector hands to the agent and
what the analyzer receives, free of any wire or storage format."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from enum import Enum


class HealthKind(str, Enum):
    GPU_LOST = "gpu_lost"
    XID = "xid"
    ECC_UNCORRECTED = "ecc_uncorrected"
    SOURCE_ERROR = "source_error"
    RECOVERED = "recovered"


@dataclass(frozen=True, slots=True)
class Attribution:
    """Whose a GPU process is (collectors/attribution.py reads it once per
    process). Every field is a short label; "" is not known."""
    user: str = ""                   # owner of the process: its name, or uid:N
    container_id: str = ""           # from /proc/PID/cgroup
    runtime: str = ""                # docker, containerd, cri-o, podman
    pod: str = ""                    # from the kubelet (which pod holds the GPU)
    namespace: str = ""
    container: str = ""              # the container's name in its pod
    pod_uid: str = ""                # from the cgroup, when the kubelet cannot name the pod
    slurm_job: str = ""              # SLURM_JOB_ID, else the cgroup's job_N
    slurm_step: str = ""             # SLURM_STEP_ID, else the cgroup's step_S
    slurm_user: str = ""             # SLURM_JOB_USER
    unit: str = ""                   # the systemd unit or scope
    workload: str = ""               # what runs: "jax 127.0.0.1:9012", "vllm" (collectors/jobs.py)
    cgroup: str = ""                 # the cgroup path, kept raw when its shape is not one we know
    # a rank of a distributed job (collectors/ranks.py): the job as its launcher names it in every rank
    dist_job: str = ""               # "slurm:4242.0", "torch:10.0.0.1:29500", "k8s:ml/train"
    rank: str = ""                   # its rank, decimal
    world_size: str = ""             # ranks in the job, decimal, when the launcher says


ATTRIBUTION_FIELDS = tuple(f.name for f in fields(Attribution))
# Each attribution label is at most this many bytes of UTF-8 and printable: the
# agent cuts and cleans what it reads (environ and cgroups are users' text),
# the analyzer refuses a batch that breaks it (a bug of the agent).
MAX_ATTRIBUTION_BYTES = 256
# What a finding is an episode of: a bottleneck of the GPU's own windows, or a condition the analyzer's
# fleet checks found by setting it against others (under its peers; slower than its program's baseline;
# the rank of a distributed job the other ranks wait for).
# A finding of another kind than a bottleneck has its kind as its verdict.
FINDING_KINDS = ("bottleneck", "degraded", "regression", "straggler")

# The job of a GPU whose source names its pod and lists no process (dcgm-exporter's
# labels): `pod NS/NAME [container C]`. It holds no command line (readers see it whole)
# and names the pod already (said once).
POD_JOB_PREFIX = "pod "


def pod_job(namespace: str, pod: str, container: str = "") -> str:
    return f"{POD_JOB_PREFIX}{namespace or '?'}/{pod}" + (f" container {container}" if container else "")


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    pid: int
    used_memory_bytes: int | None = None
    cpu_cores: float | None = None   # None: first sight, or /proc unreadable
    command: str = ""
    # One object per process (and GPU) shared by every sample of it, so a
    # sample carries a reference, not a copy of the labels. None: not read.
    attribution: Attribution | None = None


@dataclass(slots=True)
class GpuSample:
    """One GPU at one instant. Metrics absent from `values` were not available."""
    gpu: int
    t: float                          # Unix seconds
    values: dict[str, float]
    processes: tuple[ProcessRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    gpu: int
    uuid: str = ""
    name: str = ""
    architecture: str = ""
    memory_total_bytes: int | None = None
    power_limit_watts: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    gpm_supported: bool = False
    lost: bool = False
    # where its samples come from and what that source can see of it, for people:
    # "nvml", "dcgm (profiling)", "dcgm (no profiling: another profiler holds the counters)"
    source: str = ""
    # its PCI address as sysfs names it ("0000:3b:00.0"): which network port is nearest (collectors/network.py)
    pci_bus_id: str = ""
    # whose the GPU is when the source names it without processes (dcgm-exporter's pod labels):
    # findings of a GPU with no process seen take it as their job's
    attribution: Attribution | None = None
    # the fastest link this GPU and its slot can train to (NVML's max, not the GPU's alone): a
    # width under it is a badly seated card or a bad riser; a generation under it while busy, a
    # link that trained down (at idle the generation drops to save power, so only busy counts)
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    driver_version: str = ""          # the NVIDIA driver's ("570.124.06"); "" where the source will not say
    # the best link seen while the GPU was busy (utilisation >= BUSY_UTIL on the reading before): what
    # the link trains to when it carries work; None until the agent has seen the GPU busy
    pcie_busy_generation: int | None = None
    pcie_busy_width: int | None = None


# A GPU this busy (utilisation, 0-1) holds its PCIe link at the generation the link trained to: an
# idle one lets it drop to save power
BUSY_UTIL = 0.1


def with_busy_link(info: "DeviceInfo", generation: int | None, width: int | None) -> "DeviceInfo":
    """`info` with the link read while the GPU was busy folded into the
    best seen so far (a link that rests between steps must not lower it)."""
    gen = max((v for v in (generation, info.pcie_busy_generation) if v is not None), default=None)
    lanes = max((v for v in (width, info.pcie_busy_width) if v is not None), default=None)
    if (gen, lanes) == (info.pcie_busy_generation, info.pcie_busy_width):
        return info
    return dataclasses.replace(info, pcie_busy_generation=gen, pcie_busy_width=lanes)


@dataclass(frozen=True, slots=True)
class HealthRecord:
    gpu: int
    t: float
    kind: HealthKind
    detail: str
    code: int | None = None


@dataclass(slots=True)
class Scrape:
    """What one scrape produced. Partial failure is normal: errors name the
    GPU and call that failed while the other samples still count."""
    samples: list[GpuSample] = field(default_factory=list)
    health: list[HealthRecord] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def count_error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1
