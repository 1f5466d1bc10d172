"""What every verdict rule shares: the signals that several rules weigh (is
the GPU busy, is the host feeding it, is data moving) and the shape of a rule.

A rule scores many windows at once: `score(f)` takes a FeatureSet (each
feature an array over the windows, NaN = unknown) and returns 0-1 "how well
each window fits this verdict", NaN where the rule cannot judge. Only the
winning rule describes its window, in words (`describe(w)`, one Window):
a fleet closes thousands of windows at every boundary.

Scores are ramps instead of hard thresholds so that a window near a
boundary gets a low confidence rather than a coin flip.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from gpuscope.collectors import human

COMPUTE, MEMORY, LAUNCH, HOST, COMMUNICATION, IDLE = (
    "compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound", "idle")
VERDICTS = (COMPUTE, MEMORY, LAUNCH, HOST, COMMUNICATION, IDLE)
POWER_CAPPED, THERMAL_THROTTLED = "power-capped", "thermal-throttled"

MIB = 1048576.0


class Features(Protocol):
    def get(self, name: str) -> np.ndarray: ...


def ramp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """0 at or below lo, 1 at or above hi, linear between; 0 for unknown."""
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(np.clip((np.asarray(x, float) - lo) / (hi - lo), 0.0, 1.0), nan=0.0)


def known(x: np.ndarray) -> np.ndarray:
    return ~np.isnan(x)


def activity(f: Features) -> np.ndarray:
    """How much of the GPU works: fraction of SMs busy where GPM exists (a
    tiny kernel keeps util_gpu high on one SM), else NVML's util_gpu."""
    sm = f.get("sm_util_ratio")
    return np.where(known(sm), sm, f.get("util_gpu_ratio"))


def busy(f: Features) -> np.ndarray:
    """1 when the GPU is doing substantial work, 0 when it mostly is not."""
    return ramp(activity(f), 0.25, 0.55)


def traffic(f: Features) -> np.ndarray:
    """1 when host<->device or device<->device traffic is material. Kernel
    launches and bookkeeping move tens of MiB/s over PCIe; bulk copies move
    hundreds of MiB/s or more. A known link's utilisation counts too."""
    absolute = ramp(f.get("interconnect_bytes_per_second"), 128 * MIB, 512 * MIB)
    link = ramp(f.get("pcie_link_util_ratio"), 0.3, 0.6)
    return np.maximum(absolute, link)


def host_feeding(f: Features) -> np.ndarray:
    """1 when the GPU's own processes burn host CPU (they are preparing or
    launching work) while the GPU waits. Without per-process CPU (older
    recordings), a GPU that runs some kernels but is mostly idle is taken
    as waiting on its host, with less weight (a GPU busy 20% or more of
    the time is not trickle-fed)."""
    cpu, util = f.get("host_cpu_cores"), f.get("util_gpu_ratio")
    return np.where(known(cpu), ramp(cpu, 0.3, 0.7),
                    0.6 * ramp(util, 0.01, 0.03) * (1.0 - ramp(util, 0.10, 0.20)))


def starved(f: Features) -> np.ndarray:
    """GPU starved by the host: host busy, GPU not, and the host is not just
    moving bulk data (that is communication)."""
    return host_feeding(f) * (1.0 - busy(f)) * (1.0 - traffic(f))


def pct(x: float | None) -> str:
    return human.value("ratio", x)


def measured_words(w) -> str:
    """` (91 % of this GPU's measured 4.20 TB/s)` where the GPU is
    calibrated: the DRAM ratio counters give is of the datasheet's peak,
    which no real GPU reaches, so 80 % of it can be a GPU at its limit."""
    x, ceiling = w.get("dram_measured_util_ratio"), w.get("hbm_measured_bytes_per_second")
    if x is None or ceiling is None:
        return ""
    return f" ({pct(x)} of this GPU's measured {human.value('bytes/s', ceiling)})"


def sms_busy(w, lead: str = ", ") -> str:
    """`, 53% of SMs busy`, or nothing where the GPU reports no SM activity
    (found in a trial: "? of SMs busy")."""
    x = w.get("sm_util_ratio")
    return "" if x is None else f"{lead}{pct(x)} of SMs busy"
