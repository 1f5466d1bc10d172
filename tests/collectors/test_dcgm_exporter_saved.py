"""dcgm-exporter's metrics saved over time, read as a recording: scrapes
concatenated in a text file (times from Prometheus timestamps or from
comments between scrapes) and Prometheus' query_range JSON; what cannot be
read is refused with file, line and what to do."""
import datetime
import gzip
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from gpuscope.analyzers.offline import classify_recording
from gpuscope.collectors import dcgm_fields
from gpuscope.collectors.dcgm_exporter_saved import LOOP
from gpuscope.collectors.recording import Recording, RecordingError, default_recording, read_recording

T0 = 1764547200.0          # 2025-12-01T00:00:00Z


def labels(gpu=0, host="h1", uuid=True, index=True, **extra):
    out = {}
    if index:
        out["gpu"] = str(gpu)
    if uuid:
        out["UUID"] = f"GPU-{gpu:08x}-aaaa"
    out |= {"device": f"nvidia{gpu}", "modelName": "NVIDIA H200", "Hostname": host,
            "DCGM_FI_DRIVER_VERSION": "580.95.05"} | extra
    return out


def line(name, value, ts_ms=None, **kw):
    lab = ",".join(f'{k}="{v}"' for k, v in labels(**kw).items())
    return f"{name}{{{lab}}} {value}" + (f" {ts_ms}" if ts_ms is not None else "")


def scrape(values: dict, gpus=(0,), **kw) -> str:
    """One exposition as dcgm-exporter writes it: HELP and TYPE, then a line per GPU."""
    out = []
    for name, value in values.items():
        out += [f"# HELP {name} help text (in %).", f"# TYPE {name} gauge"]
        out += [line(name, value, gpu=g, **kw) for g in gpus]
    return "\n".join(out) + "\n"


GOOD = line("DCGM_FI_DEV_GPU_UTIL", 1)


def write(tmp_path, text, name="saved.prom"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_time_comments_place_each_scrape(tmp_path):
    iso = datetime.datetime.fromtimestamp(T0 + 1, datetime.timezone.utc).isoformat()        # date -Is
    local = datetime.datetime.fromtimestamp(T0 + 3).strftime("%Y-%m-%dT%H:%M:%S")           # no offset: local
    text = "".join(f"{stamp}\n" + scrape({"DCGM_FI_DEV_GPU_UTIL": 90 + i, "DCGM_FI_PROF_SM_ACTIVE": 0.5,
                                          "DCGM_FI_DEV_FB_USED": 1024, "DCGM_FI_DEV_FB_FREE": 7}, gpus=(0, 1))
                   for i, stamp in enumerate([f"# {T0:.6f}", f"# {iso}", "# time: 2025-12-01T00:00:02Z",
                                              f"# {local}"]))
    r = read_recording(write(tmp_path, text))
    assert r.t.tolist() == [T0, T0, T0 + 1, T0 + 1, T0 + 2, T0 + 2, T0 + 3, T0 + 3]
    assert r.gpu.tolist() == [0, 1] * 4
    assert r.metrics["util_gpu_ratio"].tolist() == pytest.approx([0.90, 0.90, 0.91, 0.91, 0.92, 0.92, 0.93, 0.93])
    assert r.metrics["gpm_sm_util_ratio"][0] == 0.5 and r.metrics["mem_used_bytes"][0] == 1024 * 2 ** 20
    assert r.ignored_columns == ["DCGM_FI_DEV_FB_FREE"]


@pytest.mark.parametrize("comment, t", [
    ("# 1764547200", T0), ("# 1764547200.25", T0 + 0.25), ("# time: 1764547200", T0), ("#t=1764547200", T0),
    ("# time 2025-12-01T00:00:00Z", T0), ("# 2025-12-01T00:00:00,250000000+00:00", T0 + 0.25),   # date -Ins
    ("# 2025-12-01 01:00:00.5+01:00", T0 + 0.5), ("\ufeff# 2025-12-01T00:00:00+0000", T0),       # date +%FT%T%z
])
def test_time_comment_forms(tmp_path, comment, t):
    r = read_recording(write(tmp_path, f"{comment}\n# a comment of the user's own\n# time to go\n{GOOD}\n"))
    assert r.t.tolist() == [t]


def test_prometheus_timestamps_win_over_comments(tmp_path):
    text = (f"# {T0}\n" + line("DCGM_FI_DEV_GPU_UTIL", 50, ts_ms=int((T0 + 10) * 1000)) + "\n"
            + line("DCGM_FI_DEV_POWER_USAGE", 650.5) + "\n")        # no timestamp: the comment's time
    r = read_recording(write(tmp_path, text))
    assert r.t.tolist() == [T0, T0 + 10]
    assert math.isnan(r.metrics["util_gpu_ratio"][0]) and r.metrics["power_watts"][0] == 650.5
    assert r.metrics["util_gpu_ratio"][1] == 0.5


def test_timestamps_alone_need_no_comments_and_repeats_are_scrapes(tmp_path):
    text = "".join(line("DCGM_FI_DEV_GPU_UTIL", 10 * i, ts_ms=int((T0 + i) * 1000)) + "\n" for i in range(5))
    r = read_recording(write(tmp_path, text))
    assert r.t.tolist() == [T0 + i for i in range(5)]
    assert r.metrics["util_gpu_ratio"].tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])


def test_blank_and_nan_values_are_missing_and_strings_are_not_parsed(tmp_path):
    text = (f"# {T0}\n" + line("DCGM_FI_DEV_GPU_UTIL", "NaN") + "\n" + line("DCGM_FI_DEV_POWER_USAGE", "") + "\n"
            + line("DCGM_FI_DEV_NAME", "NVIDIA H200") + "\n" + line("DCGM_FI_DEV_SM_CLOCK", 1980) + "\n"
            + line("DCGM_FI_DEV_MEM_CLOCK", "+Inf") + "\n")
    r = read_recording(write(tmp_path, text))
    m = r.metrics
    assert math.isnan(m["util_gpu_ratio"][0]) and math.isnan(m["power_watts"][0])
    assert math.isnan(m["mem_clock_hertz"][0]) and m["sm_clock_hertz"][0] == 1.98e9
    assert r.ignored_columns == ["DCGM_FI_DEV_NAME"]


def test_dcgm_blank_sentinels_are_missing_by_the_field_type(tmp_path):
    # older dcgm-exporters write DCGM's "no value" codes as numbers (its README: MEMORY_TEMP 9223372036854775794);
    # 2^47 is the double fields' blank, but a real value of an int64 counter (ns of throttling after 39 h)
    text = (f"# {T0}\n" + line("DCGM_FI_DEV_MEMORY_TEMP", 9223372036854775794) + "\n"
            + line("DCGM_FI_DEV_POWER_USAGE", 140737488355328.0) + "\n"
            + line("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", 2 ** 47 + 5) + "\n")
    m = read_recording(write(tmp_path, text)).metrics
    assert math.isnan(m["mem_temp_celsius"][0]) and math.isnan(m["power_watts"][0])
    assert m["throttle_sw_power_cap_seconds_total"][0] == pytest.approx((2 ** 47 + 5) * 1e-9)


def test_a_gpus_own_series_wins_over_a_pods_share_and_lowercase_hostname_is_the_host(tmp_path):
    # dcgm-exporter's per-process mapping of a shared GPU: each pod's share of GPU_UTIL, and the GPU's own
    # series beside them, after them in the file; `hostname` is the host label from 2026 on
    text = (f"# {T0}\n" + line("DCGM_FI_DEV_GPU_UTIL", 30, pod="a", namespace="ns", container="c") + "\n"
            + line("DCGM_FI_DEV_GPU_UTIL", 50, pod="b", namespace="ns", container="c") + "\n"
            + line("DCGM_FI_DEV_GPU_UTIL", 80) + "\n")
    assert read_recording(write(tmp_path, text)).metrics["util_gpu_ratio"].tolist() == pytest.approx([0.8])
    two = "".join(f"# {T0 + i}\n" + line("DCGM_FI_DEV_GPU_UTIL", 1, host="", hostname=h) + "\n"
                  for i, h in enumerate(("n1", "n2")))
    with pytest.raises(RecordingError, match=r"a second host, hostname='n2'"):
        read_recording(write(tmp_path, two))


def test_no_times_refused_with_the_loop_that_records_them(tmp_path):
    plain = scrape({"DCGM_FI_DEV_GPU_UTIL": 90}) * 2            # `while sleep 1; do curl ...; done >> f`
    with pytest.raises(RecordingError, match=r"saved.prom:3: DCGM_FI_DEV_GPU_UTIL has no time") as e:
        read_recording(write(tmp_path, plain))
    assert LOOP in str(e.value)


def test_a_scrape_without_its_own_time_is_refused(tmp_path):
    text = f"# {T0}\n" + scrape({"DCGM_FI_DEV_GPU_UTIL": 90}) + scrape({"DCGM_FI_DEV_GPU_UTIL": 91})
    with pytest.raises(RecordingError, match=r"saved.prom:7: DCGM_FI_DEV_GPU_UTIL repeats with no time comment") as e:
        read_recording(write(tmp_path, text))
    assert LOOP in str(e.value)


def test_two_hosts_refused(tmp_path):
    text = (f"# {T0}\n" + scrape({"DCGM_FI_DEV_GPU_UTIL": 90}, host="h1")
            + scrape({"DCGM_FI_DEV_SM_CLOCK": 1}, host="h2"))
    with pytest.raises(RecordingError, match=r"saved.prom:7: a second host, Hostname='h2' \(the first, 'h1'.*"
                                             r"one host's GPUs; save each node's exporter"):
        read_recording(write(tmp_path, text))
    answer = query_range([({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "instance": f"n{i}:9400"},
                           [[T0, "1"]]) for i in range(2)])
    with pytest.raises(RecordingError, match=r"data.result\[1\]: a second host, instance='n1:9400'.*"
                                             r'Hostname="HOST"'):
        read_recording(write(tmp_path, answer, "q.json"))


def test_uuid_only_gpus_numbered_in_order_of_appearance(tmp_path):
    text = f"# {T0}\n" + "".join(line("DCGM_FI_DEV_GPU_UTIL", 10 * g, gpu=g, index=False) + "\n" for g in (7, 3, 5))
    r = read_recording(write(tmp_path, text))
    assert r.gpus() == [0, 1, 2]
    assert dict(zip(r.gpu.tolist(), r.metrics["util_gpu_ratio"].tolist())) == pytest.approx({0: 0.7, 1: 0.3, 2: 0.5})


def test_a_uuid_seen_with_an_index_keeps_it(tmp_path):
    text = (f"# {T0}\n" + line("DCGM_FI_DEV_GPU_UTIL", 10, gpu=1, index=False) + "\n"
            + line("DCGM_FI_DEV_SM_CLOCK", 1000, gpu=1) + "\n"                 # gpu="1" with the same UUID
            + line("DCGM_FI_DEV_GPU_UTIL", 20, gpu=4, index=False) + "\n")     # unknown UUID: first free index
    r = read_recording(write(tmp_path, text))
    assert r.gpu.tolist() == [0, 1] and r.metrics["util_gpu_ratio"].tolist() == pytest.approx([0.2, 0.1])
    assert r.metrics["sm_clock_hertz"][1] == 1e9


def test_mig_instances_are_not_the_gpu(tmp_path):
    text = (f"# {T0}\n" + line("DCGM_FI_PROF_SM_ACTIVE", 0.9, GPU_I_ID="1", GPU_I_PROFILE="1g.18gb") + "\n"
            + line("DCGM_FI_DEV_GPU_UTIL", 90, GPU_I_ID="") + "\n")
    r = read_recording(write(tmp_path, text))
    assert "gpm_sm_util_ratio" not in r.metrics and r.metrics["util_gpu_ratio"][0] == 0.9
    assert r.ignored_columns == ["DCGM_FI_PROF_SM_ACTIVE (per MIG instance)"]


def query_range(series) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": m, "values": v} for m, v in series]}})


def test_query_range_json_several_series_per_metric(tmp_path):
    pod_a = labels(0, pod="a") | {"__name__": "DCGM_FI_DEV_GPU_UTIL", "instance": "n1:9400"}
    pod_b = labels(0, pod="b") | {"__name__": "DCGM_FI_DEV_GPU_UTIL", "instance": "n1:9400"}
    gpu1 = labels(1) | {"__name__": "DCGM_FI_DEV_GPU_UTIL"}
    sm = labels(1) | {"__name__": "DCGM_FI_PROF_SM_ACTIVE"}
    answer = query_range([(pod_a, [[T0, "95"], [T0 + 1, "NaN"]]), (pod_b, [[T0, "95"], [T0 + 1, "96"]]),
                          (gpu1, [[T0, "3"], [T0 + 1, "4"]]), (sm, [[T0 + 1, "0.02"]]),
                          ({"__name__": "DCGM_FI_DEV_FB_FREE", "gpu": "0"}, [[T0, "1"]])])
    r = read_recording(write(tmp_path, answer, "q.json"))
    assert r.t.tolist() == [T0, T0, T0 + 1, T0 + 1] and r.gpu.tolist() == [0, 1, 0, 1]
    assert r.metrics["util_gpu_ratio"].tolist() == pytest.approx([0.95, 0.03, 0.96, 0.04])
    assert np.isnan(r.metrics["gpm_sm_util_ratio"][:3]).all() and r.metrics["gpm_sm_util_ratio"][3] == 0.02
    assert r.ignored_columns == ["DCGM_FI_DEV_FB_FREE"]


@pytest.mark.parametrize("shape", ["exposition", "query_range"])
def test_gzip(tmp_path, shape):
    text = (f"# {T0}\n" + scrape({"DCGM_FI_DEV_GPU_UTIL": 42}) if shape == "exposition" else
            query_range([(labels(0) | {"__name__": "DCGM_FI_DEV_GPU_UTIL"}, [[T0, "42"]])]))
    p = tmp_path / "saved.gz"
    p.write_bytes(gzip.compress(text.encode()))
    assert read_recording(p).metrics["util_gpu_ratio"].tolist() == [0.42]


@pytest.mark.parametrize("text, words", [
    (f"# {T0}\n{GOOD}\n%%% garbage\n", r":3: '%%% garbage' is neither a metric sample nor a comment"),
    (f"# {T0}\nDCGM_FI_DEV_GPU_UTIL{{gpu=0}} 5\n", r":2: .* is not a Prometheus series \(Invalid labels"),
    (f"# {T0}\n{GOOD[:-1]}lots\n", r":2: value 'lots' is not a number"),
    (f"# {T0}\n{GOOD} 1764547200\n", r":2: timestamp '1764547200' is not Prometheus' \(milliseconds"),
    (f"# {T0}\n{GOOD} 1 2 3\n", r":2: .* is not a value and an optional timestamp"),
    (f"# {T0 * 1000:.0f}\n{GOOD}\n", r":1: '1764547200000' is not Unix seconds .*milliseconds\?"),
    ("# time: yesterday\n" + GOOD + "\n", r":1: 'yesterday' is not a time"),
    ("# 2025-13-45T00:00:00Z\n" + GOOD + "\n", r":1: .* is not an ISO 8601 time"),
    ("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.5\n",
     r"but no series in it is one gpuscope reads \(ignored: node_load1\)"),
    (f"# {T0}\n" + GOOD[:-3] + "\n", r":2: .*its labels are not closed"),
    ("# just a comment\n", r"it holds no samples"),
    ('{"status": "success", "data": ', r"q:1:31: not JSON \(Expecting value\): a Prometheus answer cut short"),
    ("[1, 2]", r"not a Prometheus API answer"),
    ('{"status": "error", "errorType": "bad_data", "error": "parse error"}', r"answered with an error \(bad_data"),
    ('{"status": "success", "data": {"resultType": "vector", "result": []}}', r"an instant query"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": []}]}}',
     r"data.result\[0\]: a series without __name__"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": '
     '"DCGM_FI_DEV_GPU_UTIL", "gpu": "0"}, "values": [[1764547200, "1"], ["x"]]}]}}',
     r"data.result\[0\].values\[1\]: \[\"x\"\] is not \[unix_seconds"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": '
     '"DCGM_FI_DEV_GPU_UTIL", "gpu": "x"}, "values": [[1764547200, "1"]]}]}}', r"label gpu='x' is not a GPU index"),
    (f"# {T0}\n" + line("DCGM_FI_DEV_GPU_UTIL", 1).replace('gpu="0"', 'gpu="99999999999999999999"') + "\n",
     r":2: label gpu='99999999999999999999' is not a GPU index"),
])
def test_what_cannot_be_read_is_named(tmp_path, text, words):
    p = write(tmp_path, text, "q")
    with pytest.raises(RecordingError, match=words):
        read_recording(p)


@pytest.mark.parametrize("data", [b"#\x00\x01\x02binary", b"# \xff\xfe", b"{\x00", b"#" * 100000, b"[" * 100000,
                                  b"DCGM_FI_DEV_GPU_UTIL{", b'{"data": {"resultType": "matrix", "result": [7]}}'])
def test_garbage_is_a_recording_error_not_a_traceback(tmp_path, data):
    p = tmp_path / "garbage"
    p.write_bytes(data)
    with pytest.raises(RecordingError):
        read_recording(p)


# -- the bundled H200 recording, as dcgm-exporter would have exported it --------------------------------------

BY_METRIC = {f.metric: f for f in dcgm_fields.FIELDS}


def _as_dcgm(rec: Recording):
    """(field, [value per row]) for every recording metric DCGM has a field for, in DCGM's unit."""
    return [(BY_METRIC[m], rec.metrics[m] / BY_METRIC[m].scale) for m in rec.metrics if m in BY_METRIC]


def exposition_of(rec: Recording) -> str:
    fields = _as_dcgm(rec)
    out = []
    for i, (t, g) in enumerate(zip(rec.t.tolist(), rec.gpu.tolist())):
        out.append(f"# {t!r}")
        for f, values in fields:
            out += [f"# HELP {f.name} help.", f"# TYPE {f.name} gauge", line(f.name, repr(float(values[i])), gpu=g)]
        out.append(line("DCGM_FI_DEV_NAME", "NVIDIA H200", gpu=g))     # a string field, as the exporter has
    return "\n".join(out) + "\n"


def query_range_of(rec: Recording) -> str:
    series = []
    for f, values in _as_dcgm(rec):
        for g in rec.gpus():
            ok = (rec.gpu == g) & ~np.isnan(values)          # Prometheus leaves out what was not scraped
            series.append((labels(g) | {"__name__": f.name},
                           [[t, repr(float(v))] for t, v in zip(rec.t[ok].tolist(), values[ok].tolist())]))
    return query_range(series)


def dcgm_view(rec: Recording) -> Recording:
    """The recording with only what DCGM's fields carry: what the verdicts of its export must equal."""
    return Recording(rec.path, rec.t, rec.gpu, {m: v for m, v in rec.metrics.items() if m in BY_METRIC})


def _verdicts(windows):
    return [(w["gpu"], round(w["start"], 3), w["verdict"], sorted(w["flags"])) for w in windows]


def test_classify_reads_saved_scrapes(tmp_path):
    rec = read_recording(default_recording())
    p = write(tmp_path, exposition_of(rec))
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "classify", str(p), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["windows"]
    want = [dict(gpu=c.gpu, start=c.start, verdict=c.verdict, flags=c.flags, confidence=c.confidence)
            for c in classify_recording(dcgm_view(rec), 5.0)]
    assert _verdicts(got) == _verdicts(want)
    assert [w["confidence"] for w in got] == pytest.approx([w["confidence"] for w in want], abs=1e-6)
    # meaningful: the recording's phases come through (its GPM pipes and DRAM are DCGM's PROF fields),
    # and only the verdicts that need the host CPU of the GPU's processes, which DCGM does not carry, are lost
    assert {"idle", "compute-bound", "memory-bound", "communication-bound"} <= {w["verdict"] for w in got}
    full = classify_recording(rec, 5.0)
    lost = {c.verdict for c, w in zip(full, got) if c.verdict != w["verdict"]}
    assert len(full) == len(got) and lost <= {"host-bound", "launch-bound"}


def test_query_range_classifies_as_the_scrapes_do(tmp_path):
    rec = read_recording(default_recording())
    from_json = read_recording(write(tmp_path, query_range_of(rec), "q.json"))
    want = [(c.gpu, c.start, c.verdict, c.flags) for c in classify_recording(dcgm_view(rec), 5.0)]
    assert [(c.gpu, c.start, c.verdict, c.flags) for c in classify_recording(from_json, 5.0)] == want
