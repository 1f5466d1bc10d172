"""Secondary flags: the clocks were held down, whatever the bottleneck.

power-capped: the driver's power policy lowered clocks (software power cap or
hardware power brake) for a material part of the window, read from the
throttle-time counters, else from the active clock-event reasons, else from
drawing at the enforced limit. thermal-throttled: the same for software or
hardware thermal slowdown.
"""
from __future__ import annotations

import numpy as np

from .common import POWER_CAPPED, THERMAL_THROTTLED, Features, known

# What to try for each flag (report's "what to try").
TRY = {
    POWER_CAPPED: ("the clocks are held by the power limit: compare the enforced limit with the board's default "
                   "(`nvidia-smi -q -d POWER`) and ask whoever set it; the rack's power budget decides the rest",),
    THERMAL_THROTTLED: ("the GPU is too hot: check inlet temperature, fans and airflow "
                        "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)",),
}


def _held(f: Features, time_ratio: str, reason_ratio: str) -> np.ndarray:
    t, r = f.get(time_ratio), f.get(reason_ratio)
    with np.errstate(invalid="ignore"):
        return np.where(known(t), t >= 0.2, known(r) & (r >= 0.5))


def evaluate(f: Features) -> list[tuple[str, np.ndarray]]:
    """(flag, whether each window has it)."""
    with np.errstate(invalid="ignore"):
        near_limit = np.nan_to_num(f.get("power_limit_ratio"), nan=0.0) >= 0.97
    return [(POWER_CAPPED, _held(f, "power_capped_time_ratio", "power_reason_sample_ratio") | near_limit),
            (THERMAL_THROTTLED, _held(f, "thermal_throttled_time_ratio", "thermal_reason_sample_ratio"))]
