"""host-bound: the GPU waits on the host between steps (data loading,
Python, synchronisation) with few kernels in flight.

The other half of "GPU starved by the host": host CPU busy, GPU nearly
silent (kernels well under a few % of the time). Launch-bound is the
alternative counters cannot exclude; a trace decides.
"""
from __future__ import annotations

import numpy as np

from ..features import Window
from .common import HOST, LAUNCH, Features, starved
from .launch_bound import kernel_trickle, starved_words

VERDICT, ALTERNATIVES = HOST, (LAUNCH,)

# What to try: the GPU waits for the host between steps.
TRY = (
    "the input pipeline: prefetch to the device, more loader workers, data already decoded",
    "host work in the step: Python between steps, synchronising calls (.item(), block_until_ready), "
    "unpinned host-to-device copies",
    "a capture shows the host steps (input, dispatch, waiting on the device) and decides against launch-bound",
)


def score(f: Features) -> np.ndarray:
    return starved(f) * (1.0 - kernel_trickle(f))


def describe(w: Window) -> str:
    return starved_words(w) + "; the GPU is nearly silent between the host's steps"
