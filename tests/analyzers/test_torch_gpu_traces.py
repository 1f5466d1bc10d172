"""Real torch-profiler traces from an H200 (tests/data/h200-torch-2.11):
kernels on a process Kineto marks as a GPU only by its labels, and the
verdict each workload must get."""
import gzip
import json
from pathlib import Path

import pytest

from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.trace_files import load_trace, parse_trace

DATA = Path(__file__).parent.parent / "data" / "h200-torch-2.11"


@pytest.mark.parametrize("name, verdict", [("matmul_bf16", "compute-bound"), ("stream_f32", "memory-bound"),
                                           ("launch_tiny", "launch-bound")])
def test_h200_torch_trace_verdicts(name, verdict):
    s = summarize(load_trace(DATA / f"{name}.pt.trace.json.gz"))
    assert s["device"] == "/device:GPU:0"
    # Kineto labels 16 GPU processes on this one-GPU host; deviceProperties lists the one there is
    assert [d["device"] for d in s["devices"]] == ["/device:GPU:0"]
    assert s["verdict"] == verdict, s["summary"]
    assert s["busy_fraction"] is not None


def test_the_gpu_is_found_by_its_label_alone():
    """The same events with the labels removed: no device, and it says so."""
    doc = json.loads(gzip.decompress((DATA / "matmul_bf16.pt.trace.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "process_labels"]
    s = summarize(parse_trace(json.dumps(doc).encode(), "in-memory.json"))
    assert s["verdict"] is None and "no GPU activity" in s["summary"]


def test_a_gpu_the_host_has_is_kept_idle_and_one_it_lacks_is_not_listed():
    """deviceProperties says which GPUs exist: one there with no kernels is
    an idle GPU of the job; a labelled index not there is Kineto's padding,
    unless something ran on it."""
    doc = json.loads(gzip.decompress((DATA / "matmul_bf16.pt.trace.json.gz").read_bytes()))
    doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1})
    stray = next(e for e in doc["traceEvents"] if e.get("pid") == 0 and e.get("ph") == "X")
    doc["traceEvents"].append({**stray, "pid": 5})            # a kernel on GPU 5, which deviceProperties lacks
    s = summarize(parse_trace(json.dumps(doc).encode(), "in-memory.json"))
    devices = {d["device"]: d["verdict"] for d in s["devices"]}
    assert set(devices) == {"/device:GPU:0", "/device:GPU:1", "/device:GPU:5"}
    assert devices["/device:GPU:0"] == "compute-bound" and devices["/device:GPU:1"] == "idle"
