import csv
import gzip

import numpy as np
import pytest

from gpuscope.collectors.recording import RecordingError, default_recording, read_recording
from gpuscope.collectors.replay import ReplayCollector
from tests.conftest import SAMPLES


def _rewrite(tmp_path, name, transform):
    rows = list(csv.reader(open(SAMPLES)))
    out = tmp_path / name
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows(transform(rows))
    return out


def test_reads_the_real_recording(fixture_dir):
    r = read_recording(SAMPLES)
    assert len(r) == 904 and r.gpus() == [0]
    assert np.nanmax(r.metrics["util_gpu_ratio"]) <= 1.0
    assert r.processes[100][0].used_memory_bytes > 0


def test_bundled_demo_data_is_the_recording_without_labels(fixture_dir):
    header = gzip.open(default_recording(), "rt").readline()
    assert "phase" not in header
    assert len(read_recording(default_recording())) == len(read_recording(SAMPLES))


def test_any_column_order_and_subset(fixture_dir, tmp_path):
    keep = ["util_mem", "t", "util_gpu"]

    def shuffle(rows):
        idx = [rows[0].index(k) for k in keep]
        return [[r[i] for i in idx] for r in rows]
    r = read_recording(_rewrite(tmp_path, "sub.csv", shuffle))
    assert set(r.metrics) == {"util_gpu_ratio", "util_mem_ratio"}
    full = read_recording(SAMPLES)
    assert np.allclose(r.metrics["util_gpu_ratio"], full.metrics["util_gpu_ratio"])


def test_several_gpus(fixture_dir, tmp_path):
    def two_gpus(rows):
        out = [rows[0] + ["gpu"]]
        for r in rows[1:]:
            out += [r + ["0"], r + ["1"]]
        return out
    r = read_recording(_rewrite(tmp_path, "two.csv", two_gpus))
    assert r.gpus() == [0, 1] and len(r) == 2 * 904


def test_truncated_row_names_the_line(fixture_dir, tmp_path):
    path = tmp_path / "cut.csv"
    text = SAMPLES.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(RecordingError, match=r"cut.csv:\d+: .*truncated"):
        read_recording(path)


def test_garbled_value_names_line_and_column(fixture_dir, tmp_path):
    def garble(rows):
        rows[10][rows[0].index("util_gpu")] = "9x5"
        return rows
    with pytest.raises(RecordingError, match=r":11, column util_gpu: '9x5' is not a number"):
        read_recording(_rewrite(tmp_path, "bad.csv", garble))


@pytest.mark.parametrize("content,match", [(b"", "empty file"), (b"a,b\n1,2\n", "no 't' column"),
                                           (b"\x1f\x8b\x08\x00garbage", "gzip"),
                                           (b"t,util_gpu\n", "no samples")])
def test_broken_files(tmp_path, content, match):
    p = tmp_path / "x.csv"
    p.write_bytes(content)
    with pytest.raises(RecordingError, match=match):
        read_recording(p)


def test_replay_keeps_counter_rates_at_any_speed(fixture_dir):
    rec = read_recording(SAMPLES)
    clock = [1000.0]
    rp = ReplayCollector(rec, speed=10.0, loop=False, clock=lambda: clock[0])
    rp.start()
    clock[0] += 100.0
    samples = rp.scrape().samples
    assert len(samples) == len(rec)
    t = np.array([s.t for s in samples])
    assert t[-1] - t[0] == pytest.approx((rec.t[-1] - rec.t[0]) / 10, rel=1e-6)
    tx = np.array([s.values.get("pcie_tx_bytes_total", np.nan) for s in samples])
    from gpuscope.collectors.counters import rate
    assert rate(t, tx, None) == pytest.approx(rate(rec.t, rec.metrics["pcie_tx_bytes_total"], 32), rel=1e-6)


def test_replay_loops_and_time_moves_forward(fixture_dir):
    rec = read_recording(SAMPLES)
    clock = [0.0]
    rp = ReplayCollector(rec, speed=100.0, clock=lambda: clock[0])
    rp.start()
    ts = []
    for _ in range(30):
        clock[0] += 0.1
        ts += [s.t for s in rp.scrape().samples]
    assert rp.loops >= 2 and all(b > a for a, b in zip(ts, ts[1:]))
