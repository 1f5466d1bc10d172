"""launch-bound: the GPU runs many kernels too short to cover their launch cost.

Counters see it as a GPU that is "starved by the host" (its processes burn
host CPU, the GPU is mostly idle) yet kernels keep arriving: util_gpu (any
kernel running) stays above a trickle while few SMs are busy. Counters alone
cannot separate this from host-bound with certainty, so the result names
host-bound as the alternative; a trace (launch rate, kernel durations) decides.
"""
from __future__ import annotations

import numpy as np

from ..features import Window
from .common import HOST, LAUNCH, Features, known, pct, ramp, sms_busy, starved

VERDICT, ALTERNATIVES = LAUNCH, (HOST,)

# What to try: kernels are too short to cover their launch cost, so launch fewer.
TRY = (
    "CUDA graphs: vLLM uses them unless --enforce-eager; XLA: command buffers (--xla_gpu_enable_command_buffer)",
    "bigger kernels: jit a larger function, fuse small ops, fewer Python-level loops per step",
    "a capture decides between launch- and host-bound: many kernels under ~10 µs back to back is launch overhead",
)


def kernel_trickle(f: Features) -> np.ndarray:
    """1 when kernels run a few % of the time: a steady stream of short ones."""
    return ramp(f.get("util_gpu_ratio"), 0.01, 0.03)


def score(f: Features) -> np.ndarray:
    return np.where(known(f.get("util_gpu_ratio")), starved(f) * kernel_trickle(f), np.nan)


def starved_words(w: Window) -> str:
    cpu = w.get("host_cpu_cores")
    host = f"its processes use {cpu:.2f} host cores" if cpu is not None else "no per-process CPU recorded"
    return (f"GPU starved by the host: kernels run {pct(w.get('util_gpu_ratio'))} of the time"
            f"{sms_busy(w)}, {host}")


def describe(w: Window) -> str:
    return starved_words(w) + "; a steady trickle of short kernels points at launch overhead"
