"""nvidia-smi's CSV read as a recording: with and without units, missing
values, and clear errors for what cannot be read."""
import time

import numpy as np
import pytest

from gpuscope.collectors.recording import RecordingError, read_recording

HEADER = ("timestamp, index, utilization.gpu [%], utilization.memory [%], power.draw [W], clocks.sm [MHz], "
          "memory.used [MiB], temperature.gpu, clocks_event_reasons.active, pstate")


def test_units_missing_values_and_two_gpus(tmp_path):
    p = tmp_path / "gpus.csv"
    p.write_text(HEADER + "\n"
                 "2026/11/30 12:00:00.250, 0, 96 %, 35 %, 690.50 W, 1980 MHz, 80000 MiB, 62, 0x0000000000000004, P0\n"
                 "2026/11/30 12:00:00.250, 1, 0 %, 0 %, [N/A], 345 MHz, 0 MiB, 30, [Not Supported], P8\n")
    r = read_recording(p)
    assert r.gpus() == [0, 1] and r.ignored_columns == ["pstate"]
    assert r.t[0] == pytest.approx(time.mktime(time.strptime("2026/11/30 12:00:00", "%Y/%m/%d %H:%M:%S")) + 0.25)
    m = r.metrics
    assert m["util_gpu_ratio"][0] == pytest.approx(0.96) and m["power_watts"][0] == pytest.approx(690.5)
    assert m["sm_clock_hertz"][0] == 1.98e9 and m["mem_used_bytes"][0] == 80000 * 2**20
    assert m["temp_celsius"][0] == 62 and m["clock_event_reasons"][0] == 4
    assert np.isnan(m["power_watts"][1]) and np.isnan(m["clock_event_reasons"][1])       # missing, not zero


def test_nounits_reads_the_same(tmp_path):
    p = tmp_path / "gpus.csv"
    p.write_text("timestamp, index, utilization.gpu, power.draw, memory.used\n"
                 "2026/11/30 12:00:00.000, 0, 96, 690.5, 80000\n")
    r = read_recording(p)
    assert r.metrics["util_gpu_ratio"][0] == pytest.approx(0.96) and r.metrics["mem_used_bytes"][0] == 80000 * 2**20


@pytest.mark.parametrize("text, words", [
    (HEADER.split(", pstate")[0] + "\n2026/11/30 12:00:00.000, 0, 96 %, 35 %, lots W, 1980 MHz, 1 MiB, 62, 0x0\n",
     ":2, column power.draw: 'lots W' is not a number"),
    ("timestamp, index, power.draw [W]\nyesterday, 0, 1 W\n", "column timestamp: 'yesterday'"),
    ("timestamp, index, power.draw [W]\n2026/11/30 12:00:00.000, 0, 1 furlong\n", "unit 'furlong'"),
    ("timestamp, index, power.draw [W]\n2026/11/30 12:00:00.000, x, 1 W\n", "column index: 'x' is not a GPU index"),
    ("timestamp, index, power.draw [W]\n2026/11/30 12:00:00.000, 0\n", ":2: 2 cells where the header has 3"),
    ("2026/11/30 12:00:00.000, 0, 96 %\n", "without its header"),
])
def test_what_cannot_be_read_is_named(tmp_path, text, words):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(RecordingError, match=words.replace("(", r"\(").replace(")", r"\)")):
        read_recording(p)


def test_classify_reads_an_nvidia_smi_log(tmp_path):
    import subprocess
    import sys
    rows = [HEADER]
    t0 = time.mktime(time.strptime("2026/11/30 12:00:00", "%Y/%m/%d %H:%M:%S"))
    for i in range(30):
        ts = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0 + i)) + ".100"
        rows.append(f"{ts}, 0, 96 %, 30 %, 690.5 W, 1980 MHz, 80000 MiB, 62, 0x0000000000000000, P0")
        rows.append(f"{ts}, 1, 0 %, 0 %, 70.0 W, 345 MHz, 0 MiB, 30, 0x0000000000000001, P8")
    p = tmp_path / "gpus.csv"
    p.write_text("\n".join(rows) + "\n")
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "classify", str(p)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    verdicts = {line.split()[0]: line.split()[2] for line in out.stdout.splitlines()}
    assert verdicts == {"gpu0": "compute-bound", "gpu1": "idle"}


def test_windows_without_an_activity_reading_are_said_not_dropped(tmp_path):
    """Found in a trial: a stretch of `[N/A]` (a GPU fallen off the bus, a
    driver reload) vanished from classify's output without a word."""
    import json
    import subprocess
    import sys
    t0 = time.mktime(time.strptime("2026/11/30 12:00:00", "%Y/%m/%d %H:%M:%S"))
    rows = [HEADER]
    for i in range(15):
        ts = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0 + i)) + ".000"
        cells = "[N/A], [N/A], [N/A], [N/A]" if 5 <= i < 10 else "96 %, 30 %, 690.5 W, 1980 MHz"
        rows.append(f"{ts}, 0, {cells}, 80000 MiB, 62, 0x0000000000000000, P0")
    p = tmp_path / "gaps.csv"
    p.write_text("\n".join(rows) + "\n")
    cli = [sys.executable, "-m", "gpuscope.daemon.cli", "classify", str(p)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 3, out
    assert "no activity reading in this window" in lines[1] and lines[1].startswith("gpu0 12:00:05 -")
    assert "1 of 3 windows not judged" in out.stderr and "columns not read: pstate" in out.stderr
    data = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=60).stdout)
    assert [w["start"] - t0 for w in data["unjudged"]] == [5.0] and len(data["windows"]) == 2
    assert data["ignored_columns"] == ["pstate"]


def _log(tmp_path, lines, name="gpus.csv", end="\n"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + end)
    return p


def _row(i, gpu=0):
    t0 = time.mktime(time.strptime("2026/11/30 12:00:00", "%Y/%m/%d %H:%M:%S"))
    ts = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0 + i)) + ".100"
    return f"{ts}, {gpu}, 96 %, 30 %, 690.5 W, 1980 MHz, 80000 MiB, 62, 0x0000000000000000, P0"


def test_a_truncated_last_line_is_dropped_with_a_warning_that_names_it(tmp_path):
    """Found in a trial: `nvidia-smi -l` killed mid-write left a short last
    line and the whole log was refused (`trunc.csv:122: 3 cells where the
    header has 6`)."""
    rows = [HEADER] + [_row(i) for i in range(5)]
    p = _log(tmp_path, rows + [_row(5)[:30]], "trunc.csv", end="")
    r = read_recording(p)
    assert len(r) == 5
    assert len(r.warnings) == 1 and f"{p}:7" in r.warnings[0] and "dropped" in r.warnings[0]
    assert read_recording(_log(tmp_path, rows, "whole.csv")).warnings == []


def test_a_truncated_line_in_the_middle_is_still_an_error(tmp_path):
    rows = [HEADER, _row(0), _row(1)[:30], _row(2)]
    with pytest.raises(RecordingError, match=r"mid.csv:3: 3 cells where the header has 10"):
        read_recording(_log(tmp_path, rows, "mid.csv"))


def test_logs_appended_with_a_repeated_header_read_through(tmp_path):
    """`nvidia-smi ... >> gpus.csv` run twice writes the header twice."""
    nounits = HEADER.replace(" [%]", "").replace(" [W]", "").replace(" [MHz]", "").replace(" [MiB]", "")
    rows = [HEADER, _row(0), _row(1), HEADER, _row(2), nounits,
            _row(3).replace(" %", "").replace(" W", "").replace(" MHz", "").replace(" MiB", "")]
    r = read_recording(_log(tmp_path, rows))
    assert len(r) == 4 and r.warnings == []
    assert r.metrics["util_gpu_ratio"] == pytest.approx([0.96] * 4)
    assert r.metrics["mem_used_bytes"] == pytest.approx([80000 * 2**20] * 4)


def test_a_header_of_other_fields_mid_file_is_an_error_naming_the_line(tmp_path):
    rows = [HEADER, _row(0), "timestamp, index, power.draw [W]", "2026/11/30 12:00:05.000, 0, 1 W"]
    with pytest.raises(RecordingError,
                       match=r"other.csv:3: a header with other fields than line 1.s \(without utilization.gpu, "):
        read_recording(_log(tmp_path, rows, "other.csv"))


def test_classify_says_the_dropped_line_on_stderr(tmp_path):
    import subprocess
    import sys
    rows = [HEADER] + [_row(i) for i in range(20)]
    p = _log(tmp_path, rows + [_row(20)[:30]], "trunc.csv", end="")
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "classify", str(p)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"{p}:22" in out.stderr and "compute-bound" in out.stdout


def test_classify_of_a_directory_says_it_reads_one_file(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "classify", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Errno" not in out.stderr
    assert f"{tmp_path}: is a directory: classify reads one recording file" in out.stderr
    assert "(docs/recordings.md)" in out.stderr
