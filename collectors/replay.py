"""Replay collector: plays a recording as if its GPUs were on this host.

Two time bases. "wall" (the default, for `gpuscope up`): sample times are
the wall clock at which each row is played, so the analyzer sees a live
host; at speed X time runs X times faster and cumulative counters are
rescaled so their rates stay those of the recording. "recording": sample
times keep the recording's own spacing, placed so that no sample is ever in
the future, and rows are played X times faster than they were recorded; one
pass, no loop (benchmarks of detection at speed use it: a classification
window then covers what it covered when recorded).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import catalogue as cat
from .counters import increments
from .recording import Recording
from .records import DeviceInfo, GpuSample, Scrape


class ReplayCollector:
    def __init__(self, recording: Recording, speed: float = 1.0, loop: bool = True,
                 clock: Callable[[], float] = time.time, timebase: str = "wall"):
        if not speed > 0:
            raise ValueError(f"--speed must be > 0, got {speed}")
        if timebase not in ("wall", "recording"):
            raise ValueError(f"timebase must be wall or recording, got {timebase!r}")
        self.recording = recording
        self.timebase = timebase
        self.speed = speed if timebase == "wall" else 1.0     # counters keep their rates in recording time
        self.play_speed = speed
        self.loop = loop and timebase == "wall"
        self._clock = clock
        self._names = list(recording.metrics)
        self._values = np.column_stack([self._time_scaled(n) for n in self._names]) \
            if self._names else np.empty((len(recording), 0))
        t = recording.t
        self._offsets = (t - t[0]) / speed
        self._rec_offsets = t - t[0]
        step = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
        self._loop_span = self._offsets[-1] + step / speed
        self._w0 = 0.0
        self._cursor = 0
        self.loops = 0

    def _time_scaled(self, name: str) -> np.ndarray:
        v = self.recording.metrics[name]
        m = cat.BY_NAME[name]
        if m.kind is not cat.Kind.COUNTER:
            return v
        out = np.full_like(v, np.nan)
        for g in np.unique(self.recording.gpu):
            idx = np.flatnonzero((self.recording.gpu == g) & ~np.isnan(v))
            if len(idx) == 0:
                continue
            inc = np.nan_to_num(increments(v[idx], m.wrap_bits), nan=0.0) / self.speed
            out[idx] = v[idx[0]] + np.concatenate(([0.0], np.cumsum(inc)))
        return out

    def start(self) -> None:
        self._w0 = self._clock()

    def devices(self) -> list[DeviceInfo]:
        gpm = any(n.startswith("gpm_") for n in self._names)
        name = f"replay of {self.recording.path.rsplit('/', 1)[-1]}"
        return [DeviceInfo(gpu=g, uuid=f"replay-{g}", name=name, gpm_supported=gpm,
                           source="replay" + (" (GPM)" if gpm else ""))
                for g in self.recording.gpus()]

    def scrape(self) -> Scrape:
        scrape = Scrape()
        now = self._clock()
        rec = self.recording
        n = len(rec)
        while True:
            due = now - self._w0
            end = int(np.searchsorted(self._offsets, due, side="right"))
            for i in range(self._cursor, end):
                row = self._values[i]
                values = {name: float(x) for name, x in zip(self._names, row) if x == x}
                t = (self._w0 + float(self._offsets[i]) if self.timebase == "wall"
                     else self._w0 - float(self._rec_offsets[-1]) + float(self._rec_offsets[i]))
                scrape.samples.append(GpuSample(int(rec.gpu[i]), t, values, rec.processes[i]))
            self._cursor = max(self._cursor, end)
            if self._cursor < n or not self.loop or due < self._loop_span:
                return scrape
            self._w0 += self._loop_span
            self._cursor = 0
            self.loops += 1

    def scrape_slow(self) -> Scrape:
        return Scrape()

    def close(self) -> None:
        pass
