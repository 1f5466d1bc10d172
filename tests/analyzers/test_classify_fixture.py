"""The real H200 recording: every window inside a labelled phase gets the
README's verdict, with and without GPM, at several window lengths."""
import csv

import pytest

from gpuscope.analyzers.offline import classify_recording
from gpuscope.collectors.recording import read_recording
from tests.conftest import SAMPLES

EXPECTED = {
    "idle": {"idle"}, "matmul_bf16": {"compute-bound"}, "hbm_stream": {"memory-bound"},
    "decode_gemv": {"memory-bound"}, "launch_bound": {"launch-bound", "host-bound"},
    "host_stall": {"launch-bound", "host-bound"}, "pcie_h2d_d2h": {"communication-bound"},
    "train_mlp": {"compute-bound"}, "idle_end": {"idle"},
}


def _inside(phases, start, end):
    for p in phases:
        if start >= p["start"] and end <= p["end"]:
            return p["phase"]
    return None


def _check(windows, phases, minimum_per_phase=1):
    seen = {}
    wrong = []
    for w in windows:
        phase = _inside(phases, w.start, w.end)
        if phase is None:
            continue
        seen[phase] = seen.get(phase, 0) + 1
        if w.verdict not in EXPECTED[phase]:
            wrong.append((phase, w.start, w.verdict, w.summary))
    assert not wrong, wrong
    return seen


@pytest.mark.parametrize("window_s", [1.0, 2.0, 3.0, 5.0])
def test_every_phase_gets_its_verdict(fixture_dir, phases, window_s):
    seen = _check(classify_recording(read_recording(SAMPLES), window_s), phases)
    assert set(seen) >= set(EXPECTED) - ({"idle_end", "idle"} if window_s >= 3 else set())


def test_power_capped_flag_in_the_compute_phases(fixture_dir, phases):
    for w in classify_recording(read_recording(SAMPLES), 2.0):
        phase = _inside(phases, w.start, w.end)
        if phase in ("matmul_bf16", "train_mlp"):
            assert "power-capped" in w.flags
        if phase in ("idle", "hbm_stream", "host_stall"):
            assert "power-capped" not in w.flags


def _without(tmp_path, prefixes):
    rows = list(csv.reader(open(SAMPLES)))
    keep = [i for i, h in enumerate(rows[0]) if not h.startswith(prefixes)]
    out = tmp_path / "reduced.csv"
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows([[r[i] for i in keep] for r in rows])
    return read_recording(out)


def test_plain_nvml_without_gpm(fixture_dir, phases, tmp_path):
    seen = _check(classify_recording(_without(tmp_path, ("gpm_",)), 2.0), phases)
    assert set(seen) == set(EXPECTED)


def test_without_gpm_or_process_cpu_busy_phases_still_right(fixture_dir, phases, tmp_path):
    rec = _without(tmp_path, ("gpm_", "proc_cpu_pct"))
    for w in classify_recording(rec, 2.0):
        phase = _inside(phases, w.start, w.end)
        if phase in ("matmul_bf16", "train_mlp", "hbm_stream", "decode_gemv", "pcie_h2d_d2h", "idle"):
            assert w.verdict in EXPECTED[phase], (phase, w.verdict)


def test_phase_column_is_never_read(fixture_dir, tmp_path):
    rows = list(csv.reader(open(SAMPLES)))
    i = rows[0].index("phase")
    for r in rows[1:]:
        r[i] = "compute-bound"
    out = tmp_path / "lying.csv"
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    a = [(w.start, w.verdict) for w in classify_recording(read_recording(out), 2.0)]
    b = [(w.start, w.verdict) for w in classify_recording(read_recording(SAMPLES), 2.0)]
    assert a == b


def test_launch_and_host_starvation_name_each_other_as_alternative(fixture_dir, phases):
    for w in classify_recording(read_recording(SAMPLES), 2.0):
        if w.verdict in ("launch-bound", "host-bound"):
            assert set(w.alternatives) == {"launch-bound", "host-bound"} - {w.verdict}
            assert "starved by the host" in w.summary


def test_window_bounds():
    rec = read_recording(SAMPLES)
    with pytest.raises(ValueError, match="1 to 60"):
        classify_recording(rec, 0.5)
    with pytest.raises(ValueError, match="1 to 60"):
        classify_recording(rec, 61)
