"""compute-bound: the SMs' math pipes are the limit.

Roofline: a kernel whose operational intensity is above the ridge point
(H200: ~989 TFLOP/s dense bf16 / 4.8 TB/s ~ 206 FLOP/byte) saturates the math
pipes before it saturates DRAM. Counters see that as the tensor or FP pipes
closer to their peak than DRAM bandwidth is to its peak, on a busy GPU. The
pipes' share of (pipe + DRAM) utilisation is the position on either side of
the ridge. Without GPM, NVML's util_mem (fraction of time memory was read or
written) well below util_gpu means kernels ran without keeping DRAM busy.
"""
from __future__ import annotations

from ..features import Window
from .common import COMPUTE, RuleResult, busy, pct, ramp


def pipe_share(w: Window) -> tuple[float, float] | None:
    """(share of math pipes in pipe+DRAM utilisation, saturation of the busier
    of the two), or None without GPM pipe metrics."""
    pipes = [w.get(k) for k in ("tensor_util_ratio", "fp16_util_ratio", "fp32_util_ratio")]
    pipes = [p for p in pipes if p is not None]
    dram = w.get("dram_bw_util_ratio")
    if not pipes or dram is None:
        return None
    pipe = max(pipes)
    total = pipe + dram
    return (0.5 if total <= 0 else pipe / total), max(pipe, dram)


def memory_share_nvml(w: Window) -> float | None:
    """util_mem / util_gpu: ~1 for streaming kernels, ~0.25 for GEMMs."""
    g, m = w.get("util_gpu_ratio"), w.get("util_mem_ratio")
    if g is None or m is None or g <= 0:
        return None
    return m / g


def compute_side(w: Window) -> tuple[float, float, str] | None:
    """(how far on the compute side of the ridge, certainty, basis)."""
    ps = pipe_share(w)
    if ps is not None:
        share, saturation = ps
        return ramp(share, 0.4, 0.55), 0.5 + 0.5 * ramp(saturation, 0.2, 0.5), "gpm"
    ms = memory_share_nvml(w)
    if ms is not None:
        return 1.0 - ramp(ms, 0.45, 0.65), 0.85, "nvml"
    return None


def evaluate(w: Window) -> RuleResult | None:
    side = compute_side(w)
    if side is None:
        return None
    toward_compute, certainty, basis = side
    score = busy(w) * toward_compute * certainty
    if basis == "gpm":
        pipe = max(w.get(k) or 0.0 for k in ("tensor_util_ratio", "fp16_util_ratio", "fp32_util_ratio"))
        why = (f"math pipes {pct(pipe)} active vs DRAM bandwidth {pct(w.get('dram_bw_util_ratio'))} "
               f"of peak with {pct(w.get('sm_util_ratio'))} of SMs busy")
    else:
        why = (f"GPU busy {pct(w.get('util_gpu_ratio'))} of the time but memory only "
               f"{pct(w.get('util_mem_ratio'))} (no GPM: NVML utilisation ratio)")
    return RuleResult(COMPUTE, score, why)
