"""What every verdict rule shares: the result shape and the few signals that
several rules weigh (is the GPU busy, is the host feeding it, is data moving).

Scores are 0-1 "how well the window fits this verdict"; ramps instead of hard
thresholds so that a window near a boundary gets a low confidence rather than
a coin flip.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..features import Window

COMPUTE, MEMORY, LAUNCH, HOST, COMMUNICATION, IDLE = (
    "compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound", "idle")
VERDICTS = (COMPUTE, MEMORY, LAUNCH, HOST, COMMUNICATION, IDLE)
POWER_CAPPED, THERMAL_THROTTLED = "power-capped", "thermal-throttled"

MIB = 1048576.0


@dataclass
class RuleResult:
    verdict: str
    score: float
    summary: str
    evidence: dict[str, float] = field(default_factory=dict)
    alternatives: tuple[str, ...] = ()


def ramp(x: float | None, lo: float, hi: float) -> float:
    """0 at or below lo, 1 at or above hi, linear between; 0 for unknown."""
    if x is None:
        return 0.0
    if x <= lo:
        return 0.0
    if x >= hi:
        return 1.0
    return (x - lo) / (hi - lo)


def activity(w: Window) -> float | None:
    """How much of the GPU works: fraction of SMs busy where GPM exists (a
    tiny kernel keeps util_gpu high on one SM), else NVML's util_gpu."""
    sm = w.get("sm_util_ratio")
    return sm if sm is not None else w.get("util_gpu_ratio")


def busy(w: Window) -> float:
    """1 when the GPU is doing substantial work, 0 when it mostly is not."""
    return ramp(activity(w), 0.25, 0.55)


def traffic(w: Window) -> float:
    """1 when host<->device or device<->device traffic is material. Kernel
    launches and bookkeeping move tens of MiB/s over PCIe; bulk copies move
    hundreds of MiB/s or more. A known link's utilisation counts too."""
    absolute = ramp(w.get("interconnect_bytes_per_second"), 128 * MIB, 512 * MIB)
    link = ramp(w.get("pcie_link_util_ratio"), 0.3, 0.6)
    return max(absolute, link)


def host_feeding(w: Window) -> float:
    """1 when the GPU's own processes burn host CPU (they are preparing or
    launching work) while the GPU waits. Without per-process CPU (older
    recordings), a GPU that runs some kernels but is mostly idle is taken
    as waiting on its host, with less weight (a GPU busy 20% or more of
    the time is not trickle-fed)."""
    cpu = w.get("host_cpu_cores")
    if cpu is not None:
        return ramp(cpu, 0.3, 0.7)
    util = w.get("util_gpu_ratio")
    return 0.6 * ramp(util, 0.01, 0.03) * (1.0 - ramp(util, 0.10, 0.20))


def starved(w: Window) -> float:
    """GPU starved by the host: host busy, GPU not, and the host is not just
    moving bulk data (that is communication)."""
    return host_feeding(w) * (1.0 - busy(w)) * (1.0 - traffic(w))


def pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"
