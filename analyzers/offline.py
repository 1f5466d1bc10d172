"""Offline classification of a recording (`gpuscope classify`)."""
from __future__ import annotations

from gpuscope.collectors.recording import Recording

from .classify import Classification, classify_many
from .features import Columns, compute_windows, stack
from .windows import check_window, split


def classify_recording(rec: Recording, window_s: float) -> list[Classification]:
    window_s = check_window(window_s)
    names = tuple(rec.metrics)
    parts = [(gpu, start, start + window_s, rec.t[idx],
              Columns.from_dict({k: rec.metrics[k][idx] for k in names}, len(idx)), {})
             for gpu, start, idx in split(rec.t, rec.gpu, window_s)]
    return classify_many([w for w in compute_windows(stack(parts)) if w is not None])
