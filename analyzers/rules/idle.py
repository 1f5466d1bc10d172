"""idle: nothing of note runs, whether or not a process holds the GPU.

No kernels to speak of, no bulk transfers, and the GPU's processes (if any)
are not busy on the host either: nobody is waiting on anybody.
"""
from __future__ import annotations

import numpy as np

from ..features import Window
from .common import IDLE, Features, host_feeding, pct, ramp, traffic

VERDICT, ALTERNATIVES = IDLE, ()

# What to try: nothing runs; find out why before tuning anything.
TRY = (
    "who holds the GPU: `gpuscope jobs`, `nvidia-smi`; a job between phases (checkpoint, evaluation) or "
    "waiting on another rank idles its GPUs",
)


def score(f: Features) -> np.ndarray:
    quiet = 1.0 - ramp(np.fmax(f.get("util_gpu_ratio"), f.get("sm_util_ratio")), 0.10, 0.40)
    return quiet * (1.0 - host_feeding(f)) * (1.0 - traffic(f))


def describe(w: Window) -> str:
    procs = w.get("processes")
    held = f", {procs:.0f} process(es) hold it" if procs else ""
    return f"kernels run {pct(w.get('util_gpu_ratio'))} of the time{held}"
