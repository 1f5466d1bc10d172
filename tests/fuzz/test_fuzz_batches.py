"""Structure-aware fuzzing of SampleBatch: a valid batch built the way the
agent builds it (daemon/convert.py), then a few of its fields swapped for
edge values (ints past INTEGER/BIGINT, NaN and infinities, negatives, long,
unicode and control-character strings, buffers of the wrong length,
duplicates, dangling references).

Properties: decode() returns or raises BatchError, nothing else, and its
errors never echo a whole bad value; whatever it accepts is stored by a real
analyzer (a value that passes validation and then fails inside DuckDB would
fail other agents' batches with it); stored command lines never hold the
secrets planted in them; and afterwards the analyzer still takes a good
batch.

Reproducible: examples are derandomized and no example database is kept.
Sized to run in well under a minute on two cores.
"""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuscope.analyzers import ingest
from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.ingest import BatchError, decode
from gpuscope.analyzers.writer import COMMITTED, DUPLICATE, samples_table
from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import DeviceInfo, GpuSample, HealthKind, HealthRecord, ProcessRecord
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import samples_pb2 as pb

DAY = 86_400.0
NOW = time.time()                 # the clock batches are built around (see _times)
SECRET = "SECRETVALUE"
FUZZ = dict(deadline=None, derandomize=True, database=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- values at the edges -----------------------------------------------------------------
U32_EDGES = [0, 1, 16, 17, 64, 65, 1023, 1024, 2**22, 2**22 + 1, 2**31 - 1, 2**31, 2**32 - 1]
U64_EDGES = [0, 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
FLOAT_EDGES = [0.0, -0.0, 1.0, 1.5, 1.5000001, -1.0, 5e-324, 1e308, float("nan"), float("inf"), float("-inf"),
               10_000.0, 10_000.5]
TEXT_EDGES = ["", " ", "a b", "\x00", "\x1b[2J", "line\nbreak", "tab\tbed", "\u202eevil", "\ufeff", "\U0010ffff",
              "🙂" * 63, "é" * 126, "é" * 127, "x" * 64, "x" * 65, "x" * 253, "x" * 254, "x" * 256, "x" * 257,
              "x" * 4096, "x" * 4097, "x" * 200_000, "../../etc/passwd", "h1"]
COMMANDS = ["", "python train.py --lr 3e-4", f"python x.py --hf-token={SECRET}", f"HF_TOKEN={SECRET} python x.py",
            f"vllm serve m --api-key {SECRET} --max-num-batched-tokens 8192",
            f"git clone https://me:{SECRET}@github.com/o/r", "x" * 10_000 + f" --password {SECRET}",
            f"a\x00b\x1b[2Jc --token\t{SECRET}", "é" * 5000, "🙂" * 2000]


def _edges(values: list, anything: st.SearchStrategy) -> st.SearchStrategy:
    # the edges three times out of four: random values rarely land on a limit
    edges = st.sampled_from(values)
    return st.one_of(edges, edges, edges, anything)


# built once: a strategy is validated on first use, which costs more than the draw
U32 = _edges(U32_EDGES, st.integers(0, 2**32 - 1))
U64 = _edges(U64_EDGES, st.integers(0, 2**64 - 1))
TEXT = _edges(TEXT_EDGES, st.text(max_size=24))
FLOATS = _edges(FLOAT_EDGES, st.floats())
# random text, then a secret the redaction must still find
COMMAND = st.sampled_from(COMMANDS) | st.text(max_size=40).map(lambda s: f"{s} --hf-token {SECRET}")


def _times() -> st.SearchStrategy:
    """Times the window must refuse or just take, around NOW, to the
    millisecond of its edges. (The analyzer's own clock moves on while a
    test runs: there an edge value may go either way, and both are fine.)"""
    edges = [1.0, 0.0, -1.0, 1.25e9, 1e300, NOW - 8 * DAY, NOW - 6 * DAY, NOW - DAY, NOW + 60, NOW + 600,
             NOW - ingest.MAX_AGE_S - 0.001, NOW - ingest.MAX_AGE_S + 0.001,
             NOW + ingest.MAX_FUTURE_SKEW_S - 0.001, NOW + ingest.MAX_FUTURE_SKEW_S + 0.001,
             float("nan"), float("inf"), float("-inf")]
    return _edges(edges, FLOATS)


TIMES = _times()


# -- a valid batch, as the agent sends it -----------------------------------------------------
BOOT_IDS = ["3f2a9c0b1d4e5f60", "b" * 64]


def _largest(typical: st.SearchStrategy, largest) -> st.SearchStrategy:
    # the largest good value now and then: it must be stored, not only accepted
    return st.one_of(typical, typical, st.just(largest))


@st.composite
def good_batch(draw) -> pb.SampleBatch:
    # bulk values come from one seeded generator: one draw, not one per value
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 12))
    gpus = draw(st.lists(_largest(st.integers(0, 7), ingest.MAX_GPU_INDEX), min_size=1, max_size=4, unique=True))
    metrics = [cat.BY_NAME[m] for m in draw(st.lists(st.sampled_from(cat.NAMES), max_size=5, unique=True))]
    jobs = draw(st.lists(COMMAND, max_size=3))
    pid = draw(_largest(st.integers(1, 99_999), ingest.MAX_PID))
    used = draw(_largest(st.integers(0, 80 << 30), ingest.BIGINT_MAX))
    samples = []
    for i in range(n):
        values = {m.name: float(rng.uniform(0, 1 if m.kind is cat.Kind.RATIO else 900.0))   # below every unit's ceiling
                  for m in metrics if rng.random() < 0.8}            # some missing: a validity bitmap
        procs = tuple(ProcessRecord(max(pid - k, 1), used, float(rng.uniform(0, 64)), c)
                      for k, c in enumerate(jobs) if rng.random() < 0.7)
        samples.append(GpuSample(gpus[i % len(gpus)], NOW - 60 + i, values, procs))
    memory = draw(_largest(st.just(150 << 30), ingest.BIGINT_MAX))
    devices = [DeviceInfo(gpu=g, uuid=f"GPU-{g}", name="NVIDIA H200", architecture="hopper", memory_total_bytes=memory,
                          power_limit_watts=700.0, pcie_generation=5, pcie_width=16, gpm_supported=True) for g in gpus]
    code = draw(_largest(st.integers(0, 200), ingest.BIGINT_MAX))
    health = [HealthRecord(gpus[0], NOW - 30, HealthKind.XID, "Xid 79", code) for _ in range(draw(st.integers(0, 2)))]
    return encode_batch(draw(st.sampled_from(["gpu-node-7", "höst-2", "h" * 253])), draw(st.sampled_from(BOOT_IDS)),
                        draw(_largest(st.integers(1, 10**6), ingest.BIGINT_MAX)),
                        samples, devices, health, draw(_largest(st.integers(0, 1000), ingest.BIGINT_MAX)))


# -- mutations: each swaps one part of the batch for an edge ---------------------------------
def _pick(draw, seq) -> int | None:
    return draw(st.integers(0, len(seq) - 1)) if len(seq) else None


def _split(buf: bytes, dtype: str) -> tuple[np.ndarray, bytes]:
    """The whole values of a buffer (a copy), and the bytes left over when
    an earlier mutation cut it."""
    whole = len(buf) - len(buf) % np.dtype(dtype).itemsize
    return np.frombuffer(buf[:whole], dtype).copy(), buf[whole:]


def _set_item(draw, buf: bytes, dtype: str, value) -> bytes:
    arr, rest = _split(buf, dtype)
    if len(arr):
        arr[draw(st.integers(0, len(arr) - 1))] = value
    return arr.tobytes() + rest


def _named(name: str):
    def name_it(mutate):
        mutate.__name__ = name            # Hypothesis prints the mutations it chose
        return mutate
    return name_it


def _header(field: str, values: st.SearchStrategy):
    @_named(field)
    def mutate(draw, b):
        setattr(b, field, draw(values))
    return mutate


def _device(field: str, values: st.SearchStrategy):
    @_named(f"devices[].{field}")
    def mutate(draw, b):
        i = _pick(draw, b.devices)
        if i is not None:
            setattr(b.devices[i], field, draw(values))
    return mutate


def _process(field: str, values: st.SearchStrategy):
    @_named(f"processes[].{field}")
    def mutate(draw, b):
        i = _pick(draw, b.processes)
        p = b.processes[i] if i is not None and draw(st.booleans()) else b.processes.add(sample=0, pid=1)
        setattr(p, field, draw(values))
    return mutate


def _health(field: str, values: st.SearchStrategy):
    @_named(f"health[].{field}")
    def mutate(draw, b):
        i = _pick(draw, b.health)
        h = b.health[i] if i is not None and draw(st.booleans()) else \
            b.health.add(gpu=b.devices[0].gpu if b.devices else 0, t=NOW - 5, detail="Xid 79")
        setattr(h, field, draw(values))
    return mutate


def m_times(draw, b):
    b.t_f64le = _set_item(draw, b.t_f64le, "<f8", draw(TIMES))


def m_gpus(draw, b):
    b.gpu_u32le = _set_item(draw, b.gpu_u32le, "<u4", draw(U32))


def m_buffer_length(draw, b):
    name = draw(st.sampled_from(["t_f64le", "gpu_u32le"]))
    buf = getattr(b, name)
    setattr(b, name, buf[:-1] if draw(st.booleans()) else buf + b"\0" * draw(st.sampled_from([1, 4, 8])))


def m_device_list(draw, b):
    how, i = draw(st.sampled_from(["duplicate", "remove", "add"])), _pick(draw, b.devices)
    if how == "add" or i is None:
        b.devices.add(gpu=draw(U32))
    elif how == "duplicate":
        b.devices.append(b.devices[i])
    else:
        del b.devices[i]


def m_renumber_gpu(draw, b):
    """One GPU gets another index everywhere (devices, samples, health):
    the only way an out-of-range index gets past the cross-references."""
    i = _pick(draw, b.devices)
    if i is None:
        return
    old, new = b.devices[i].gpu, draw(U32)
    b.devices[i].gpu = new
    gpu, rest = _split(b.gpu_u32le, "<u4")
    gpu[gpu == old] = new
    b.gpu_u32le = gpu.tobytes() + rest
    for h in b.health:
        if h.gpu == old:
            h.gpu = new


def m_column_value(draw, b):
    i = _pick(draw, b.columns)
    if i is not None:
        b.columns[i].f64le = _set_item(draw, b.columns[i].f64le, "<f8", draw(FLOATS))


def m_column_shape(draw, b):
    how, i = draw(st.sampled_from(["metric", "valid", "length", "duplicate"])), _pick(draw, b.columns)
    if i is None or how == "metric":
        col = b.columns[i] if i is not None else b.columns.add(f64le=b"\0" * 8 * b.count)
        col.metric = draw(st.sampled_from(cat.NAMES) | TEXT)
    elif how == "valid":
        b.columns[i].valid = draw(st.binary(max_size=4))
    elif how == "length":
        col = b.columns[i]
        col.f64le = col.f64le[:-8] if draw(st.booleans()) else col.f64le + b"\0" * 8
    else:
        b.columns.append(b.columns[i])


# One entry per field, so that each is as likely as any other.
MUTATIONS = [
    _header("host", TEXT), _header("boot_id", TEXT), _header("seq", U64), _header("dropped_samples", U64),
    _header("min_unacked_seq", U64), _header("count", U32), m_times, m_gpus, m_buffer_length,
    *(_device(f, v) for f, v in [("gpu", U32), ("uuid", TEXT), ("name", TEXT), ("architecture", TEXT),
                                 ("memory_total_bytes", U64), ("power_limit_watts", FLOATS),
                                 ("pcie_generation", U32), ("pcie_width", U32)]),
    m_device_list, m_renumber_gpu, m_column_value, m_column_shape,
    *(_process(f, v) for f, v in [("sample", U32), ("pid", U32), ("used_memory_bytes", U64),
                                  ("cpu_cores", FLOATS), ("command", COMMAND | TEXT)]),
    *(_health(f, v) for f, v in [("gpu", U32), ("t", TIMES), ("detail", TEXT), ("code", U64),
                                 ("kind", st.sampled_from(list(pb.HealthKind.values()) + [99]))]),
]


@st.composite
def batches(draw) -> pb.SampleBatch:
    """A good batch with up to three of its fields swapped for edges."""
    b = draw(good_batch())
    for mutate in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        mutate(draw, b)
    return b


def _check_accepted(batch: pb.SampleBatch, d: ingest.DecodedBatch) -> None:
    """What decode hands on is what was sent (no silent wrap-around of a
    GPU index into INTEGER), in a form the store may take."""
    table = samples_table([d])
    assert table.num_rows == d.count == len(d.values)
    assert table.column("gpu").to_pylist() == np.frombuffer(batch.gpu_u32le, "<u4").tolist()
    assert not np.isinf(d.values).any()          # missing is NaN (NULL when stored), a value is finite
    if d.processes is not None:
        for command in d.processes.command:
            assert SECRET not in command and len(command.encode()) <= ingest.MAX_COMMAND_BYTES
    assert all(SECRET not in job for job in d.job.values())


# -- properties ------------------------------------------------------------------------
# Every field on its own (Hypothesis alone favours some choices of a long
# list over others), then any few at once.
FIELDS = pytest.mark.parametrize("mutate", MUTATIONS, ids=[m.__name__ for m in MUTATIONS])


def _decode_or_refuse(batch: pb.SampleBatch) -> None:
    try:
        d = decode(batch, now=NOW)
    except BatchError as exc:
        assert len(str(exc)) < 600, "an error must never echo a whole bad value"
        return
    _check_accepted(batch, d)


@FIELDS
@settings(max_examples=30, **FUZZ)
@given(batch=good_batch(), data=st.data())
def test_decode_takes_or_refuses_each_field_at_its_edges(mutate, batch, data):
    mutate(data.draw, batch)
    _decode_or_refuse(batch)


@settings(max_examples=800, **FUZZ)
@given(batch=batches())
def test_decode_takes_or_refuses_several_edges_at_once(batch):
    _decode_or_refuse(batch)


@pytest.fixture(scope="module")
def analyzer(tmp_path_factory):
    a = Analyzer(AnalyzerConfig(str(tmp_path_factory.mktemp("fuzz") / "a.duckdb"), memory_limit="256MB"))
    a.start()
    yield a
    a.close()


_stored = itertools.count()
_boots = itertools.count()


@FIELDS
@settings(max_examples=20, **FUZZ)
@given(batch=good_batch(), data=st.data())
def test_every_accepted_batch_is_stored(analyzer, mutate, batch, data):
    mutate(data.draw, batch)
    fresh = batch.boot_id in BOOT_IDS
    if fresh:                    # a boot of its own, same length: every example is new and written
        batch.boot_id = batch.boot_id[:-8] + f"{next(_boots):08d}"
    try:
        fut = analyzer.submit(batch)                 # decodes on the analyzer's own clock
    except BatchError:
        return
    result = fut.result(timeout=30)                  # raises if the store refused what validation let through
    assert result == COMMITTED if fresh else result in (COMMITTED, DUPLICATE)
    if result == COMMITTED:
        next(_stored)


def test_after_the_fuzzing_a_good_batch_still_lands(analyzer):
    assert next(_stored) > 200, "too few fuzzed batches were valid to say anything about the store"
    samples = [GpuSample(0, time.time() - 5 + i * 0.1, {"util_gpu_ratio": 0.5, "power_watts": 300.0})
               for i in range(10)]
    good = encode_batch("after-fuzz", "boot", 1, samples, [DeviceInfo(gpu=0, name="NVIDIA H200")])
    assert analyzer.submit(good).result(timeout=30) == COMMITTED
    rows = analyzer.store.reader().execute("SELECT count(*) FROM samples WHERE host = 'after-fuzz'").fetchone()
    assert rows == (10,)
    assert analyzer.writer.failed_groups == 0
