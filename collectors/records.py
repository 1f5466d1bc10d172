"""The records every package shares: what a collector hands to the agent and
what the analyzer receives, free of any wire or storage format."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class HealthKind(str, Enum):
    GPU_LOST = "gpu_lost"
    XID = "xid"
    ECC_UNCORRECTED = "ecc_uncorrected"
    SOURCE_ERROR = "source_error"
    RECOVERED = "recovered"


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    pid: int
    used_memory_bytes: int | None = None
    cpu_cores: float | None = None   # None: first sight, or /proc unreadable
    command: str = ""


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
