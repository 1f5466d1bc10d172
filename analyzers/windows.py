"""Cutting samples into classification windows.

Windows are aligned to multiples of their length in Unix time, so the live
analyzer and an offline run over the same samples cut the same windows.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

MIN_WINDOW_S, MAX_WINDOW_S, DEFAULT_WINDOW_S = 1.0, 60.0, 5.0


def check_window(seconds: float) -> float:
    if not (MIN_WINDOW_S <= seconds <= MAX_WINDOW_S):
        raise ValueError(f"window must be {MIN_WINDOW_S:g} to {MAX_WINDOW_S:g} seconds, got {seconds:g}")
    return float(seconds)


def window_start(t: float, seconds: float) -> float:
    return float(np.floor(t / seconds) * seconds)


def split(t: np.ndarray, gpu: np.ndarray, seconds: float) -> Iterator[tuple[int, float, np.ndarray]]:
    """(gpu, window start, indices) for every non-empty window, in time order per GPU."""
    bucket = np.floor(t / seconds)
    for g in np.unique(gpu):
        idx = np.flatnonzero(gpu == g)
        b = bucket[idx]
        cuts = np.flatnonzero(np.diff(b)) + 1
        for part in np.split(idx, cuts):
            yield int(g), float(bucket[part[0]] * seconds), part
