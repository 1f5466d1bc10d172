"""Live windows: accumulates each GPU's committed samples and classifies a
window as soon as a sample of a later window arrives (or, for a host that
went quiet, when the sweep finds it stale)."""
from __future__ import annotations

from dataclasses import dataclass, field

import time

import numpy as np

from .classify import Classification, classify
from .features import Columns, compute_window
from .ingest import DecodedBatch
from .windows import split


@dataclass
class _Acc:
    start: float
    arrived: float = 0.0               # analyzer's wall clock at the latest chunk
    t: list[np.ndarray] = field(default_factory=list)
    rows: list[tuple[tuple[str, ...], np.ndarray]] = field(default_factory=list)   # (metric names, matrix)
    job: str = ""


class LiveWindows:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._acc: dict[tuple[str, int], _Acc] = {}
        self.devices: dict[tuple[str, int], dict] = {}
        self.late_samples = 0

    def add(self, b: DecodedBatch, now: float | None = None) -> list[tuple[str, Classification, str]]:
        for d in b.devices:
            self.devices[(b.host, d.gpu)] = dict(
                pcie_generation=d.pcie_generation if d.HasField("pcie_generation") else None,
                pcie_width=d.pcie_width if d.HasField("pcie_width") else None,
                power_limit_watts=d.power_limit_watts if d.HasField("power_limit_watts") else None)
        out = []
        if not b.count:
            return out
        now = time.time() if now is None else now
        order = np.argsort(b.t, kind="stable")
        t, gpu = b.t[order], b.gpu[order]
        names = tuple(b.columns)
        matrix = np.column_stack([b.columns[k] for k in names]) if names else np.empty((b.count, 0))
        for g, start, idx in split(t, gpu, self.window_s):
            key = (b.host, g)
            acc = self._acc.get(key)
            if acc is not None and start < acc.start:
                self.late_samples += len(idx)      # stored, but its window is already judged
                continue
            if acc is not None and start > acc.start:
                c = self._close(key)
                if c is not None:
                    out.append((b.host, c, acc.job))
                acc = None
            if acc is None:
                acc = self._acc[key] = _Acc(start)
            rows = order[idx]
            acc.arrived = now
            acc.t.append(b.t[rows])
            acc.rows.append((names, matrix[rows]))
            if g in b.job:
                acc.job = b.job[g]
        return out

    def _close(self, key: tuple[str, int]) -> Classification | None:
        acc = self._acc.pop(key)
        t = np.concatenate(acc.t)
        w = compute_window(key[1], acc.start, acc.start + self.window_s, t, _merge(acc.rows),
                           **self.devices.get(key, {}))
        return classify(w) if w is not None else None

    def sweep(self, now: float, grace_windows: float = 2.0) -> list[tuple[str, Classification, str]]:
        """Close windows of GPUs that stopped sending (host down, GPU lost).
        Judged by when data last *arrived*, on the analyzer's clock, so an
        agent whose clock disagrees with ours, or a replay of old samples,
        is not mistaken for a silent host."""
        out = []
        for key in [k for k, a in self._acc.items() if a.arrived + self.window_s * (1 + grace_windows) < now]:
            job = self._acc[key].job
            c = self._close(key)
            if c is not None:
                out.append((key[0], c, job))
        return out


def _merge(chunks: list[tuple[tuple[str, ...], np.ndarray]]) -> Columns:
    """One matrix from chunks whose metric sets may differ (fast and slow rows)."""
    first = chunks[0][0]
    if all(names == first for names, _ in chunks):
        return Columns(first, np.vstack([m for _, m in chunks]))
    union = tuple(dict.fromkeys(n for names, _ in chunks for n in names))
    pos = {n: i for i, n in enumerate(union)}
    out = np.full((sum(len(m) for _, m in chunks), len(union)), np.nan)
    r = 0
    for names, m in chunks:
        out[r:r + len(m), [pos[n] for n in names]] = m
        r += len(m)
    return Columns(union, out)
