"""memory-bound: device-memory bandwidth is the limit.

The mirror of compute-bound on the roofline: intensity below the ridge point
(LLM decode GEMV, elementwise ops, reductions) keeps DRAM near its peak while
the math pipes idle. GPM: DRAM bandwidth utilisation dominates the pipes'.
NVML only: util_mem close to util_gpu (memory busy whenever kernels run).
"""
from __future__ import annotations

import numpy as np

from ..features import Window
from .common import MEMORY, Features, busy, measured_words, pct, sms_busy
from .compute_bound import PIPES, compute_side

VERDICT, ALTERNATIVES = MEMORY, ()

# What to try: the kernels wait on HBM, so move fewer bytes per FLOP.
TRY = (
    "more work per byte: a larger batch (LLM decode: more concurrent sequences, vLLM --max-num-seqs)",
    "fewer bytes: quantised weights or KV cache (vLLM --kv-cache-dtype fp8), bf16 activations",
    "fuse elementwise ops so intermediates stay on chip: unfused loops show as top ops in a capture",
)


def score(f: Features) -> np.ndarray:
    toward, certainty, _ = compute_side(f)
    return busy(f) * (1.0 - toward) * certainty


def describe(w: Window) -> str:
    if w.get("dram_bw_util_ratio") is not None and any(w.get(k) is not None for k in PIPES):
        return (f"DRAM bandwidth {pct(w.get('dram_bw_util_ratio'))} of peak{measured_words(w)} while tensor pipes "
                f"{pct(w.get('tensor_util_ratio'))} active{sms_busy(w)}")
    return (f"memory busy {pct(w.get('util_mem_ratio'))} of the time, as often as kernels run "
            f"({pct(w.get('util_gpu_ratio'))}) (no GPM: NVML utilisation ratio)")
