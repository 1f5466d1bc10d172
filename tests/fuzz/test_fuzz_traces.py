"""Structure-aware fuzzing of the trace readers and the trace analysis.

The contract: for any bytes, `parse_trace` + `summarize` return a summary
(whose numbers are all finite, so it stores as strict JSON) or raise
TraceError naming the file; never another exception, never a hang, and
huge times or durations cost no more than ordinary ones. Events with
unusable fields are skipped and counted in `skipped_events`.

Inputs: trace-event JSON built from valid events with mutated fields;
the real fixture JSON and XSpace files with a sample of events mutated;
XSpace and HloProto messages built from scratch with inconsistent
references and extreme int64 values; raw and bit-flipped bytes; and
Trace objects with every accepted extreme, straight into summarize.

Every run is the same run (`derandomize=True`), and the fixtures are read
once per module.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import random
import time
from functools import lru_cache

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscope.analyzers import hlo_cost
from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors import chrome_trace_reader
from gpuscope.collectors.trace_files import load_trace, parse_trace, resolve
from gpuscope.collectors.trace_model import MAX_BYTES, MAX_TIME_NS, HostTimeline, Trace, _Builder, kind_of
from gpuscope.collectors.xspace_reader import TraceError
from gpuscope.xla import hlo_pb2, xplane_pb2
from tests.conftest import FIXTURE


def fuzz(n: int):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def check(data: bytes, name: str) -> dict | None:
    """The property: a summary with finite numbers, or TraceError naming the file."""
    try:
        trace = parse_trace(data, name)
        summary = summarize(trace)
    except TraceError as exc:
        assert str(exc).startswith(f"{name}: ") and len(str(exc)) > len(name) + 4, str(exc)
        return None
    json.dumps(summary, allow_nan=False, default=str)       # no inf, no NaN: it is stored as JSON
    assert summary["skipped_events"] == trace.skipped_events >= 0
    assert 0 <= summary["confidence"] <= 1
    for dev in trace.devices:
        assert ((dev.start_ns >= 0) & (dev.dur_ns >= 0) & (dev.start_ns + dev.dur_ns >= dev.start_ns)).all()
    return summary


# ---------------------------------------------------------------- values

TEXT = "aZ09 _.:#()/-²١é中\u200b"            # an explicit alphabet: odd characters, no unicode tables to build
EXTREME_NUMBERS = [math.inf, -math.inf, math.nan, 1e308, -1e308, 1e300, 1.7976931348623157e308, 5e-324, -1, -0.5,
                   0, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63, 10 ** 30, 4.6e15, 9.3e15]
weird = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-2 ** 70, max_value=2 ** 70),
    st.sampled_from(["", "abc", "12", "1e400", "nan", "inf", "-5", "²", "0x10", "num_bytes:²", " 7 "]),
    st.text(TEXT, max_size=6),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "name", "hlo_op"]), st.integers(-3, 3), max_size=2),
    st.none(), st.booleans(),
)


# ---------------------------------------------------------------- trace-event JSON

GPU_PID, TORCH_GPU_PID, HOST_PID = 1, 2, 701
KERNELS = ["sm90_xmma_gemm_bf16", "loop_add_fusion", "ncclDevKernel_AllReduce", "MemcpyH2D", "MemcpyD2H",
           "Memset", "input_reduce_fusion", ""]
HOST_NAMES = ["PjitFunction(f)", "cuLaunchKernel", "DevicePutWithSharding", "$builtins isinstance", "<UNKNOWN>",
              "ThunkExecutor::Execute"]
STREAMS = ["Stream #15(MemcpyH2D)", "Stream #16(MemcpyD2H)", "Stream #7(Compute)", "Stream #9(nccl)"]


def metadata_events() -> list[dict]:
    out = [dict(ph="M", pid=GPU_PID, name="process_name", args=dict(name="/device:GPU:0")),
           dict(ph="M", pid=TORCH_GPU_PID, name="process_name", args=dict(name="GPU 1")),
           dict(ph="M", pid=HOST_PID, name="process_name", args=dict(name="/host:CPU"))]
    for tid, stream in enumerate(STREAMS):
        out.append(dict(ph="M", pid=GPU_PID, tid=tid, name="thread_name", args=dict(name=stream)))
    return out


good_args = st.fixed_dictionaries({}, optional={
    "hlo_op": st.sampled_from(["dot.1", "fusion.2", "all-reduce.3", "copy.4"]),
    "correlation_id": st.integers(0, 50),
    "memcpy_details": st.sampled_from(["num_bytes:268435456", "kind:HtoD num_bytes:1024", "num_bytes:", "x"]),
    "bytes": st.sampled_from([4096, "8192", "²"]),
    "program_id": st.sampled_from([1, "2", None]),
})


@st.composite
def good_event(draw) -> dict:
    pid = draw(st.sampled_from([GPU_PID, GPU_PID, TORCH_GPU_PID, HOST_PID]))
    return dict(ph="X", pid=pid, tid=draw(st.integers(0, len(STREAMS) - 1)),
                ts=draw(st.floats(0, 2e5, allow_nan=False) | st.integers(0, 200_000)),
                dur=draw(st.floats(0, 5e3, allow_nan=False) | st.integers(0, 5_000)),
                name=draw(st.sampled_from(KERNELS if pid != HOST_PID else HOST_NAMES)),
                args=draw(good_args))


def mutate_event(draw, e: dict) -> dict | object:
    """One mutation of a trace event: a field set to a weird value, a key
    removed, args or the event itself replaced by a non-object."""
    how = draw(st.sampled_from(["field", "field", "field", "drop", "args", "arg", "ph", "not_object"]))
    e = dict(e)
    if how == "field":
        e[draw(st.sampled_from(["ts", "dur", "pid", "tid", "name", "args"]))] = draw(weird)
    elif how == "drop" and e:
        e.pop(draw(st.sampled_from(sorted(e))))
    elif how == "args":
        e["args"] = draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(TEXT, max_size=3),
                                   st.integers(), st.floats(), st.none()))
    elif how == "arg":
        args = dict(e["args"]) if isinstance(e.get("args"), dict) else {}
        args[draw(st.sampled_from(["hlo_op", "correlation_id", "correlation", "memcpy_details", "bytes",
                                   "program_id", "hlo_module", "name"]))] = draw(weird)
        e["args"] = args
    elif how == "ph":
        e["ph"] = draw(st.sampled_from(["X", "M", "B", "E", "i", "C", "", None, 7, ["X"], {"X": 1}]))
    else:
        return draw(st.one_of(weird, st.just([e])))
    return e


def encode(draw, doc, stem: str = "t", raw: bytes | None = None) -> tuple[bytes, str]:
    if raw is None:
        raw = json.dumps(doc).encode()                  # NaN/Infinity as Python writes them; loads reads them
    packing = draw(st.sampled_from(["gzip", "plain", "bom", "space"]))
    if packing == "gzip":
        raw = gzip.compress(raw, compresslevel=1)
    elif packing == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif packing == "space":
        raw = b" \n\t" + raw
    name = draw(st.sampled_from([f"{stem}.trace.json.gz", f"{stem}.json", f"{stem}.pt.trace.json.gz", stem]))
    return raw, name


@st.composite
def chrome_json_files(draw):
    events = metadata_events() + draw(st.lists(good_event(), min_size=0, max_size=25))
    for i in draw(st.lists(st.integers(0, max(0, len(events) - 1)), max_size=8)):
        if i < len(events) and isinstance(events[i], dict):
            events[i] = mutate_event(draw, events[i])
    shape = draw(st.sampled_from(["object", "object", "object", "array", "odd"]))
    doc = (dict(traceEvents=events, displayTimeUnit="ns") if shape == "object" else events if shape == "array"
           else draw(st.sampled_from([dict(traceEvents={"a": 1}), dict(traceEvents=None), "x", 3, [], {},
                                      dict(traceEvents=[[1]])])))
    return encode(draw, doc)


@fuzz(1000)
@given(chrome_json_files())
def test_chrome_json_with_mutated_events(case):
    check(*case)


def test_unusable_events_are_skipped_and_counted():
    events = metadata_events() + [
        dict(ph="X", pid=GPU_PID, tid=2, ts=10.0, dur=100.0, name="loop_add_fusion"),
        dict(ph="X", pid=GPU_PID, tid=2, ts=math.inf, dur=1.0, name="k"),
        dict(ph="X", pid=GPU_PID, tid=2, ts=1.0, dur=1e300, name="k"),
        dict(ph="X", pid=GPU_PID, tid=2, ts=-5, dur=1.0, name="k"),
        dict(ph="X", pid=[1], tid=2, ts=1.0, dur=1.0, name="k"),
        dict(ph="X", pid=GPU_PID, tid={"a": 1}, ts=1.0, dur=1.0, name="k"),
        dict(ph="X", pid=GPU_PID, tid=2, ts=1.0, dur=1.0, name="k", args=[1, 2]),
        dict(ph="X", pid=GPU_PID, tid=2, ts=1.0, dur=1.0, name=17),
        dict(ph="X", pid=GPU_PID, tid=2, ts="1e999", dur=1.0, name="k"),
        "not an event",
    ]
    s = check(json.dumps(dict(traceEvents=events)).encode(), "skip.trace.json")
    assert s is not None and s["skipped_events"] == 9
    assert s["devices"][0]["activities"] == 1
    assert any("skipped 9 unusable events" in w for w in s["warnings"])


def test_a_file_with_no_usable_event_is_an_error_that_says_so():
    events = metadata_events() + [dict(ph="X", pid=GPU_PID, ts=math.nan, dur=1.0, name="k")] * 3
    with pytest.raises(TraceError, match=r"^none\.json: no complete .*3 unusable events skipped"):
        parse_trace(json.dumps(events).encode(), "none.json")


@pytest.mark.parametrize("raw", [
    b'{"traceEvents": [{"ph": "X", "pid": 1, "ts": ' + b"9" * 5000 + b', "dur": 1}, '
    b'{"ph": "X", "pid": 1, "ts": 5, "dur": 1, "name": "k"}]}',            # past int()'s 4300-digit limit
    b"[" * 100_000 + b"]" * 100_000,                                        # past the recursion limit
    b'{"traceEvents": [{"ph": "X", "ts": NaN, "dur": Infinity}, {"ph": "X", "ts": -Infinity}]}',
    b"\xef\xbb\xbf" + json.dumps(metadata_events()).encode(),                 # BOM, no X events
    b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}]}\xff\xfe',           # trailing bytes, not UTF-8
    "\ufeff[{\"ph\": \"X\", \"ts\": 1}]".encode("utf-16"),
    gzip.compress(b"[]") + b"\x00\x00\x00",                                 # zero padding after the member
    gzip.compress(b'[{"ph": "X", "ts": 1') + gzip.compress(b', "dur": 2}]'),  # two members
    gzip.compress(b"[]")[:-4],                                              # cut inside the trailer
])
def test_json_edge_files(raw):
    for name in ("e.trace.json.gz", "e.json", "e"):
        check(raw, name)


def test_huge_values_cost_nothing():
    """`dur` of 1e300 (or ts near the int64 edge) must not size anything."""
    events = metadata_events()
    for i in range(2000):
        events.append(dict(ph="X", pid=GPU_PID, tid=2, ts=float(i), dur=1e300 if i % 2 else 1.0, name="k"))
        events.append(dict(ph="X", pid=HOST_PID, tid=1, ts=MAX_TIME_NS / 1000 - 1, dur=2 ** 61 / 1000, name="h"))
    t0 = time.perf_counter()
    s = check(json.dumps(events).encode(), "big.json")
    assert time.perf_counter() - t0 < 5 and s is not None and s["skipped_events"] == 1000


def test_gzip_bomb_stops_at_the_limit(monkeypatch):
    monkeypatch.setattr(chrome_trace_reader, "MAX_JSON_BYTES", 1 << 20)
    bomb = gzip.compress(b"[" + b" " * (4 << 20) + b"]")
    with pytest.raises(TraceError, match="decompresses to more than"):
        parse_trace(bomb, "bomb.trace.json.gz")


# ---------------------------------------------------------------- real JSON, mutated

@lru_cache(maxsize=None)
def fixture_json(phase: str) -> tuple[list, list[str]]:
    """The fixture's events, and each one encoded: a case re-encodes only the events it mutates."""
    run = next((FIXTURE / "traces" / phase / "plugins" / "profile").iterdir())
    events = json.loads(gzip.decompress((run / "vm.trace.json.gz").read_bytes()))["traceEvents"]
    return events, [json.dumps(e) for e in events]


@st.composite
def mutated_fixture_json(draw):
    # pcie_h2d_d2h (618 events) is cheap; train_mlp (6,472, GPU-busy) takes the roofline path at ~50 ms a case
    events, encoded = fixture_json(draw(st.sampled_from(["pcie_h2d_d2h"] * 3 + ["train_mlp"])))
    encoded = list(encoded)
    n = len(events)
    for i in draw(st.lists(st.integers(0, n - 1) | st.integers(0, 40), min_size=1, max_size=30)):
        if isinstance(events[i], dict):
            encoded[i] = json.dumps(mutate_event(draw, events[i]))
    raw = ('{"displayTimeUnit": "ns", "traceEvents": [' + ",".join(encoded) + "]}").encode()
    return encode(draw, None, "real", raw)


@fuzz(200)
@given(mutated_fixture_json())
def test_real_json_with_mutated_events(fixture_dir, case):
    check(*case)


# ---------------------------------------------------------------- HloProto and XSpace, built from a seed
#
# Whole protobuf messages are built with a seeded random.Random, one hypothesis
# draw per case: drawing each field through hypothesis costs ~50 ms a message,
# this ~1 ms. A failure prints its seed, and the seed alone rebuilds the case.

I64_EDGES = [0, 1, 2, 3, -1, 2 ** 31, 10 ** 15, MAX_TIME_NS, MAX_TIME_NS + 1, 2 ** 63 - 1, -2 ** 63]
HLO_NAMES = ["dot.1", "fusion.2", "custom-call.3", "add.4", "reduce.5", "all-reduce.6", "loop_add_fusion",
             "sm90_xmma_gemm_bf16"]
OPCODES = ["dot", "fusion", "call", "async-start", "custom-call", "convolution", "parameter", "reduce",
           "reduce-window", "add", "multiply", "all-reduce", ""]
BACKEND_CONFIGS = [b"", b"\xff\xfe", b"{", b"[1]", b"null", b'{"gemm_backend_config": []}',
                   b'{"gemm_backend_config": {"x": 1}}', b'{"dot_dimension_numbers": []}',
                   b'{"dot_dimension_numbers": {"lhs_contracting_dimensions": 3}}',
                   b'{"gemm_backend_config": {"dot_dimension_numbers": {"lhs_contracting_dimensions": ["1"]}}}',
                   b'{"dot_dimension_numbers": {"lhs_contracting_dimensions": ["x", null, 1e400, -1, 99]}}',
                   b'{"dot_dimension_numbers": {"lhs_contracting_dimensions": [' + b"9" * 5000 + b"]}}",
                   b"[" * 5000 + b"]" * 5000, b'{"a": "\xff"}']
PLANE_NAMES = ["/device:GPU:0", "/device:GPU:0", "/device:GPU:1", "/host:CPU", "/host:CPU", "/host:metadata",
               "Task Environment", "/device:TPU:0", ""]
STAT_NAMES = ["correlation_id", "hlo_op", "hlo_module", "program_id", "memcpy_details", "Memset_details",
              "gpu_device_name", "memory_bandwidth", "core_count", "clock_rate", "compute_cap_major",
              "compute_cap_minor", "profile_start_time", "Hlo Proto", "other"]
EVENT_NAMES = KERNELS + HOST_NAMES + ["jit_f(1)", "jit_g(2)", "jit_f"]
STAT_TEXTS = HLO_NAMES + ["num_bytes:4096", "num_bytes:²", "num_bytes:" + "9" * 40, "1", "9.0", "nan", "", "²", "中"]
H200 = (("core_count", 132), ("clock_rate", 1_980_000), ("compute_cap_major", 9), ("compute_cap_minor", 0),
        ("memory_bandwidth", 4_800_000_000_000))
seeds = st.integers(0, 2 ** 64 - 1)


class Dice(random.Random):
    """random.Random with the distributions the builders want: mostly
    plausible values, often an edge of int64 or of the readers' ranges."""

    def chance(self, p: float) -> bool:
        return self.random() < p

    def i64(self, small: int = 20) -> int:
        r = self.random()
        return (self.randint(0, small) if r < .45 else self.choice(I64_EDGES) if r < .75
                else self.randint(-2 ** 63, 2 ** 63 - 1))

    def time_ns(self) -> int:
        r = self.random()
        return self.randint(0, 10 ** 9) if r < .6 else 1_795_990_151_147_829_770 if r < .75 else self.i64()

    def time_ps(self) -> int:
        r = self.random()
        return self.randint(0, 10 ** 10) if r < .6 else self.randint(-10 ** 6, 0) if r < .7 else self.i64()

    def dims(self) -> list[int]:
        return [self.randint(-2, 64) if self.chance(.8) else self.choice([2 ** 62, 2 ** 63 - 1, -2 ** 63, 10 ** 12])
                for _ in range(self.randint(0, 5))]

    def bytes_(self, n: int = 16) -> bytes:
        return self.randbytes(self.randint(0, n))


def fill_shape(dice: Dice, shape, depth: int = 0) -> None:
    shape.element_type = dice.choice([0, 1, 7, 11, 16, 21, 99, -5])
    shape.dimensions.extend(dice.dims())
    if depth < 2 and dice.chance(.2):
        for _ in range(dice.randint(1, 3)):
            fill_shape(dice, shape.tuple_shapes.add(), depth + 1)


def build_hlo(dice: Dice) -> hlo_pb2.HloProto:
    """Computations that call each other (themselves, missing ones), operands
    that are missing, shapes with negative and int64-sized dimensions."""
    proto = hlo_pb2.HloProto()
    comp_ids = [dice.i64(4) for _ in range(dice.randint(1, 4))]
    ins_ids = [dice.i64(12) for _ in range(dice.randint(1, 10))]
    k = 0
    for cid in comp_ids:
        comp = proto.hlo_module.computations.add(id=cid)
        for _ in range(dice.randint(0, 5)):
            ins = comp.instructions.add(id=ins_ids[k % len(ins_ids)], name=dice.choice(HLO_NAMES),
                                        opcode=dice.choice(OPCODES))
            k += 1
            fill_shape(dice, ins.shape)
            ins.operand_ids.extend(dice.choice(ins_ids) if dice.chance(.8) else dice.i64()
                                   for _ in range(dice.randint(0, 3)))
            ins.called_computation_ids.extend(dice.choice(comp_ids) if dice.chance(.8) else dice.i64()
                                              for _ in range(dice.randint(0, 3)))
            ins.custom_call_target = dice.choice(["__cublas$gemm", "__cublas$lt$matmul", "__cudnn$conv", "other", ""])
            ins.dot_dimension_numbers.lhs_contracting_dimensions.extend(
                dice.randint(-2, 6) if dice.chance(.7) else dice.i64() for _ in range(dice.randint(0, 3)))
            ins.backend_config = dice.choice(BACKEND_CONFIGS) if dice.chance(.8) else dice.bytes_()
    return proto


@fuzz(3000)
@given(seeds)
def test_hlo_cost_of_any_program_is_finite_or_unknown(seed):
    prog = hlo_cost.Program(build_hlo(Dice(seed)))
    for name in HLO_NAMES + ["missing"]:
        cost = prog.cost(name)
        if cost is None:
            continue
        for v in (cost.flops, cost.bytes):
            assert v is None or (math.isfinite(v) and v >= 0), (name, cost)


def test_self_calling_and_exponential_fusions_terminate_quickly():
    proto = hlo_pb2.HloProto()
    comps = [proto.hlo_module.computations.add(id=i) for i in range(200)]
    for i, comp in enumerate(comps):            # each calls the next twice, the last calls the first
        for j in range(2):
            ins = comp.instructions.add(id=i * 2 + j, name=f"fusion.{i}.{j}", opcode="fusion")
            ins.shape.dimensions.extend([1024, 1024])
            ins.called_computation_ids.append((i + 1) % len(comps))
    t0 = time.perf_counter()
    cost = hlo_cost.Program(proto).cost("fusion.0.0")
    assert time.perf_counter() - t0 < 1 and math.isfinite(cost.flops)


def set_stat(dice: Dice, stat, ref_ids: list[int], hlo: list[bytes]) -> None:
    """Give a stat a value of any type: NaN and inf doubles, uint64s past
    int64, text that is and is not a number, HLO bytes, dangling refs."""
    which = dice.choice(["double_value", "uint64_value", "int64_value", "str_value", "bytes_value", "ref_value",
                         None])
    if which == "double_value":
        stat.double_value = dice.choice(EXTREME_NUMBERS[:9]) if dice.chance(.5) else dice.uniform(-1e6, 1e13)
    elif which == "uint64_value":
        stat.uint64_value = dice.choice([0, 9, 2 ** 63, 2 ** 64 - 1, 3_350_000_000_000, dice.getrandbits(64)])
    elif which == "int64_value":
        stat.int64_value = dice.i64()
    elif which == "str_value":
        stat.str_value = dice.choice(STAT_TEXTS) if dice.chance(.8) else "".join(dice.choices(TEXT, k=5))
    elif which == "bytes_value":
        stat.bytes_value = dice.choice(hlo) if hlo and dice.chance(.6) else dice.bytes_()
    elif which == "ref_value":
        stat.ref_value = (dice.choice(ref_ids) if ref_ids and dice.chance(.8) else dice.getrandbits(64)) % 2 ** 64


def build_xspace(dice: Dice) -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    hlo = [build_hlo(dice).SerializeToString() for _ in range(dice.randint(0, 2))]
    space.hostnames.extend("".join(dice.choices(TEXT, k=4)) for _ in range(dice.randint(0, 2)))
    if dice.chance(.2):
        space.errors.append("".join(dice.choices(TEXT, k=4)))
    for _ in range(dice.randint(0, 4)):
        plane = space.planes.add(id=dice.i64(), name=dice.choice(PLANE_NAMES))
        stat_ids = list({dice.i64() for _ in range(dice.randint(0, 8))})
        for sid in stat_ids:
            plane.stat_metadata[sid].id = sid
            plane.stat_metadata[sid].name = dice.choice(STAT_NAMES)
        refs = stat_ids + [dice.i64()]                     # and a reference to no metadata
        if dice.chance(.5):                                # plausible H200 properties, to reach the roofline
            for key, value in H200:
                sid = 1000 + len(plane.stat_metadata)
                plane.stat_metadata[sid].name = key
                plane.stats.add(metadata_id=sid, int64_value=value)
                refs.append(sid)
        for _ in range(dice.randint(0, 4)):
            set_stat(dice, plane.stats.add(metadata_id=dice.choice(refs)), refs, hlo)
        event_ids = list({dice.i64(10) for _ in range(dice.randint(0, 5))})
        for eid in event_ids:
            m = plane.event_metadata[eid]
            m.id, m.name = eid, dice.choice(EVENT_NAMES)
            for _ in range(dice.randint(0, 2)):
                set_stat(dice, m.stats.add(metadata_id=dice.choice(refs)), refs, hlo)
        for _ in range(dice.randint(0, 3)):
            line = plane.lines.add(id=dice.i64(), name=dice.choice(STREAMS + ["python3", ""]),
                                   timestamp_ns=dice.time_ns())
            for _ in range(dice.randint(0, 12)):
                ev = line.events.add(metadata_id=dice.choice(event_ids) if event_ids and dice.chance(.9)
                                     else dice.i64(), duration_ps=dice.time_ps())
                if dice.chance(.9):
                    ev.offset_ps = dice.time_ps()
                else:
                    ev.num_occurrences = dice.i64()
                for _ in range(dice.randint(0, 3)):
                    set_stat(dice, ev.stats.add(metadata_id=dice.choice(refs)), refs, hlo)
    return space


@fuzz(3000)
@given(seeds, st.sampled_from(["x.xplane.pb", "x.pb", "x"]))
def test_xspace_built_from_scratch(seed, name):
    check(build_xspace(Dice(seed)).SerializeToString(), name)


@lru_cache(maxsize=None)
def fixture_xspace(phase: str) -> xplane_pb2.XSpace:
    run = next((FIXTURE / "traces" / phase / "plugins" / "profile").iterdir())
    space = xplane_pb2.XSpace()
    space.ParseFromString((run / "vm.xplane.pb").read_bytes())
    return space


def mutate_hlo(draw, data: bytes) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "shape", "cycle", "replace"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if how == "flip":
        buf = bytearray(data)
        for i in draw(st.lists(st.integers(0, max(0, len(buf) - 1)), min_size=1, max_size=4)):
            if buf:
                buf[i] ^= draw(st.integers(1, 255))
        return bytes(buf)
    if how == "replace":
        return build_hlo(Dice(draw(seeds))).SerializeToString()
    proto = hlo_pb2.HloProto()
    try:
        proto.ParseFromString(data)
    except DecodeError:                                  # an earlier mutation already garbled it
        return data
    comps = proto.hlo_module.computations
    instructions = [ins for c in comps for ins in c.instructions]
    dice = Dice(draw(seeds))
    for ins in draw(st.lists(st.sampled_from(instructions), max_size=6)) if instructions else []:
        if how == "shape":
            del ins.shape.dimensions[:]
            ins.shape.dimensions.extend(dice.dims())
            ins.dot_dimension_numbers.lhs_contracting_dimensions.append(dice.i64())
        else:                                            # calls back into its own computation
            ins.called_computation_ids.append(draw(st.sampled_from([c.id for c in comps])))
            ins.opcode = "fusion"
    return proto.SerializeToString()


@st.composite
def mutated_fixture_xspace(draw) -> bytes:
    space = xplane_pb2.XSpace()
    space.CopyFrom(fixture_xspace(draw(st.sampled_from(["pcie_h2d_d2h", "pcie_h2d_d2h", "matmul_bf16"]))))
    planes = list(space.planes)
    dice = Dice(draw(seeds))
    for _ in range(draw(st.integers(1, 10))):
        plane = draw(st.sampled_from(planes))
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        how = draw(st.sampled_from(["time", "time", "line", "stat", "stat", "plane_stat", "drop_stat_meta",
                                    "drop_event_meta", "hlo"]))
        lines = [ln for ln in plane.lines if ln.events]
        if how == "time" and lines:
            ev = draw(st.sampled_from(list(draw(st.sampled_from(lines)).events)))
            setattr(ev, draw(st.sampled_from(["offset_ps", "duration_ps", "metadata_id"])), dice.time_ps())
        elif how == "line" and lines:
            draw(st.sampled_from(lines)).timestamp_ns = dice.i64()
        elif how == "stat" and lines:
            ev = draw(st.sampled_from(list(draw(st.sampled_from(lines)).events)))
            if ev.stats:
                set_stat(dice, draw(st.sampled_from(list(ev.stats))), list(names), [])
        elif how == "plane_stat" and plane.stats:
            set_stat(dice, draw(st.sampled_from(list(plane.stats))), list(names), [])
        elif how == "drop_stat_meta" and names:
            del plane.stat_metadata[draw(st.sampled_from(sorted(names)))]
        elif how == "drop_event_meta" and plane.event_metadata:
            del plane.event_metadata[draw(st.sampled_from(sorted(plane.event_metadata)))]
        elif how == "hlo":
            holders = [s for m in plane.event_metadata.values() for s in m.stats
                       if names.get(s.metadata_id) == "Hlo Proto"]
            if holders:
                s = draw(st.sampled_from(holders))
                s.bytes_value = mutate_hlo(draw, s.bytes_value)
    return space.SerializeToString()


@fuzz(300)
@given(mutated_fixture_xspace())
def test_real_xspace_with_mutated_events_stats_and_hlo(fixture_dir, data):
    check(data, "real.xplane.pb")


@lru_cache(maxsize=None)
def fixture_xspace_bytes() -> bytes:
    return fixture_xspace("pcie_h2d_d2h").SerializeToString()


@fuzz(1000)
@given(st.lists(st.tuples(st.integers(0, 2 ** 31), st.integers(1, 255)), min_size=1, max_size=8),
       st.integers(0, 2 ** 31))
def test_real_xspace_with_flipped_bytes(fixture_dir, flips, cut):
    buf = bytearray(fixture_xspace_bytes())
    for pos, mask in flips:
        buf[pos % len(buf)] ^= mask
    check(bytes(buf[: max(1, len(buf) - cut % 64)]), "flipped.xplane.pb")


@fuzz(2000)
@given(st.binary(max_size=64) | st.sampled_from([b"\x1f\x8b", b"{", b"[", b"\x0a\x00", b"\x0a\x02\x12\x00"]),
       st.sampled_from(["r.xplane.pb", "r.trace.json.gz", "r.json", "r", "r.pb"]))
def test_raw_bytes(data, name):
    check(data, name)


@pytest.mark.parametrize("data", [b"", None, "text", 12, [1], bytearray(b"{}"), memoryview(b"[]")])
def test_parse_trace_takes_only_bytes(data):
    with pytest.raises(TraceError, match=r"^o\.json: "):
        parse_trace(data, "o.json")


def test_unnamed_xspace_whose_bytes_look_like_json_is_still_an_xspace():
    """0x0a (the planes' tag) is "\\n", and a plane of 123 bytes makes the next byte "{"."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    plane.event_metadata[1].name = "step"
    plane.lines.add(id=1, timestamp_ns=1000).events.add(metadata_id=1, offset_ps=0, duration_ps=5_000_000)
    plane.event_metadata[1].name += "x" * (123 - plane.ByteSize())
    data = space.SerializeToString()
    assert data[:2] == b"\n{"
    assert parse_trace(data, "capture-7").format == "xplane"


def test_xspace_extremes_are_skipped_and_the_rest_is_read():
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/device:GPU:0")
    plane.stat_metadata[1].name = "clock_rate"
    plane.stats.add(metadata_id=1, double_value=math.inf)
    plane.stat_metadata[2].name = "correlation_id"
    plane.event_metadata[5].name = "loop_add_fusion"
    line = plane.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=2 ** 63 - 1)
    line.events.add(metadata_id=5, offset_ps=0, duration_ps=10)                        # start past MAX_TIME_NS
    line = plane.lines.add(id=8, name="Stream #8(Compute)", timestamp_ns=1000)
    line.events.add(metadata_id=5, offset_ps=0, duration_ps=2 ** 63 - 1)             # 106 days: accepted
    line.events.add(metadata_id=5, offset_ps=-2 ** 63, duration_ps=10)                # before 0
    line.events.add(metadata_id=5, offset_ps=0, duration_ps=-1)
    ok = line.events.add(metadata_id=99, offset_ps=5_000, duration_ps=1_000_000)      # missing metadata
    ok.stats.add(metadata_id=2, double_value=math.nan)
    ok.stats.add(metadata_id=42, str_value="dangling")
    s = check(space.SerializeToString(), "ext.xplane.pb")
    assert s is not None and s["skipped_events"] == 3 and s["devices"][0]["activities"] == 2
    assert any("1 stats of an unexpected type" in w for w in s["warnings"])


# ---------------------------------------------------------------- summarize over accepted extremes

def accepted_time(dice: Dice) -> int:
    r = dice.random()
    return (dice.randint(0, 10 ** 7) if r < .6 else dice.choice([0, 1, MAX_TIME_NS, MAX_TIME_NS // 2]) if r < .8
            else dice.randint(0, MAX_TIME_NS))


def build_trace(dice: Dice) -> Trace:
    """A Trace as a reader could return it: every time and duration within
    [0, MAX_TIME_NS], byte counts NaN or within [0, MAX_BYTES], any ids."""
    devices = []
    for d in range(dice.randint(0, 2)):
        props = {k: dice.choice(v) for k, v in (("cc_major", [9.0, 8.0, 0.0]), ("cc_minor", [0.0, 6.0]),
                                                ("core_count", [132.0, 1e18]), ("clock_rate_hz", [1.98e9, 1e21]),
                                                ("memory_bandwidth", [4.8e12, 1e18, 1.0])) if dice.chance(.7)}
        b = _Builder(f"/device:GPU:{d}", props)
        base = accepted_time(dice) // 2
        for _ in range(dice.randint(0, 30)):
            start = min(base + dice.randint(0, 10 ** 6), MAX_TIME_NS) if dice.chance(.8) else accepted_time(dice)
            dur = dice.randint(0, 20_000) if dice.chance(.8) else accepted_time(dice)
            name = dice.choice(KERNELS)
            corr = dice.randint(-1, 20) if dice.chance(.8) else dice.i64()
            b.add(start, dur, kind_of(name), dice.randint(0, 3), corr, name,
                  dice.choice([None, ("1", "dot.1"), ("1", "fusion.2"), ("", "custom-call.3")]),
                  dice.choice([math.nan, 0.0, 1.0, MAX_BYTES]))
        devices.append(b.build())
    n = dice.randint(0, 20)
    launches = [accepted_time(dice) for _ in range(n)]
    host = HostTimeline(np.asarray([dice.randint(-1, 20) for _ in range(n)], np.int64), np.asarray(launches, np.int64),
                        dispatch_ns=accepted_time(dice), busy_ns=accepted_time(dice), threads=dice.randint(0, 9),
                        transfer_ns=accepted_time(dice))
    ends = [int((dv.start_ns + dv.dur_ns).max()) for dv in devices if len(dv)] + launches or [0]
    starts = [int(dv.start_ns.min()) for dv in devices if len(dv)] + launches or [0]
    return Trace(source="t", format="xplane", devices=devices, host=host, start_ns=min(starts), end_ns=max(ends),
                 start_unix_ns=dice.choice([None, 0, 1_795_990_151_147_829_770, 2 ** 63 - 1]),
                 programs={"1": build_hlo(dice).SerializeToString()} if dice.chance(.7) else {})


@fuzz(2000)
@given(seeds)
def test_summarize_any_accepted_trace(seed):
    s = summarize(build_trace(Dice(seed)))
    json.dumps(s, allow_nan=False, default=str)
    assert s["verdict"] is None or 0 <= s["confidence"] <= 1


# ---------------------------------------------------------------- files and directories

def test_paths_that_are_not_traces(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "dir.xplane.pb").mkdir()
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "self").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling.xplane.pb").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "pipe.trace.json")
    (tmp_path / "zero.xplane.pb").write_bytes(b"")
    (tmp_path / "garbage.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00\x00")
    for p in ["\x00", "x" * 5000, tmp_path / "nope", tmp_path / "empty", tmp_path / "dir.xplane.pb",
              tmp_path / "loop", tmp_path / "dangling.xplane.pb", tmp_path / "pipe.trace.json",
              tmp_path / "zero.xplane.pb", tmp_path / "garbage.trace.json.gz", "/dev/zero", "/proc/self/mem"]:
        try:
            summarize(load_trace(p))
        except TraceError as exc:
            assert str(exc).startswith(str(p)[:50]), str(exc)
    with pytest.raises(TraceError, match="no .xplane.pb or trace JSON below it"):
        resolve(tmp_path / "empty")
