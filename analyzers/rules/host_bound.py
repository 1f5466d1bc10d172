"""host-bound: the GPU waits on the host between steps (data loading,
Python, synchronisation) with few kernels in flight.

The other half of "GPU starved by the host": host CPU busy, GPU nearly
silent (kernels well under a few % of the time). Launch-bound is the
alternative counters cannot exclude; a trace decides.
"""
from __future__ import annotations

from ..features import Window
from .common import HOST, LAUNCH, RuleResult, starved
from .launch_bound import describe, kernel_trickle


def evaluate(w: Window) -> RuleResult | None:
    score = starved(w) * (1.0 - kernel_trickle(w))
    return RuleResult(HOST, score, describe(w) + "; the GPU is nearly silent between the host's steps",
                      alternatives=(LAUNCH,))
