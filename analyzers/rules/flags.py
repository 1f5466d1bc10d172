"""Secondary flags: the clocks were held down, whatever the bottleneck.

power-capped: the driver's power policy lowered clocks (software power cap or
hardware power brake) for a material part of the window, read from the
throttle-time counters, else from the active clock-event reasons, else from
drawing at the enforced limit. thermal-throttled: the same for software or
hardware thermal slowdown.
"""
from __future__ import annotations

from ..features import Window
from .common import POWER_CAPPED, THERMAL_THROTTLED


def _held(w: Window, time_ratio: str, reason_ratio: str) -> bool:
    t = w.get(time_ratio)
    if t is not None:
        return t >= 0.2
    r = w.get(reason_ratio)
    return r is not None and r >= 0.5


def evaluate(w: Window) -> list[str]:
    flags = []
    near_limit = (w.get("power_limit_ratio") or 0.0) >= 0.97
    if _held(w, "power_capped_time_ratio", "power_reason_sample_ratio") or near_limit:
        flags.append(POWER_CAPPED)
    if _held(w, "thermal_throttled_time_ratio", "thermal_reason_sample_ratio"):
        flags.append(THERMAL_THROTTLED)
    return flags
