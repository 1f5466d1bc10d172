"""Window features: the numbers rules reason about, from one GPU's samples.

Input is columnar (metric -> float64 array, NaN = missing), the same whether
it comes from the live store or from an offline recording. Every feature is
None when its inputs are missing: a rule must never read "unknown" as 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.counters import rate

# PCIe payload bandwidth per lane per direction, bytes/s, by generation
# (after 8b/10b or 128b/130b encoding).
PCIE_LANE_BYTES_PER_S = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
POWER_REASONS = SW_POWER_CAP | HW_POWER_BRAKE
THERMAL_REASONS = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN


@dataclass
class Window:
    gpu: int
    start: float
    end: float
    samples: int
    features: dict[str, float]          # only the ones that could be computed

    def get(self, name: str) -> float | None:
        return self.features.get(name)


class Columns:
    """One window's samples metric by metric (NaN = missing), held as one
    matrix so that every mean is computed in a single pass."""

    def __init__(self, names: tuple[str, ...], matrix: np.ndarray):
        self.index = {n: i for i, n in enumerate(names)}
        self.matrix = matrix
        present = ~np.isnan(matrix)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.means = np.where(present, matrix, 0.0).sum(axis=0) / present.sum(axis=0)

    @classmethod
    def from_dict(cls, cols: dict[str, np.ndarray], n: int) -> "Columns":
        names = tuple(cols)
        matrix = np.column_stack([cols[k] for k in names]) if names else np.empty((n, 0))
        return cls(names, matrix)

    def get(self, name: str) -> np.ndarray | None:
        i = self.index.get(name)
        return None if i is None else self.matrix[:, i]

    def mean(self, name: str) -> float | None:
        i = self.index.get(name)
        if i is None:
            return None
        m = self.means[i]
        return None if m != m else float(m)


def _sum_opt(*xs: float | None) -> float | None:
    known = [x for x in xs if x is not None]
    return float(sum(known)) if known else None


def _bits_fraction(cols: Columns, mask: int) -> float | None:
    v = cols.get("clock_event_reasons")
    if v is None:
        return None
    v = v[~np.isnan(v)]
    if not len(v):
        return None
    return float(((v.astype(np.int64) & mask) != 0).mean())


def _counter_rate(t: np.ndarray, cols: Columns, name: str) -> float | None:
    v = cols.get(name)
    return None if v is None else rate(t, v, cat.BY_NAME[name].wrap_bits)


def compute_window(gpu: int, start: float, end: float, t: np.ndarray,
                   cols: Columns, pcie_generation: int | None = None,
                   pcie_width: int | None = None, power_limit_watts: float | None = None) -> Window | None:
    """Features of one window, or None when it holds no activity reading."""
    f: dict[str, float | None] = {}
    f["util_gpu_ratio"] = cols.mean("util_gpu_ratio")
    f["util_mem_ratio"] = cols.mean("util_mem_ratio")
    for short in ("sm_util", "sm_occupancy", "tensor_util", "dram_bw_util", "fp16_util", "fp32_util"):
        f[f"{short}_ratio"] = cols.mean(f"gpm_{short}_ratio")
    if f["util_gpu_ratio"] is None and f["sm_util_ratio"] is None:
        return None
    f["host_cpu_cores"] = cols.mean("procs_cpu_cores")
    f["processes"] = cols.mean("procs_count")
    gpm_pcie = _sum_opt(cols.mean("gpm_pcie_tx_bytes_per_second"), cols.mean("gpm_pcie_rx_bytes_per_second"))
    if gpm_pcie is None:
        gpm_pcie = _sum_opt(_counter_rate(t, cols, "pcie_tx_bytes_total"), _counter_rate(t, cols, "pcie_rx_bytes_total"))
    f["pcie_bytes_per_second"] = gpm_pcie
    nvl = _sum_opt(cols.mean("gpm_nvlink_tx_bytes_per_second"), cols.mean("gpm_nvlink_rx_bytes_per_second"))
    if nvl is None:
        nvl = _sum_opt(_counter_rate(t, cols, "nvlink_tx_bytes_total"), _counter_rate(t, cols, "nvlink_rx_bytes_total"))
    f["nvlink_bytes_per_second"] = nvl
    f["interconnect_bytes_per_second"] = _sum_opt(gpm_pcie, nvl)
    if gpm_pcie is not None and pcie_generation in PCIE_LANE_BYTES_PER_S and pcie_width:
        # tx and rx are separate lanes: the busier direction is what saturates.
        f["pcie_link_util_ratio"] = gpm_pcie / 2 / (PCIE_LANE_BYTES_PER_S[pcie_generation] * pcie_width)
    f["power_watts"] = cols.mean("power_watts")
    limit = power_limit_watts or cols.mean("power_limit_watts")
    if f["power_watts"] is not None and limit:
        f["power_limit_ratio"] = f["power_watts"] / limit
    f["sm_clock_hertz"] = cols.mean("sm_clock_hertz")
    cap = _sum_opt(_counter_rate(t, cols, "throttle_sw_power_cap_seconds_total"),
                   _counter_rate(t, cols, "throttle_hw_power_brake_seconds_total"))
    therm = _sum_opt(_counter_rate(t, cols, "throttle_sw_thermal_seconds_total"),
                     _counter_rate(t, cols, "throttle_hw_thermal_seconds_total"))
    f["power_capped_time_ratio"] = None if cap is None else min(cap, 1.0)
    f["thermal_throttled_time_ratio"] = None if therm is None else min(therm, 1.0)
    f["power_reason_sample_ratio"] = _bits_fraction(cols, POWER_REASONS)
    f["thermal_reason_sample_ratio"] = _bits_fraction(cols, THERMAL_REASONS)
    return Window(gpu, start, end, len(t), {k: v for k, v in f.items() if v is not None})
