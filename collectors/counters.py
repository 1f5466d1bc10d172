"""Cumulative counters: increments between readings, across wraps and resets.

NVML's PCIe byte counters are 32-bit and wrap (every ~1.4 s at 3 GB/s); other
counters reset when the driver reloads. Both readers of counters (the
analyzer's rates and the replay's time scaling) use this one rule.
"""
from __future__ import annotations

import numpy as np


def increments(values: np.ndarray, wrap_bits: int | None) -> np.ndarray:
    """Increment from each reading to the next (len n-1); NaN where it cannot
    be known: a missing reading, or a reset (a drop that is not a wrap)."""
    d = np.diff(values)
    if wrap_bits:
        span = float(2 ** wrap_bits)
        wrapped = (d < 0) & (values[:-1] < span)
        d = np.where(wrapped, d + span, d)
        # A "wrap" that implies more than half the counter's range moved is a reset.
        d = np.where(wrapped & (d > span / 2), np.nan, d)
    return np.where(d < 0, np.nan, d)


def rate(t: np.ndarray, values: np.ndarray, wrap_bits: int | None) -> float | None:
    """Mean rate (units per second) over the readings; None without two valid ones."""
    ok = ~np.isnan(values)
    if ok.sum() < 2:
        return None
    tv, vv = t[ok], values[ok]
    inc = increments(vv, wrap_bits)
    dt = np.diff(tv)
    good = ~np.isnan(inc) & (dt > 0)
    span = dt[good].sum()
    if span <= 0:
        return None
    return float(inc[good].sum() / span)
