"""Offline classification of a recording (`gpuscope classify`)."""
from __future__ import annotations

from gpuscope.collectors.recording import Recording

from .classify import Classification, classify
from .features import Columns, compute_window
from .windows import check_window, split


def classify_recording(rec: Recording, window_s: float) -> list[Classification]:
    window_s = check_window(window_s)
    out = []
    for gpu, start, idx in split(rec.t, rec.gpu, window_s):
        cols = Columns.from_dict({k: v[idx] for k, v in rec.metrics.items()}, len(idx))
        w = compute_window(gpu, start, start + window_s, rec.t[idx], cols)
        if w is not None:
            out.append(classify(w))
    return out
