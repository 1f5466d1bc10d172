"""Trace-event JSON decoded the fast way (typed structs; a Kineto file a
slice at a time) says exactly what the tolerant way (json.loads) says, on
real traces and on odd ones."""
import gzip
import json
from pathlib import Path

import pytest

from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors import chrome_trace_reader as reader
from gpuscope.collectors import trace_events
from gpuscope.collectors.xspace_reader import TraceError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
REAL = sorted((SHARED / "vllm-0.32-cpu" / "traces").glob("*.json.gz")) + sorted(
    (SHARED / "h200-run1" / "traces").glob("*/plugins/profile/*/vm.trace.json.gz"))[:3]


def _tolerant(monkeypatch):
    monkeypatch.setattr(reader, "decode_kineto_gzip", lambda *a: None)
    monkeypatch.setattr(reader, "decode_typed", lambda raw: None)


def _same(a, b):
    assert (a.start_ns, a.end_ns, a.skipped, a.warnings, a.start_unix_ns, a.hostnames) == \
           (b.start_ns, b.end_ns, b.skipped, b.warnings, b.start_unix_ns, b.hostnames)
    assert len(a.devices) == len(b.devices) and (a.host.threads, a.host.busy_ns, a.host.dispatch_ns) == \
           (b.host.threads, b.host.busy_ns, b.host.dispatch_ns)
    assert (a.host.launch_correlation == b.host.launch_correlation).all()
    sa, sb = summarize(a), summarize(b)
    sa.pop("source"), sb.pop("source")
    assert json.dumps(sa, sort_keys=True, default=str) == json.dumps(sb, sort_keys=True, default=str)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name[:20] + "/" + p.name[:30])
def test_real_traces_read_the_same_both_ways(path, monkeypatch):
    data = path.read_bytes()
    fast = reader.parse_chrome_trace(data, str(path))
    _tolerant(monkeypatch)
    _same(fast, reader.parse_chrome_trace(data, str(path)))
    monkeypatch.setattr(reader._Events, "_columns", lambda self, xs, typed: False)      # every event on its own
    _same(fast, reader.parse_chrome_trace(data, str(path)))


def test_a_kineto_file_is_decoded_a_slice_at_a_time(monkeypatch):
    path = next(p for p in REAL if p.name.startswith("rank0"))
    monkeypatch.setattr(trace_events, "PIECE_BYTES", 1 << 16)          # hundreds of slices
    slices: list[int] = []
    meta = trace_events.decode_kineto_gzip(path.read_bytes(), 1 << 30, RuntimeError, lambda ev, typed: slices.append(len(ev)))
    assert sum(slices) == 225_473 and len(slices) > 500
    assert meta.host_name == "vm" and meta.baseTimeNanoseconds > 0
    sliced = reader.parse_chrome_trace(path.read_bytes(), str(path))
    monkeypatch.undo()
    _same(sliced, reader.parse_chrome_trace(path.read_bytes(), str(path)))


def _kineto(events: list[dict], trailer: str = '"traceName": "x]"') -> bytes:
    """Laid out as Kineto writes it: each event on lines of its own, two spaces in."""
    body = ",\n".join("  " + json.dumps(e, indent=2).replace("\n", "\n  ") for e in events)
    return gzip.compress(('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "traceEvents": [\n'
                          + body + "\n  ]," + trailer + "}").encode())


META = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "GPU 0"}}]
GOOD = [{"ph": "X", "name": f"k{i}", "cat": "kernel", "pid": 2, "tid": 7, "ts": 100.0 + i, "dur": 0.5,
         "args": {"correlation": i}} for i in range(50)] + \
       [{"ph": "X", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 99.5 + i, "dur": 0.2,
         "args": {"correlation": i}} for i in range(50)]


@pytest.mark.parametrize("odd,skip", [
    ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0, "args": [1, 2]},
     "with args that are not an object"),
    ({"ph": "X", "name": "a", "pid": [1], "tid": 1, "ts": 1.0, "dur": 1.0}, "with a bad pid or tid"),
    ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1e400, "dur": 1.0}, "with a bad ts or dur"),
    ({"ph": "X", "name": 7, "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}, "with a name that is not a string"),
    ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 10 ** 40}, "with a bad ts or dur"),
])
def test_odd_events_are_skipped_and_counted_on_either_path(odd, skip, monkeypatch):
    data = _kineto(META + GOOD + [odd])
    fast = reader.parse_chrome_trace(data, "t.json.gz")
    assert any(skip in k for k in fast.skipped), fast.skipped
    _tolerant(monkeypatch)
    _same(fast, reader.parse_chrome_trace(data, "t.json.gz"))


def test_the_trailer_and_a_bracket_in_a_string_do_not_end_the_array_early():
    data = _kineto(META + GOOD + [{"ph": "X", "name": "x ]\n  ] y", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}],
                   trailer='"traceName": "a\\n  ]b", "host_name": "node-3", "baseTimeNanoseconds": 1000')
    got: list = []
    meta = trace_events.decode_kineto_gzip(data, 1 << 30, RuntimeError, lambda ev, typed: got.extend(ev))
    assert len(got) == len(META + GOOD) + 1 and meta.host_name == "node-3"
    t = reader.parse_chrome_trace(data, "t.json.gz")
    assert t.hostnames == ["node-3"] and len(t.devices) == 1


def test_a_truncated_or_oversized_kineto_file_is_refused_with_its_reason(monkeypatch):
    data = _kineto(META + GOOD)
    with pytest.raises(TraceError, match="corrupt or truncated gzip"):
        reader.parse_chrome_trace(data[: len(data) // 2], "t.json.gz")
    monkeypatch.setattr(reader, "MAX_JSON_BYTES", 2000)
    with pytest.raises(TraceError, match="decompresses to more than"):
        reader.parse_chrome_trace(data, "t.json.gz")


def test_other_layouts_and_plain_json_take_the_whole_file_path():
    compact = json.dumps({"traceEvents": META + GOOD}).encode()
    a = reader.parse_chrome_trace(compact, "t.json")
    b = reader.parse_chrome_trace(gzip.compress(compact), "t.json.gz")
    c = reader.parse_chrome_trace(json.dumps(META + GOOD).encode(), "t.json")     # a bare array
    _same(a, b)
    _same(a, c)
    assert len(a.devices) == 1



# -- found in a trial ------------------------------------------------------------------------
def test_a_slice_with_an_odd_type_is_read_tolerantly_without_reading_the_file_again(monkeypatch):
    events = META + GOOD + [{"ph": "X", "name": "late", "pid": 1, "tid": 1, "ts": "120.5", "dur": 1.0}]
    data = _kineto(events)
    whole = []
    monkeypatch.setattr(reader, "_gunzip", lambda *a: whole.append(1) or pytest.fail("decompressed twice"))
    fast = reader.parse_chrome_trace(data, "t.json.gz")
    monkeypatch.undo()
    _tolerant(monkeypatch)
    _same(fast, reader.parse_chrome_trace(data, "t.json.gz"))


@pytest.mark.parametrize("odd", [
    {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 10 ** 400, "dur": 1.0},
    {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 4611686018427387.904, "dur": 4611686018427387.904},
    {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0, "args": {"x": [[[[[[[[1]]]]]]]]}},
])
def test_odd_numbers_and_nesting_are_skipped_or_refused_never_a_traceback(odd, monkeypatch):
    data = _kineto(META + GOOD + [odd])
    fast = reader.parse_chrome_trace(data, "t.json.gz")
    _tolerant(monkeypatch)
    _same(fast, reader.parse_chrome_trace(data, "t.json.gz"))
    assert fast.end_ns < 2 ** 62


def test_deep_nesting_is_a_trace_error():
    deep = {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0, "args": {}}
    text = json.dumps({"traceEvents": META + GOOD + [deep]}).replace('"args": {}', '"args": ' + "[" * 5000 + "]" * 5000)
    for data, name in ((text.encode(), "t.json"), (gzip.compress(text.encode()), "t.json.gz")):
        with pytest.raises(TraceError, match="nested too deeply|unreadable"):
            reader.parse_chrome_trace(data, name)


def test_threads_are_numbered_as_they_first_appear_on_either_path(monkeypatch):
    events = META + [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": tid, "ts": float(i), "dur": 0.5}
                     for i, tid in enumerate([30, 10, 20, 10, 30])]
    data = _kineto(events)
    fast = reader.parse_chrome_trace(data, "t.json.gz").host.events.threads
    _tolerant(monkeypatch)
    monkeypatch.setattr(reader._Events, "_columns", lambda self, xs, typed: False)
    assert list(fast) == list(reader.parse_chrome_trace(data, "t.json.gz").host.events.threads)
