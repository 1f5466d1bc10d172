"""Every SampleBatch and CaptureRecord field at its edges: each class of bad
value is refused with the field named, and the largest good values are
accepted *and stored* by a real analyzer (a value that passes validation
and then fails inside DuckDB fails the whole commit group)."""
import itertools
import re
import time

import numpy as np
import pytest

from gpuscope.analyzers import ingest
from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.ingest import BatchError, clean_command, decode, validate_capture_record
from gpuscope.collectors.records import (ATTRIBUTION_FIELDS, MAX_ATTRIBUTION_BYTES, Attribution, DeviceInfo,
                                        GpuSample, HealthKind, HealthRecord, ProcessRecord)
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import samples_pb2 as pb

BIG = 2**63           # one past BIGINT
U64 = 2**64 - 1
DAY = 86_400.0
_hosts = itertools.count()


OWNER = Attribution(user="alice", pod="trainer-0", namespace="ml", container="main", slurm_job="81234")


def make_batch(host="h1", boot="boot", seq=1, n=4, t0=None, command="python train.py",
               device: dict | None = None, health_t=None, owner: Attribution | None = OWNER) -> pb.SampleBatch:
    """A valid batch as the agent builds it: 2 GPUs, a process and whose it is, a health event."""
    t0 = time.time() - 10 if t0 is None else t0
    samples = [GpuSample(i % 2, t0 + i, {"util_gpu_ratio": 0.5, "power_watts": 300.0},
                         (ProcessRecord(4242, 1 << 30, 1.5, command, owner),)) for i in range(n)]
    facts = dict(uuid="GPU-0", name="NVIDIA H200", architecture="hopper", memory_total_bytes=150 << 30,
                 power_limit_watts=700.0, pcie_generation=5, pcie_width=16) | (device or {})
    devices = [DeviceInfo(gpu=0, **facts), DeviceInfo(gpu=1)]
    health = [HealthRecord(0, t0 if health_t is None else health_t, HealthKind.XID, "Xid 79", 79)]
    return encode_batch(host, boot, seq, samples, devices, health)


def _put(path: str, value):
    """Sets the field at `path` ("devices[0].name", "t_f64le[2]") to value."""
    *parents, leaf = path.split(".")

    def mutate(b):
        obj = b
        for part in parents:
            name, _, i = part.partition("[")
            obj = getattr(obj, name)[int(i[:-1])] if i else getattr(obj, name)
        name, _, i = leaf.partition("[")
        if i:                                            # an element of a little-endian buffer
            arr = np.frombuffer(getattr(obj, name), "<f8").copy()
            arr[int(i[:-1])] = value
            value_ = arr.tobytes()
        else:
            value_ = value
        setattr(obj, name, value_)
    return mutate


NOW = time.time()
NAN, INF = float("nan"), float("inf")
# (field, value or mutation, what the error says after "field: ")
BAD = [
    ("host", "", "empty"),
    ("host", "h" * 254, "longer than 253 bytes"),
    ("host", "é" * 127, "longer than 253 bytes"),                   # 254 bytes in 127 characters
    ("host", "h1\x1b[2J", r"'h1\\x1b\[2J' holds a blank, control"),
    ("host", "my host", ".* blank"),
    ("host", "h\n1", ""),
    ("host", "h\u202e1", ""),                                        # a bidi override
    ("boot_id", "", "empty"),
    ("boot_id", "b" * 65, "longer than 64"),
    ("boot_id", "../etc", r"'\.\./etc' may hold only"),
    ("seq", 0, r"0 is outside \[1, 9223372036854775807\]"),
    ("seq", BIG, "9223372036854775808 is outside"),
    ("seq", U64, "18446744073709551615 is outside"),
    ("dropped_samples", BIG, "9223372036854775808 .*BIGINT"),
    ("min_unacked_seq", 2, r"2 is outside \[0, 1\] \(0, or at most this batch's seq\)"),
    ("min_unacked_seq", U64, "18446744073709551615 is outside"),
    ("count", ingest.MAX_BATCH_SAMPLES + 1, "200001 samples, at most"),
    ("t_f64le[0]", 1.0, "1.0 is .* days old, more than MAX_AGE_S = 7 days"),
    ("t_f64le[2]", 1_250_000_000.0, ".* MAX_AGE_S"),                 # a recording of 2009
    ("t_f64le[3]", NOW - 8 * DAY, ".* is 8 days old"),
    ("t_f64le[0]", NOW + 3600, ".* 3600 s in the future, more than MAX_FUTURE_SKEW_S"),
    ("t_f64le[1]", NAN, "nan is not a Unix time"),
    ("t_f64le[0]", INF, "inf is not a Unix time"),
    ("t_f64le[0]", -INF, "-inf is not a Unix time"),
    ("t_f64le[0]", -5.0, "-5.0 is .* days old"),
    ("devices", lambda b: b.devices.extend(pb.Device(gpu=g) for g in range(2, 258)), "258 entries, at most 256"),
    ("devices[1].gpu", 1024, r"1024 is outside \[0, 1023\]"),
    ("devices[1].gpu", 2**32 - 1, "4294967295"),
    ("devices[1].gpu", 0, "GPU 0 is listed twice"),
    ("devices[0].memory_total_bytes", U64, r"18446744073709551615 is outside \[0, 9223372036854775807\] \(the store's BIGINT"),
    ("devices[0].memory_total_bytes", BIG, ""),
    ("devices[0].power_limit_watts", 0.0, "0.0 is outside"),
    ("devices[0].power_limit_watts", -700.0, ""),
    ("devices[0].power_limit_watts", NAN, "nan"),
    ("devices[0].power_limit_watts", INF, "inf"),
    ("devices[0].power_limit_watts", 10_000.5, ""),
    ("devices[0].pcie_generation", 0, r"0 is outside \[1, 16\]"),
    ("devices[0].pcie_generation", 2**32 - 1, ""),
    ("devices[0].pcie_width", 65, r"65 is outside \[1, 64\]"),
    ("devices[0].pcie_width", 0, ""),
    ("devices[0].pcie_max_generation", 17, r"17 is outside \[1, 16\]"),
    ("devices[0].pcie_max_width", 128, r"128 is outside \[1, 64\]"),
    ("devices[0].name", "N" * 257, "longer than 256 bytes"),
    ("devices[0].name", "N" * 50_000_000, "longer than 256 bytes"),
    ("devices[0].name", "NVIDIA\nH200", r"'NVIDIA\\nH200' holds a control"),
    ("devices[0].uuid", "GPU-\x00", ""),
    ("devices[0].architecture", "ä" * 129, "longer than 256"),
    ("devices[0].source", "dcgm " * 60, "longer than 256"),
    ("devices[0].attribution", 5, "5 is not one of the batch.s 1 attributions"),
    ("columns[0].metric", "x" * 10_000_000, r"unknown metric 'x{40}'\.\.\. "),
    ("processes", lambda b: b.processes.extend([pb.ProcessSample(sample=0, pid=1)] * (ingest.MAX_PROCESSES + 1)),
     "131077 entries, at most 131072"),
    ("processes[1].pid", 0, r"0 is outside \[1, 4194304\]"),
    ("processes[1].pid", 2**32 - 1, "4294967295 is outside"),
    ("processes[2].used_memory_bytes", BIG, "9223372036854775808 .*BIGINT"),
    ("processes[0].cpu_cores", NAN, "nan"),
    ("processes[0].cpu_cores", -1.0, "-1.0"),
    ("processes[].command", lambda b: b.processes.extend(pb.ProcessSample(sample=0, pid=7, command=f"{i} " + "x" * 5000)
                                                         for i in range(300)), r"\d+ characters of distinct"),
    ("processes[3].attribution", 1, r"1 >= 1 attributions in the batch"),
    ("attributions", lambda b: b.attributions.extend([pb.Attribution()] * ingest.MAX_PROCESSES),
     "131073 entries, at most 131072"),
    ("attributions[0].pod", "p" * (MAX_ATTRIBUTION_BYTES + 1), "longer than 256 bytes"),
    ("attributions[0].user", "é" * 129, "longer than 256 bytes"),
    ("attributions[0].slurm_job", "1\x1b[2J", r"'1\\x1b\[2J' holds a control"),
    ("attributions[0].cgroup", "/a\nb", "'/a\\\\nb' holds"),
    ("health", lambda b: b.health.extend([pb.HealthEvent(gpu=0, t=NOW)] * ingest.MAX_HEALTH_EVENTS),
     "10001 entries, at most 10000"),
    ("health[0].gpu", 7, "GPU 7 has no entry"),
    ("health[0].t", 1.0, "1.0 is .* MAX_AGE_S"),
    ("health[0].t", NOW + 600, ".* in the future"),
    ("health[0].t", NAN, "nan is not a Unix time"),
    ("health[0].detail", "d" * 4097, "longer than 4096 bytes"),
    ("health[0].detail", "d" * 10_000_000, "longer than 4096"),
    ("health[0].detail", "Xid\x1b[31m", r"'Xid\\x1b\[31m' holds"),
    ("health[0].code", BIG, "9223372036854775808 .*BIGINT"),
    ("health[0].code", U64, "18446744073709551615"),
]


@pytest.mark.parametrize("field,change,says", BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_bad_value_is_refused_naming_the_field(field, change, says):
    b = make_batch(t0=NOW - 10)
    (change if callable(change) else _put(field, change))(b)
    with pytest.raises(BatchError, match="^" + re.escape(field) + ": " + says) as err:
        decode(b, now=NOW)
    assert len(str(err.value)) < 400, "an error must never echo a whole bad value"


def test_a_device_list_seen_before_is_not_checked_again_but_its_references_are():
    """Every batch repeats its devices; a list is checked once, and a new one
    (a field changed, a bad value) afresh. What points into the batch's own
    attributions is checked in every batch."""
    first = decode(make_batch(t0=NOW - 10), now=NOW)
    again = decode(make_batch(t0=NOW - 10, seq=2), now=NOW)
    assert again.devices == first.devices and again.devices is not first.devices
    changed = make_batch(t0=NOW - 10, seq=3)
    changed.devices[0].pcie_generation = 99
    with pytest.raises(BatchError, match=r"^devices\[0\]\.pcie_generation: 99"):
        decode(changed, now=NOW)
    dangling = make_batch(t0=NOW - 10, seq=4)
    dangling.devices[0].attribution = 0
    del dangling.attributions[:]
    for p in dangling.processes:
        p.ClearField("attribution")
    with pytest.raises(BatchError, match=r"^devices\[0\]\.attribution: 0 is not one of the batch's 0"):
        decode(dangling, now=NOW)
    ok = make_batch(t0=NOW - 10, seq=5)
    ok.devices[0].attribution = 0          # the same list, now pointing at an attribution that exists
    assert decode(ok, now=NOW).devices == first.devices


def test_a_day_old_batch_is_accepted_a_week_old_is_not():
    decode(make_batch(t0=NOW - DAY, health_t=NOW - DAY), now=NOW)      # an agent catching up after an outage
    decode(make_batch(t0=NOW + ingest.MAX_FUTURE_SKEW_S - 10), now=NOW)
    with pytest.raises(BatchError, match=r"^t_f64le\[0\]"):
        decode(make_batch(t0=NOW - ingest.MAX_AGE_S - 1), now=NOW)


# -- command lines: cleaned, not refused ---------------------------------------------
def test_long_command_is_cut_with_a_marker_on_a_character_boundary():
    out = clean_command("python " + "é" * 1_000_000)
    assert out.endswith(ingest.TRUNCATED)
    assert len(out.encode()) <= ingest.MAX_COMMAND_BYTES
    assert out.encode().decode() == out
    assert clean_command("x" * ingest.MAX_COMMAND_BYTES) == "x" * ingest.MAX_COMMAND_BYTES     # exactly fits: kept


def test_a_secret_the_cut_would_split_is_redacted_whole():
    out = clean_command("a" * 4070 + " https://me:longpassword123@host/x")
    assert "longpas" not in out and out.endswith(ingest.TRUNCATED)
    out = clean_command("a" * 4080 + " --hf-token=hf_abcdefghijklmnop")
    assert "hf_abc" not in out


def test_a_command_shortened_by_redaction_past_the_read_limit_is_still_marked_cut():
    out = clean_command("--token=" + "s" * 10_000 + " tail")
    assert out == "--token=<redacted>" + ingest.TRUNCATED


def test_control_characters_in_a_command_are_shown_not_refused_and_redaction_sees_through_them():
    out = clean_command("python\x1b[2J x.py --token\tabc\x00")
    assert out == "python\ufffd[2J x.py --token\ufffd<redacted>"


def test_processes_and_the_job_are_stored_redacted():
    d = decode(make_batch(command="python train.py --hf-token=hf_SECRET HF_TOKEN=hf_SECRET2 --lr 3e-4"), now=time.time())
    commands = set(d.processes.command)
    assert commands == {"python train.py --hf-token=<redacted> HF_TOKEN=<redacted> --lr 3e-4"}
    assert d.job[0] == "pid:4242 python train.py --hf-token=<redacted> HF_TOKEN=<redacted> --lr 3e-4"
    assert all("SECRET" not in j for j in d.job.values())


# -- capture records -----------------------------------------------------------------
def capture(**kw) -> pb.CaptureRecord:
    now = time.time()
    fields = dict(id="3f2a9c0b1d4e", host="gpu-node-7", target="127.0.0.1:9012", pid=4242, gpus=[0, 1],
                  job="pid:4242 python train.py", start=now - 5, end=now - 1, duration_ms=2000,
                  path="/var/lib/gpuscope/captures/3f2a9c0b1d4e/h.xplane.pb", size_bytes=123456, status="ok",
                  error="", trigger="on-call", kind="jax")
    fields.update(kw)
    return pb.CaptureRecord(**fields)


def test_a_good_capture_record_passes_at_its_edges():
    validate_capture_record(capture())
    validate_capture_record(capture(id="a" * 64, host="h" * 253, pid=ingest.MAX_PID, gpus=list(range(256)),
                                    path="p" * 4096, error="line one\n\tline two", job="j" * ingest.MAX_JOB_BYTES,
                                    duration_ms=ingest.MAX_CAPTURE_DURATION_MS, size_bytes=BIG - 1))
    rec = capture()
    rec.ClearField("pid")                  # a capture by address, no process
    validate_capture_record(rec)


CAPTURE_BAD = [
    ("record.id", dict(id=""), r"^record\.id: empty"),
    ("record.id", dict(id="../../etc/passwd"), r"^record\.id: .* may hold only"),
    ("record.id", dict(id="a" * 65), r"^record\.id: longer than 64"),
    ("record.host", dict(host=""), r"^record\.host: empty"),
    ("record.host", dict(host="a b"), r"^record\.host: "),
    ("record.host", dict(host="h" * 254), r"^record\.host: longer than 253"),
    ("record.target", dict(target="t" * 257), r"^record\.target: longer than 256"),
    ("record.target", dict(target="127.0.0.1:9012\r\n"), r"^record\.target: .* control"),
    ("record.status", dict(status="s" * 5000), r"^record\.status: longer than 256"),
    ("record.trigger", dict(trigger="on-call\x00"), r"^record\.trigger: "),
    ("record.kind", dict(kind="k" * 257), r"^record\.kind: "),
    ("record.path", dict(path="p" * 4097), r"^record\.path: longer than 4096"),
    ("record.path", dict(path="/tmp/x\ny"), r"^record\.path: "),
    ("record.error", dict(error="e" * 4097), r"^record\.error: longer than 4096"),
    ("record.error", dict(error="\x1b]0;pwned\x07"), r"^record\.error: "),
    ("record.job", dict(job="j" * (ingest.MAX_JOB_BYTES + 1)), r"^record\.job: longer than 4128"),
    ("record.pid", dict(pid=0), r"^record\.pid: 0 is outside"),
    ("record.pid", dict(pid=2**32 - 1), r"^record\.pid: 4294967295"),
    ("record.gpus", dict(gpus=[0, 1024]), r"^record\.gpus\[1\]: 1024 is outside \[0, 1023\]"),
    ("record.gpus", dict(gpus=list(range(257))), r"^record\.gpus: 257 entries"),
    ("record.start", dict(start=1.0, end=2.0), r"^record\.start: 1.0 is .* MAX_AGE_S"),
    ("record.start", dict(start=float("nan")), r"^record\.start: nan"),
    ("record.end", dict(end=float("inf")), r"^record\.end: inf"),
    ("record.end", dict(end=1.0), r"^record\.end: 1.0 is not between record\.start"),
    ("record.end", dict(end=time.time() + 3600), r"^record\.end: "),
    ("record.duration_ms", dict(duration_ms=2**32 - 1), r"^record\.duration_ms: 4294967295 is outside"),
    ("record.size_bytes", dict(size_bytes=U64), r"^record\.size_bytes: 18446744073709551615 .*BIGINT"),
]


@pytest.mark.parametrize("field,change,match", CAPTURE_BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(CAPTURE_BAD)])
def test_bad_capture_record_is_refused_naming_the_field(field, change, match):
    with pytest.raises(BatchError, match=match) as err:
        validate_capture_record(capture(**change))
    assert field in str(err.value) and len(str(err.value)) < 400


# -- the largest good values land in DuckDB ---------------------------------------------
@pytest.fixture(scope="module")
def analyzer(tmp_path_factory):
    a = Analyzer(AnalyzerConfig(str(tmp_path_factory.mktemp("validation") / "a.duckdb"), memory_limit="256MB"))
    a.start()
    yield a
    a.close()


def _edge_batch() -> pb.SampleBatch:
    host = f"höst-{next(_hosts)}-"
    host += "h" * (253 - len(host.encode()))                   # 253 bytes of UTF-8, printable, one word
    now = time.time()
    b = make_batch(host=host, boot="b" * 64, seq=BIG - 1, t0=now - DAY,
                   command="python train.py --api-key=sk-SECRET " + "x" * (ingest.MAX_WIRE_COMMAND_CHARS - 40),
                   device=dict(memory_total_bytes=BIG - 1, power_limit_watts=10_000.0, pcie_generation=16,
                               pcie_width=64, name="Ä" * 128, uuid="GPU-" + "f" * 252, architecture="a" * 256),
                   health_t=now + ingest.MAX_FUTURE_SKEW_S - 30)
    b.dropped_samples = BIG - 1
    b.min_unacked_seq = BIG - 1
    b.devices[1].gpu = ingest.MAX_GPU_INDEX
    b.gpu_u32le = np.array([0, ingest.MAX_GPU_INDEX] * 2, "<u4").tobytes()
    b.processes[1].pid = ingest.MAX_PID
    for name in ATTRIBUTION_FIELDS:                # every label at its longest, in 2-byte characters
        setattr(b.attributions[0], name, "ü" * (MAX_ATTRIBUTION_BYTES // 2))
    b.processes[1].used_memory_bytes = BIG - 1
    b.health[0].code = BIG - 1
    b.health[0].detail = "line one\n\t" + "d" * (4096 - 10)
    return b


def _one(a: Analyzer, sql: str, host: str):
    return a.store.reader().execute(sql, [host]).fetchall()


def test_the_largest_good_values_are_stored(analyzer):
    b = _edge_batch()
    assert decode(b).min_unacked_seq == BIG - 1      # valid by itself ...
    assert analyzer.submit(b).result(timeout=30) == "committed"      # ... and DuckDB takes it
    assert _one(analyzer, "SELECT count(*) FROM samples WHERE host = ?", b.host) == [(4,)]
    assert _one(analyzer, "SELECT gpu, memory_total_bytes, pcie_generation, pcie_width FROM devices "
                          "WHERE host = ? ORDER BY gpu", b.host) == [(0, BIG - 1, 16, 64), (1023, None, None, None)]
    assert _one(analyzer, "SELECT code, length(detail) FROM health WHERE host = ?", b.host) == [(BIG - 1, 4096)]
    assert _one(analyzer, "SELECT max_seq, dropped_samples FROM agents WHERE host = ?", b.host) == [(BIG - 1, BIG - 1)]
    procs = _one(analyzer, "SELECT max(pid), max(used_memory_bytes), max(strlen(command)), "
                           "bool_or(contains(command, 'SECRET')) FROM processes WHERE host = ?", b.host)
    assert procs == [(ingest.MAX_PID, BIG - 1, ingest.MAX_COMMAND_BYTES, False)]
    cols = ", ".join(f'max(strlen("{k}"))' for k in ATTRIBUTION_FIELDS)
    assert _one(analyzer, f"SELECT {cols} FROM processes WHERE host = ?", b.host) == [
        (MAX_ATTRIBUTION_BYTES,) * len(ATTRIBUTION_FIELDS)]


def test_attributions_travel_once_a_batch_and_land_with_their_processes(analyzer):
    """A process repeats in every sample, its attribution once per batch;
    a process without one (exited before it was read) stores NULLs; the
    GPU's job carries its attribution."""
    t0 = time.time() - 10
    other = Attribution(user="bob", slurm_job="7", slurm_step="0")
    samples = [GpuSample(g, t0 + i, {"util_gpu_ratio": 0.5},
                         (ProcessRecord(10 + g, (2 << 30) if g else 1 << 30, None, "python train.py",
                                        OWNER if g == 0 else other),
                          ProcessRecord(99, 1 << 20, None, "python eval.py", None)))
               for i in range(3) for g in (0, 1)]
    b = encode_batch(f"owners-{next(_hosts)}", "boot", 1, samples, [DeviceInfo(gpu=0), DeviceInfo(gpu=1)])
    assert len(b.attributions) == 2 and len(b.processes) == 12
    assert [p.attribution if p.HasField("attribution") else None for p in b.processes[:4]] == [0, None, 1, None]
    d = decode(b)
    assert d.job == {0: "pid:10 python train.py", 1: "pid:11 python train.py"}
    assert d.owner[0] == dict(user="alice", pod="trainer-0", namespace="ml", container="main", slurm_job="81234")
    assert d.owner[1] == dict(user="bob", slurm_job="7", slurm_step="0")
    assert analyzer.submit(b).result(timeout=30) == "committed"
    rows = _one(analyzer, 'SELECT DISTINCT pid, "user", namespace, pod, slurm_job, slurm_step FROM processes '
                          "WHERE host = ? ORDER BY pid", b.host)
    assert rows == [(10, "alice", "ml", "trainer-0", "81234", None), (11, "bob", None, None, "7", "0"),
                    (99, None, None, None, None, None)]


def test_an_older_agents_batch_without_attributions_still_lands(analyzer):
    b = make_batch(host=f"old-{next(_hosts)}", owner=None)
    assert not b.attributions and decode(b).owner == {}
    assert analyzer.submit(b).result(timeout=30) == "committed"
    assert _one(analyzer, 'SELECT count(*), count("user") FROM processes WHERE host = ?', b.host) == [(4, 0)]


def test_a_refused_batch_writes_nothing_and_the_next_good_one_lands(analyzer):
    bad = _edge_batch()
    bad.devices[0].memory_total_bytes = U64
    with pytest.raises(BatchError, match="memory_total_bytes"):
        analyzer.submit(bad)
    good = make_batch(host=f"after-{next(_hosts)}")
    assert analyzer.submit(good).result(timeout=30) == "committed"
    assert _one(analyzer, "SELECT count(*) FROM samples WHERE host = ?", good.host) == [(4,)]
    assert _one(analyzer, "SELECT count(*) FROM samples WHERE host = ?", bad.host) == [(0,)]


def test_a_gauge_past_any_gpus_range_is_refused_naming_it():
    import time as _time

    from gpuscope.analyzers.ingest import BatchError, decode
    from gpuscope.collectors.records import DeviceInfo, GpuSample
    from gpuscope.daemon.convert import encode_batch

    def one(metric, value):
        return encode_batch("h", "b", 1, [GpuSample(0, _time.time() - 1, {metric: value})], [DeviceInfo(gpu=0)])
    with pytest.raises(BatchError, match=r"power_watts\)\[0\]: 1e\+308 watts is past any GPU's"):
        decode(one("power_watts", 1e308))
    assert decode(one("power_watts", 700.0)).count == 1
    assert decode(one("energy_joules_total", 1e15)).count == 1        # counters only need to fit BIGINT


def test_a_health_kind_this_analyzer_does_not_know_is_kept_by_its_number():
    """A newer agent's kind: refusing the batch would lose its samples; the
    trial found it stored as `unspecified`, which hid what it was."""
    b = make_batch()
    b.health[0].kind = 99
    assert decode(b).health[0][3] == "kind_99"
    assert decode(make_batch()).health[0][3] == "xid"
