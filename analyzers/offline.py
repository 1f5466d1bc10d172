"""Offline classification of a recording (`gpuscope classify`)."""
from __future__ import annotations

from gpuscope.collectors.recording import Recording

from .classify import Classification, classify_many
from .features import Columns, compute_windows, stack
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
