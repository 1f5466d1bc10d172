"""Offline classification of a recording (`gpuscope classify`)."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.collectors.recording import Recording

from .classify import Classification, classify_many
from .features import INPUTS, Columns, compute_windows, stack
from .windows import check_window, split


def classify_recording(rec: Recording, window_s: float,
                       skipped: list[tuple[int, float, float]] | None = None) -> list[Classification]:
    """The recording's windows, judged. A window without an activity reading
    (util_gpu or SM activity: all `[N/A]`, say) cannot be judged; it is
    appended to `skipped` as (gpu, start, end), so the caller can say so."""
    window_s = check_window(window_s)
    names = tuple(rec.metrics)
    parts = [(gpu, start, start + window_s, rec.t[idx],
              Columns.from_dict({k: rec.metrics[k][idx] for k in names}, len(idx)), {})
             for gpu, start, idx in split(rec.t, rec.gpu, window_s)]
    windows = compute_windows(stack(parts))
    if skipped is not None:
        skipped += [(gpu, start, end) for (gpu, start, end, *_), w in zip(parts, windows) if w is None]
    return classify_many([w for w in windows if w is not None])


def judge_newest(samples: Sequence[GpuSample], window_s: float,
                 devices: Mapping[int, DeviceInfo] | None = None) -> dict[int, Classification]:
    """Each GPU's verdict over its newest `window_s` seconds of samples, by
    the analyzer's own features and rules: what an agent's /metrics says
    without asking the analyzer. A GPU whose window cannot be judged (no
    activity reading) is left out."""
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    parts = []
    for gpu, rows in sorted(by_gpu.items()):
        end = max(s.t for s in rows)
        rows = sorted((s for s in rows if s.t > end - window_s), key=lambda s: s.t)
        names = tuple(k for k in INPUTS if k in rows[-1].values or k in rows[0].values)
        # None (not read) becomes NaN in a float array
        matrix = np.array([list(map(s.values.get, names)) for s in rows], float).reshape(len(rows), -1)
        d = (devices or {}).get(gpu)
        facts = dict(pcie_generation=d.pcie_generation, pcie_width=d.pcie_width,
                     pcie_max_generation=d.pcie_max_generation,
                     power_limit_watts=d.power_limit_watts) if d is not None else {}
        parts.append((gpu, end - window_s, end, np.array([s.t for s in rows], float), Columns(names, matrix), facts))
    windows = compute_windows(stack(parts)) if parts else []
    judged = classify_many([w for w in windows if w is not None])
    return {c.gpu: c for c in judged}
