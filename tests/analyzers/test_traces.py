"""The real H200 traces: each gets the verdict of its phase, from the XSpace
and from the trace JSON, and bad files get errors that say what is wrong."""
import gzip
import json
import os
import subprocess
import sys
import time

import pytest

from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.trace_files import load_trace, resolve
from gpuscope.collectors.xspace_reader import TraceError, parse_xspace
from gpuscope.xla import xplane_pb2
from tests.conftest import FIXTURE

EXPECTED = {"matmul_bf16": "compute-bound", "hbm_stream": "memory-bound", "launch_bound": "launch-bound",
            "host_stall": "host-bound", "pcie_h2d_d2h": "communication-bound", "train_mlp": "compute-bound"}


def _run_dir(phase):
    return next((FIXTURE / "traces" / phase / "plugins" / "profile").iterdir())


@pytest.mark.parametrize("phase", sorted(EXPECTED))
@pytest.mark.parametrize("fmt", ["vm.xplane.pb", "vm.trace.json.gz", "perfetto_trace.json.gz"])
def test_fixture_traces_get_their_phase_verdict(fixture_dir, phase, fmt):
    s = summarize(load_trace(_run_dir(phase) / fmt))
    assert s["verdict"] == EXPECTED[phase], s["summary"]
    assert s["decided_by"] == "trace" and 0 < s["confidence"] <= 1


def test_remote_capture_of_llm_decode_is_memory_bound_on_the_roofline(fixture_dir):
    s = summarize(load_trace(FIXTURE / "remote"))
    assert s["verdict"] == "memory-bound"
    top = s["top_ops"][0]
    assert top["op"] == "gemm_fusion_dot" and top["bound"] == "memory"
    assert 3.5e12 < top["achieved_bytes_per_s"] < 4.8e12          # the README: 3.85 TB/s
    assert top["intensity_flops_per_byte"] < s["roofline"]["ridge_flops_per_byte"]


def test_matmul_sits_above_the_ridge(fixture_dir):
    s = summarize(load_trace(_run_dir("matmul_bf16") / "vm.xplane.pb"))
    top = s["top_ops"][0]
    assert top["bound"] == "compute" and 5e14 < top["achieved_flops_per_s"] < 8e14   # README: 647 TFLOP/s


def test_launch_bound_numbers(fixture_dir):
    s = summarize(load_trace(_run_dir("launch_bound")))
    assert s["kernels"]["launch_rate_per_s"] > 10_000
    assert s["kernels"]["duration_us"]["p50"] < 5
    assert s["idle_gaps"]["host_caused_fraction"] > 0.9


def test_launch_bound_time_goes_to_dispatch_and_host_stall_time_to_host_work(fixture_dir):
    launch = summarize(load_trace(_run_dir("launch_bound") / "vm.xplane.pb"))["timing"]
    host = summarize(load_trace(_run_dir("host_stall") / "vm.xplane.pb"))["timing"]
    assert launch["idle_causes"]["dispatch"] > 0.6 and host["idle_causes"]["host_work"] > 0.9
    assert host["host_during_idle"][0]["name"].endswith("svd")         # README: a multithreaded SVD
    assert 0.005 < host["excluded"]["profiler_seconds"] < 0.2          # stop_trace: 78 ms


def test_copies_are_measured_against_the_link(fixture_dir):
    """README: 256 MiB host->device and back; pinned copies on a Gen5 x16 link."""
    from gpuscope.analyzers.links import pcie_link
    trace = load_trace(_run_dir("pcie_h2d_d2h") / "vm.xplane.pb")
    s = summarize(trace)
    h2d = s["memcpy"]["memcpy_h2d"]
    assert h2d["bytes"] == 3 * 256 * 2**20 and 0.6 < h2d["link_fraction"] < 1.0
    assert "of a Gen5 ×16 link" in s["summary"] and "assumed from the device name" in s["summary"]
    told = summarize(trace, {0: pcie_link(4, 16)})          # what the agent said beats the name
    assert told["pcie_link"]["source"] == "device info" and told["memcpy"]["memcpy_h2d"]["link_fraction"] > 1.0


@pytest.mark.parametrize("details, expected", [
    ("kind_src:pinned kind_dst:device size:268435456 dest:0 async:1", 268435456.0),
    ("num_bytes:4096 kind:1", 4096.0),
    ("filesize:10 other", None),
    ("size:-5", None),
    ("size:99999999999999999999999", None),
])
def test_copy_sizes_from_either_writers_details(details, expected):
    import math
    from gpuscope.collectors.trace_model import parse_bytes
    got = parse_bytes(details)
    assert (math.isnan(got) if expected is None else got == expected)


def test_directory_resolves_to_the_newest_runs_xspace(fixture_dir, tmp_path):
    src = (_run_dir("matmul_bf16") / "vm.xplane.pb").read_bytes()
    for run in ("2026_01_01_00_00_00", "2026_02_01_00_00_00"):
        d = tmp_path / "plugins" / "profile" / run
        d.mkdir(parents=True)
        (d / "h.xplane.pb").write_bytes(src)
        (d / "h.trace.json.gz").write_bytes(b"")
    assert resolve(tmp_path).parent.name == "2026_02_01_00_00_00" and resolve(tmp_path).name == "h.xplane.pb"


def test_summarizing_the_largest_fixture_is_fast(fixture_dir):
    t0 = time.perf_counter()
    summarize(load_trace(_run_dir("host_stall") / "vm.xplane.pb"))
    assert time.perf_counter() - t0 < 10      # benchmark target is 2 s; this only catches a blow-up


@pytest.mark.parametrize("content,match", [
    (b"", "empty file"),
    (b"\x0a\xff\xff\xff\xff\x0f", "not an XSpace protobuf"),
    (b"hello world", "not an XSpace protobuf|no planes"),
])
def test_bad_xspace(content, match):
    with pytest.raises(TraceError, match=match):
        parse_xspace(content, "x.xplane.pb")


def test_truncated_xspace(fixture_dir):
    data = (_run_dir("host_stall") / "vm.xplane.pb").read_bytes()
    with pytest.raises(TraceError, match="truncated or garbled"):
        parse_xspace(data[: len(data) // 2], "cut.xplane.pb")


@pytest.mark.parametrize("content,match", [
    (gzip.compress(b"{not json"), "not trace-event JSON"),
    (b"\x1f\x8b\x08\x00garbage", "gzip"),
    (gzip.compress(json.dumps({"foo": 1}).encode()), "no traceEvents"),
    (gzip.compress(json.dumps({"traceEvents": [{"ph": "M"}]}).encode()), "no complete"),
])
def test_bad_json(tmp_path, content, match):
    p = tmp_path / "x.trace.json.gz"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=match):
        load_trace(p)


def test_cpu_only_trace_gets_a_partial_summary_that_says_what_is_missing():
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].name = "train_step"
    plane.event_metadata[1].id = 1
    line = plane.lines.add(id=1, name="python3", timestamp_ns=1000)
    line.events.add(metadata_id=1, offset_ps=0, duration_ps=5_000_000)
    s = summarize(parse_xspace(space.SerializeToString(), "cpu.xplane.pb"))
    assert s["verdict"] is None and s["missing"] == ["GPU device plane"]
    assert any("CPU-only" in w for w in s["warnings"])


def test_cli_prints_json_with_verdict_on_top(fixture_dir):
    r = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "trace", "summarize",
                        str(FIXTURE / "traces" / "pcie_h2d_d2h"), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "communication-bound"


def test_a_profiling_session_is_one_trace_per_host_read_from_its_xspace(fixture_dir, tmp_path):
    """Found in a trial: six JAX profiles were `18 traces` (the XSpace, the
    trace JSON and the perfetto trace of each session counted apart)."""
    from gpuscope.collectors.trace_files import profiles_at, traces_at
    found = profiles_at(FIXTURE / "traces")
    assert len(found) == 6 and all(p.path.name == "vm.xplane.pb" for p in found)
    assert found[0].path.parent.name == "2026_11_29_22_01_18"                            # the newest session first
    assert sorted(f.name for f in found[0].same) == ["perfetto_trace.json.gz", "vm.trace.json.gz"]
    assert traces_at(FIXTURE / "traces") == [p.path for p in found]
    # several hosts in one run directory: one trace each; the perfetto trace cannot be told whose
    src = (_run_dir("matmul_bf16") / "vm.xplane.pb").read_bytes()
    run = tmp_path / "plugins" / "profile" / "2026_02_01_00_00_00"
    run.mkdir(parents=True)
    for host in ("h1", "h2"):
        (run / f"{host}.xplane.pb").write_bytes(src)
        (run / f"{host}.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    (run / "perfetto_trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    names = sorted(p.path.name for p in profiles_at(tmp_path))
    assert names == ["h1.xplane.pb", "h2.xplane.pb", "perfetto_trace.json.gz"]


def test_only_files_that_look_like_traces_are_counted(tmp_path):
    """Found in a trial: `in/ holds 2 traces; summarizing in/weird.json`,
    then an error: any .json counted as a trace."""
    from gpuscope.collectors.trace_files import traces_at
    (tmp_path / "weird.json").write_text('{"model": "llama", "layers": 32}')
    (tmp_path / "config.json.gz").write_bytes(gzip.compress(b'{"a": 1}'))
    (tmp_path / "notes.txt").write_text("hello")
    os.mkfifo(tmp_path / "pipe.json")                            # never opened: it would block
    with pytest.raises(TraceError, match="no .xplane.pb or trace JSON below it"):
        traces_at(tmp_path)
    (tmp_path / "exported.json").write_text(' {"traceEvents": [], "displayTimeUnit": "ns"}')
    (tmp_path / "array.json.gz").write_bytes(gzip.compress(b'[{"ph": "X"}]'))
    (tmp_path / "rank0.1.pt.trace.json").write_text('{"schemaVersion": 1}')
    assert sorted(p.name for p in traces_at(tmp_path)) == ["array.json.gz", "exported.json", "rank0.1.pt.trace.json"]


def test_a_recording_given_as_a_trace_is_told_apart(fixture_dir, tmp_path):
    from gpuscope.collectors.trace_files import traces_at
    for path in (FIXTURE / "samples.csv", FIXTURE / "nvidia_smi.csv"):
        with pytest.raises(TraceError, match=r"not a trace: .*\(gpuscope classify reads recordings"):
            load_trace(path)
    renamed = tmp_path / "gpus.log"
    renamed.write_bytes((FIXTURE / "nvidia_smi.csv").read_bytes()[:4000])
    with pytest.raises(TraceError, match="not a trace"):
        traces_at(renamed)
