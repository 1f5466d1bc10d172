"""transitional: the window straddles a change of regime, so its means
describe neither side.

A window that holds one second of a busy GPU and one second of an idle one
averages into "GPU starved by the host"; a window whose samples split into a
before and an after whose activity differs by SHIFT or more (features:
activity_shift_ratio, the best single split, each side a fifth of the
samples or more) is marked transitional. Its verdict is still given, with a
confidence of at most CONFIDENCE, and findings and the detector pass over it:
the windows on either side say what each regime is.
"""
from __future__ import annotations

import numpy as np

from .common import Features

TRANSITIONAL = "transitional"
SHIFT = 0.35          # SM activity steps of 35 points: far above a steady job's window-to-window noise (~2-5)
CONFIDENCE = 0.3


def evaluate(f: Features) -> np.ndarray:
    """Whether each window straddles a change of regime."""
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(f.get("activity_shift_ratio"), nan=0.0) >= SHIFT
