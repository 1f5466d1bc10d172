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


def _mean(cols: dict[str, np.ndarray], name: str) -> float | None:
    v = cols.get(name)
    if v is None:
        return None
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else None


def _sum_opt(*xs: float | None) -> float | None:
    known = [x for x in xs if x is not None]
    return float(sum(known)) if known else None


def _bits_fraction(cols: dict[str, np.ndarray], mask: int) -> float | None:
    v = cols.get("clock_event_reasons")
    if v is None:
        return None
    v = v[~np.isnan(v)]
    if not len(v):
        return None
    return float(((v.astype(np.int64) & mask) != 0).mean())


def _counter_rate(t: np.ndarray, cols: dict[str, np.ndarray], name: str) -> float | None:
    v = cols.get(name)
    return None if v is None else rate(t, v, cat.BY_NAME[name].wrap_bits)


def compute_window(gpu: int, start: float, end: float, t: np.ndarray,
                   cols: dict[str, np.ndarray], pcie_generation: int | None = None,
                   pcie_width: int | None = None, power_limit_watts: float | None = None) -> Window | None:
    """Features of one window, or None when it holds no activity reading."""
    f: dict[str, float | None] = {}
    f["util_gpu_ratio"] = _mean(cols, "util_gpu_ratio")
    f["util_mem_ratio"] = _mean(cols, "util_mem_ratio")
    for short in ("sm_util", "sm_occupancy", "tensor_util", "dram_bw_util", "fp16_util", "fp32_util"):
        f[f"{short}_ratio"] = _mean(cols, f"gpm_{short}_ratio")
    if f["util_gpu_ratio"] is None and f["sm_util_ratio"] is None:
        return None
    f["host_cpu_cores"] = _mean(cols, "procs_cpu_cores")
    f["processes"] = _mean(cols, "procs_count")
    gpm_pcie = _sum_opt(_mean(cols, "gpm_pcie_tx_bytes_per_second"), _mean(cols, "gpm_pcie_rx_bytes_per_second"))
    if gpm_pcie is None:
        gpm_pcie = _sum_opt(_counter_rate(t, cols, "pcie_tx_bytes_total"), _counter_rate(t, cols, "pcie_rx_bytes_total"))
    f["pcie_bytes_per_second"] = gpm_pcie
    nvl = _sum_opt(_mean(cols, "gpm_nvlink_tx_bytes_per_second"), _mean(cols, "gpm_nvlink_rx_bytes_per_second"))
    if nvl is None:
        nvl = _sum_opt(_counter_rate(t, cols, "nvlink_tx_bytes_total"), _counter_rate(t, cols, "nvlink_rx_bytes_total"))
    f["nvlink_bytes_per_second"] = nvl
    f["interconnect_bytes_per_second"] = _sum_opt(gpm_pcie, nvl)
    if gpm_pcie is not None and pcie_generation in PCIE_LANE_BYTES_PER_S and pcie_width:
        # tx and rx are separate lanes: the busier direction is what saturates.
        f["pcie_link_util_ratio"] = gpm_pcie / 2 / (PCIE_LANE_BYTES_PER_S[pcie_generation] * pcie_width)
    f["power_watts"] = _mean(cols, "power_watts")
    limit = power_limit_watts or _mean(cols, "power_limit_watts")
    if f["power_watts"] is not None and limit:
        f["power_limit_ratio"] = f["power_watts"] / limit
    f["sm_clock_hertz"] = _mean(cols, "sm_clock_hertz")
    cap = _sum_opt(_counter_rate(t, cols, "throttle_sw_power_cap_seconds_total"),
                   _counter_rate(t, cols, "throttle_hw_power_brake_seconds_total"))
    therm = _sum_opt(_counter_rate(t, cols, "throttle_sw_thermal_seconds_total"),
                     _counter_rate(t, cols, "throttle_hw_thermal_seconds_total"))
    f["power_capped_time_ratio"] = None if cap is None else min(cap, 1.0)
    f["thermal_throttled_time_ratio"] = None if therm is None else min(therm, 1.0)
    f["power_reason_sample_ratio"] = _bits_fraction(cols, POWER_REASONS)
    f["thermal_reason_sample_ratio"] = _bits_fraction(cols, THERMAL_REASONS)
    return Window(gpu, start, end, len(t), {k: v for k, v in f.items() if v is not None})
