"""memory-bound: device-memory bandwidth is the limit.

The mirror of compute-bound on the roofline: intensity below the ridge point
(LLM decode GEMV, elementwise ops, reductions) keeps DRAM near its peak while
the math pipes idle. GPM: DRAM bandwidth utilisation dominates the pipes'.
NVML only: util_mem close to util_gpu (memory busy whenever kernels run).
"""
from __future__ import annotations

from ..features import Window
from .common import MEMORY, RuleResult, busy, pct
from .compute_bound import compute_side


def evaluate(w: Window) -> RuleResult | None:
    side = compute_side(w)
    if side is None:
        return None
    toward_compute, certainty, basis = side
    score = busy(w) * (1.0 - toward_compute) * certainty
    if basis == "gpm":
        why = (f"DRAM bandwidth {pct(w.get('dram_bw_util_ratio'))} of peak while tensor pipes "
               f"{pct(w.get('tensor_util_ratio'))} active, {pct(w.get('sm_util_ratio'))} of SMs busy")
    else:
        why = (f"memory busy {pct(w.get('util_mem_ratio'))} of the time, as often as kernels run "
               f"({pct(w.get('util_gpu_ratio'))}) (no GPM: NVML utilisation ratio)")
    return RuleResult(MEMORY, score, why)
