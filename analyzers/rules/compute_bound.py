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

import numpy as np

from ..features import Window
from .common import COMPUTE, Features, busy, known, pct, ramp, sms_busy

VERDICT, ALTERNATIVES = COMPUTE, ()

# What to try (report's "what to try", docs/verdicts.md): the GPU is doing math near its peak, so the gain is
# in less math or cheaper math, and a trace says which ops hold the time.
TRY = (
    "cheaper math: fp8 where accuracy allows (Transformer Engine, XLA's fp8 dots on H100/H200); "
    "matmul shapes in multiples of 16 so they stay on the tensor cores",
    "less math: a rematerialisation (checkpoint) policy that recomputes less, or fewer redundant ops "
    "(the trace's top ops)",
    "if tensor activity is low while SMs are busy, the time is in non-matmul kernels: look at the top ops",
)
PIPES = ("tensor_util_ratio", "fp16_util_ratio", "fp32_util_ratio")


def pipe(f: Features) -> np.ndarray:
    """The busiest math pipe, NaN without GPM pipe metrics."""
    out = f.get(PIPES[0])
    for name in PIPES[1:]:
        out = np.fmax(out, f.get(name))
    return out


def compute_side(f: Features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(how far on the compute side of the ridge, certainty, basis is GPM);
    NaN where neither GPM pipes with DRAM nor NVML utilisation tell.

    GPM: the pipes' share of pipe + DRAM utilisation, trusted more the more
    saturated the busier of the two is. NVML: util_mem / util_gpu, ~1 for
    streaming kernels, ~0.25 for GEMMs."""
    p, dram = pipe(f), f.get("dram_bw_util_ratio")
    gpm = known(p) & known(dram)
    total = p + dram
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total <= 0, 0.5, p / total)
        g, m = f.get("util_gpu_ratio"), f.get("util_mem_ratio")
        nvml = np.where(g > 0, m / g, np.nan)
    toward = np.where(gpm, ramp(share, 0.4, 0.55), np.where(known(nvml), 1.0 - ramp(nvml, 0.45, 0.65), np.nan))
    certainty = np.where(gpm, 0.5 + 0.5 * ramp(np.fmax(p, dram), 0.2, 0.5), 0.85)
    return toward, certainty, gpm


def score(f: Features) -> np.ndarray:
    toward, certainty, _ = compute_side(f)
    return busy(f) * toward * certainty


def describe(w: Window) -> str:
    if w.get("dram_bw_util_ratio") is not None and any(w.get(k) is not None for k in PIPES):
        top = max(w.get(k) or 0.0 for k in PIPES)
        return (f"math pipes {pct(top)} active vs DRAM bandwidth {pct(w.get('dram_bw_util_ratio'))} "
                f"of peak{sms_busy(w, ' with ')}")
    return (f"GPU busy {pct(w.get('util_gpu_ratio'))} of the time but memory only "
            f"{pct(w.get('util_mem_ratio'))} (no GPM: NVML utilisation ratio)")
