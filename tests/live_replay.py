"""Feeding a recording through the live path (decode -> windows -> findings)
on its own timestamps, without servers or wall-clock waits. Used to check
detection latency on recordings, in tests and benchmarks."""
from __future__ import annotations

import numpy as np

from gpuscope.analyzers.findings import FindingsTracker
from gpuscope.analyzers.ingest import decode
from gpuscope.analyzers.live import LiveWindows
from gpuscope.collectors.recording import Recording
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch


def replay_findings(rec: Recording, window_s: float, batch_s: float = 1.0, host: str = "replay") -> list[dict]:
    """Every finding state change, in order, each with `seen_at`: the sample
    time of the batch after which the analyzer knew it."""
    # the agent's own encoder and the analyzer's decoder: the wire path is real
    live, tracker = LiveWindows(window_s), FindingsTracker()
    devices = [DeviceInfo(gpu=g) for g in rec.gpus()]
    names = list(rec.metrics)
    events = []
    edges = np.arange(rec.t[0], rec.t[-1] + batch_s, batch_s)
    seq = 0
    for lo, hi in zip(edges, edges[1:]):
        idx = np.flatnonzero((rec.t >= lo) & (rec.t < hi))
        if not len(idx):
            continue
        samples = [GpuSample(int(rec.gpu[i]), float(rec.t[i]),
                             {n: float(rec.metrics[n][i]) for n in names if rec.metrics[n][i] == rec.metrics[n][i]},
                             rec.processes[i]) for i in idx]
        seq += 1
        batch = encode_batch(host, "replay", seq, samples, devices)
        live.add(decode(batch, now=float(rec.t[idx[-1]])))       # judged at the recording's own time
        for h, c, job, owner in live.close_pending():
            for f in tracker.observe(h, c, job, owner):
                events.append(dict(f, seen_at=float(rec.t[idx[-1]])))
    return events
