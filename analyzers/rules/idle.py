"""idle: nothing of note runs, whether or not a process holds the GPU.

No kernels to speak of, no bulk transfers, and the GPU's processes (if any)
are not busy on the host either: nobody is waiting on anybody.
"""
from __future__ import annotations

from ..features import Window
from .common import IDLE, RuleResult, host_feeding, pct, ramp, traffic


def evaluate(w: Window) -> RuleResult | None:
    acts = [a for a in (w.get("util_gpu_ratio"), w.get("sm_util_ratio")) if a is not None]
    quiet = 1.0 - ramp(max(acts), 0.10, 0.40)
    score = quiet * (1.0 - host_feeding(w)) * (1.0 - traffic(w))
    procs = w.get("processes")
    held = f", {procs:.0f} process(es) hold it" if procs else ""
    return RuleResult(IDLE, score, f"kernels run {pct(w.get('util_gpu_ratio'))} of the time{held}")
