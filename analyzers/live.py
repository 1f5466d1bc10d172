"""Live windows: accumulates each GPU's committed samples and classifies a
window as soon as a sample of a later window arrives (or, for a host that
went quiet, when the sweep finds it stale).

Windows that close are held until `close_pending()`, which judges them all
in one stacked pass: at a window boundary every GPU of the fleet closes one.
"""
from __future__ import annotations

import time

import numpy as np

from .classify import Classification, classify_many
from .features import compute_windows, device_facts, feature_matrix, stack
from .ingest import DecodedBatch
from .roofline import datasheet_peaks


_UNKNOWN = device_facts({})
_MEASURED = 5           # device_facts' place of the measured HBM ceiling


class _Acc:
    """A window filling: one is made per GPU per window, 3,200 a second at
    2,000 agents (a dataclass with factory defaults cost 3% of the analysis)."""
    __slots__ = ("start", "arrived", "t", "rows", "job", "owner")

    def __init__(self, start: float) -> None:
        self.start = start
        self.arrived = 0.0             # analyzer's wall clock at the latest chunk
        self.t: list[np.ndarray] = []
        self.rows: list[tuple[tuple[str, ...], np.ndarray]] = []   # (metric names, matrix)
        self.job = ""
        self.owner: dict[str, str] = {}     # the job's attribution


class LiveWindows:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._acc: dict[tuple[str, int], _Acc] = {}
        self._closing: list[tuple[tuple[str, int], _Acc]] = []
        self.devices: dict[tuple[str, int], tuple[float, ...]] = {}     # features.device_facts of each GPU
        self._seen: dict[tuple[str, int], tuple] = {}      # the DeviceFacts behind each entry of devices
        # each calibrated GPU's measured HBM ceiling, bytes/s, by UUID (the analyzer keeps it current)
        self.hbm_measured: dict[str, float] = {}
        self.late_samples = 0

    def add(self, b: DecodedBatch, now: float | None = None) -> dict[int, float]:
        """Takes a committed batch; windows it completes wait for
        close_pending(). Returns each GPU's newest sample time in it."""
        for d in b.devices:
            key = (b.host, d.gpu)
            if self._seen.get(key) != d:     # every batch repeats its devices; they seldom change
                self._seen[key] = d
                sheet = datasheet_peaks(d.name)
                self.devices[key] = device_facts(dict(
                    pcie_generation=d.pcie_generation, pcie_width=d.pcie_width,
                    pcie_max_generation=d.pcie_max_generation, pcie_busy_generation=d.pcie_busy_generation,
                    pcie_busy_width=d.pcie_busy_width, power_limit_watts=d.power_limit_watts,
                    hbm_datasheet_bytes_per_s=sheet[1].bytes_per_s if sheet else None))
        newest: dict[int, float] = {}
        if not b.count:
            return newest
        now = time.time() if now is None else now
        order = np.lexsort((b.t, b.gpu))          # by GPU, then time
        t, gpu = b.t[order], b.gpu[order]
        bucket = np.floor(t / self.window_s)
        # each run of one GPU's window, its bounds and numbers as Python values at once: numpy's
        # scalars and np.diff, per run, were most of this function's time
        cuts = np.flatnonzero((gpu[1:] != gpu[:-1]) | (bucket[1:] != bucket[:-1])) + 1
        lows = np.concatenate(([0], cuts))
        highs = np.append(cuts, len(t))
        names, matrix = b.names, b.values[order]
        for lo, hi, g, start, last in zip(lows.tolist(), highs.tolist(), gpu[lows].tolist(),
                                          (bucket[lows] * self.window_s).tolist(), t[highs - 1].tolist()):
            newest[g] = last
            key = (b.host, g)
            acc = self._acc.get(key)
            if acc is not None and start < acc.start:
                self.late_samples += hi - lo      # stored, but its window is already judged
                continue
            if acc is not None and start > acc.start:
                self._closing.append((key, self._acc.pop(key)))
                acc = None
            if acc is None:
                acc = self._acc[key] = _Acc(start)
            acc.arrived = now
            acc.t.append(t[lo:hi])
            acc.rows.append((names, matrix[lo:hi]))
            if g in b.job:
                acc.job, acc.owner = b.job[g], b.owner.get(g, {})
        return newest

    def close_pending(self) -> list[tuple[str, Classification, str, dict[str, str]]]:
        """Judges every window completed since the last call: (host,
        classification, job, the job's attribution), in arrival order (time
        order per GPU)."""
        closing, self._closing = self._closing, []
        if not closing:
            return []
        parts = []
        for key, acc in closing:
            facts = self.devices.get(key, _UNKNOWN)
            if self.hbm_measured:
                seen = self._seen.get(key)
                measured = self.hbm_measured.get(seen.uuid if seen is not None else "")
                if measured:
                    facts = facts[:_MEASURED] + (float(measured),) + facts[_MEASURED + 1:]
            parts.append((key[1], acc.start, acc.start + self.window_s, acc.t, acc.rows, facts))
        s = stack(parts)
        matrix = feature_matrix(s)
        judged = [(i, w) for i, w in enumerate(compute_windows(s, matrix)) if w is not None]
        if not judged:
            return []
        rows = [i for i, _ in judged]
        verdicts = classify_many([w for _, w in judged], matrix[rows])
        return [(closing[i][0][0], c, closing[i][1].job, closing[i][1].owner) for i, c in zip(rows, verdicts)]

    def sweep(self, now: float, grace_windows: float = 2.0) -> list[tuple[str, Classification, str, dict[str, str]]]:
        """Close windows of GPUs that stopped sending (host down, GPU lost).
        Judged by when data last *arrived*, on the analyzer's clock, so an
        agent whose clock disagrees with ours, or a replay of old samples,
        is not mistaken for a silent host."""
        for key in [k for k, a in self._acc.items() if a.arrived + self.window_s * (1 + grace_windows) < now]:
            self._closing.append((key, self._acc.pop(key)))
        return self.close_pending()
