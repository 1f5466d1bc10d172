"""Anomalies on the real recording: at the phase changes, never inside a
steady phase; and none at all in a long healthy run."""
import numpy as np
import pytest

from gpuscope.analyzers.detector import Detector, DetectorConfig, family
from gpuscope.analyzers.offline import classify_recording
from gpuscope.collectors.recording import Recording, read_recording
from tests.analyzers.test_classify_fixture import EXPECTED
from tests.conftest import SAMPLES


def _anomalies(rec, window_s, cfg):
    det = Detector(cfg)
    out = []
    for c in classify_recording(rec, window_s):
        a = det.observe("h", c, "pid:461 python workload.py")
        if a is not None:
            out.append((c, a))
    return out


@pytest.mark.parametrize("window_s,cfg", [(1.0, DetectorConfig(baseline_windows=6, warmup_windows=3)),
                                           (2.0, DetectorConfig(baseline_windows=4, warmup_windows=2))])
def test_anomalies_at_phase_changes_and_not_inside_phases(fixture_dir, phases, window_s, cfg):
    found = _anomalies(read_recording(SAMPLES), window_s, cfg)
    onsets = [p["start"] for p in phases]
    for c, a in found:
        # every anomaly is within three windows after a phase onset, or in the gap between phases
        inside = [p for p in phases if p["start"] + 3 * window_s < c.start and c.end < p["end"]]
        assert not inside, (a.reason, inside[0]["phase"])
    prev = None
    for p in phases:
        fam = family(next(iter(EXPECTED[p["phase"]])))
        if prev is not None and fam != prev:
            hit = [a for c, a in found if p["start"] - 3 * window_s <= c.start <= p["start"] + 2 * window_s + 1]
            assert hit, f"no anomaly at the onset of {p['phase']}"
        prev = fam
    assert onsets


def _healthy(minutes: float, seed=0) -> Recording:
    """Steady training: the train_mlp phase's counters, tiled, with jitter."""
    rec = read_recording(SAMPLES)
    lo, hi = 1795989677.0, 1795989685.0
    m = (rec.t >= lo) & (rec.t < hi)
    n_src = int(m.sum())
    n = int(minutes * 60 * 10)
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(m)[np.arange(n) % n_src]
    metrics = {}
    for k, v in rec.metrics.items():
        col = v[idx].copy()
        if k.endswith("_ratio") and not k.startswith("gpm_nvlink"):
            col = np.clip(col * rng.normal(1, 0.03, n), 0, 1)
        metrics[k] = col
    t = rec.t[0] + np.arange(n) * 0.1
    # cumulative counters must stay monotonic when tiled: rebuild them from increments
    for k in ("throttle_sw_power_cap_seconds_total", "pcie_tx_bytes_total", "pcie_rx_bytes_total",
              "energy_joules_total"):
        if k in metrics:
            metrics[k] = np.cumsum(np.full(n, np.nanmedian(np.diff(rec.metrics[k][m]) % (2 ** 32))))
    return Recording("healthy", t, np.zeros(n, np.int64), metrics, [rec.processes[i] for i in idx])


def test_thirty_minutes_of_healthy_training_raise_nothing():
    rec = _healthy(30)
    assert not _anomalies(rec, 5.0, DetectorConfig())


def test_one_noisy_window_triggers_nothing():
    rec = _healthy(3)
    col = rec.metrics["gpm_sm_util_ratio"]
    start = np.floor((rec.t[0] + 120) / 5) * 5          # windows are aligned to multiples of 5 s
    col[(rec.t >= start) & (rec.t < start + 5)] = 0.0  # one window of nothing
    assert not _anomalies(rec, 5.0, DetectorConfig())
