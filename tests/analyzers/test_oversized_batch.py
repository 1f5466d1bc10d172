"""A batch larger than its counts allow is refused before it takes byte
budget or decoding time: one client streaming 50 MB batches of over-long
names held budget the other agents waited for (ack p50 x3.5, p99 x6,
docs/benchmarks.md). The allowance must still take every valid batch."""
import time

import grpc
import pytest

from gpuscope.analyzers import ingest, service
from gpuscope.analyzers.batch_size import check_size, screen
from gpuscope.analyzers.ingest import BatchError, decode
from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS, MAX_ATTRIBUTION_BYTES, DeviceInfo, GpuSample, ProcessRecord
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer

WIDE = "\U0001F600"        # a 4-byte character: the most bytes a character can take


def _widest_batch(n_devices: int, n_processes: int, n_health: int, n_attributions: int, n: int = 64) -> pb.SampleBatch:
    """A valid batch whose every string is at its limit in the widest
    characters the field takes: the most bytes these counts can carry."""
    now = time.time()
    label = "\u00e9" * (ingest.MAX_LABEL_BYTES // 2)
    devices = [DeviceInfo(gpu=g, uuid=label, name=label, architecture=label, source=label, driver_version=label,
                          memory_total_bytes=2**63 - 1, power_limit_watts=700.0, pcie_generation=5, pcie_width=16,
                          pcie_max_generation=5, pcie_max_width=16) for g in range(n_devices)]
    values = {m: 0.5 if m.endswith("_ratio") else 1.0 for m in cat.NAMES}
    samples = [GpuSample(i % n_devices, now - 60 + i * 1e-3, values) for i in range(n)]
    b = encode_batch("h" * ingest.MAX_HOST_BYTES, "b" * ingest.MAX_TOKEN_LEN, 2**62, samples, devices)
    assert len(b.columns) == len(cat.NAMES)
    b.dropped_samples = b.min_unacked_seq = 2**62
    for k in range(n_attributions):
        b.attributions.add(**{f: WIDE * (MAX_ATTRIBUTION_BYTES // 4) for f in ATTRIBUTION_FIELDS})
    command = WIDE * ingest.MAX_WIRE_COMMAND_CHARS      # the longest a batch may carry
    for k in range(n_processes):
        b.processes.add(sample=k % n, pid=ingest.MAX_PID, used_memory_bytes=2**63 - 1, cpu_cores=1e6,
                        command=command, attribution=k % max(1, n_attributions))
        if not n_attributions:
            b.processes[-1].ClearField("attribution")
    for k in range(n_health):
        b.health.add(gpu=0, t=now - 1, kind=pb.HEALTH_KIND_XID, detail="d" * ingest.MAX_DETAIL_BYTES, code=2**63 - 1)
    return b


@pytest.mark.parametrize("shape", [(1, 0, 0, 0), (256, 0, 0, 0), (8, 64, 0, 0), (8, 0, 200, 0), (8, 16, 0, 16),
                                   (8, 200, 50, 200)])
def test_every_valid_batch_fits_its_allowance(shape):
    b = _widest_batch(*shape)
    decode(b)                                      # valid ...
    check_size(b, b.ByteSize())                    # ... so never refused for its size


def test_the_agents_largest_batch_fits_its_allowance():
    """4,096 samples (the uplink's max_batch_samples) of 8 GPUs, every metric, 8 processes a sample
    with 256-character command lines (where procstat cuts them)."""
    now = time.time()
    values = {m: 0.5 if m.endswith("_ratio") else 1.0 for m in cat.NAMES}
    procs = tuple(ProcessRecord(1000 + k, 1 << 30, 1.0, "x" * 256) for k in range(8))
    samples = [GpuSample(i % 8, now - 600 + i * 0.1, values, procs) for i in range(4096)]
    b = encode_batch("gpu-node-17", "0123456789abcdef", 7, samples, [DeviceInfo(gpu=g, name="NVIDIA H200")
                                                                      for g in range(8)])
    decode(b)
    check_size(b, b.ByteSize())


def test_a_newer_agents_small_unknown_field_is_taken_a_large_one_is_not():
    b = _widest_batch(8, 0, 0, 0)
    small = b.SerializeToString() + b"\x9a\x06\x80\x08" + b"u" * 1024        # field 99, 1 KiB
    parsed = pb.SampleBatch.FromString(small)
    check_size(parsed, len(small))
    large = b.SerializeToString() + b"\x9a\x06\x80\x80\x80\x05" + b"u" * (10 << 20)   # 10 MiB
    with pytest.raises(BatchError, match=r"bytes on the wire, more than the \d+ that count=64, 61 columns, 8 devices"):
        check_size(pb.SampleBatch.FromString(large), len(large))


def test_counts_over_their_limits_are_refused_before_the_size():
    b = _widest_batch(1, 0, 0, 0)
    for _ in range(len(cat.NAMES) + 1 - len(b.columns)):
        b.columns.add(metric="power_watts")
    with pytest.raises(BatchError, match=r"columns: 62 entries, at most 61"):
        check_size(b, b.ByteSize())


def _good(seq: int, t0: float) -> pb.SampleBatch:
    return encode_batch("host-a", "boot", seq, [GpuSample(0, t0 + seq, {"power_watts": 100.0})],
                        [DeviceInfo(gpu=0, name="NVIDIA H200")])


def test_an_oversized_batch_is_refused_in_its_stream_without_being_decoded(tmp_path, monkeypatch):
    decoded, sized = [], []
    real_decode, real_check = ingest.decode, service.check_size
    monkeypatch.setattr(ingest, "decode", lambda b: (decoded.append(b.seq), real_decode(b))[1])
    monkeypatch.setattr(service, "check_size", lambda b, n: (sized.append(n), real_check(b, n))[1])
    srv = AnalyzerServer(tmp_path / "o.duckdb")
    try:
        t0 = time.time() - 30
        bad = _good(2, t0)
        bad.devices[0].name = "N" * (8 << 20)
        batches = [_good(1, t0), bad, _good(3, t0)]
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            acks = list(stub.Ingest(iter(batches), timeout=30))
            with pytest.raises(grpc.RpcError) as push:
                stub.Push(bad, timeout=30)
            with pytest.raises(grpc.RpcError) as garbage:
                ch.unary_unary("/gpuscope.v1.Analyzer/Push", request_serializer=None,
                               response_deserializer=pb.BatchAck.FromString)(b"\xff\xff\xff", timeout=30)
        assert [(a.seq, a.status) for a in acks] == [(1, pb.BatchAck.COMMITTED), (2, pb.BatchAck.REJECTED),
                                                     (3, pb.BatchAck.COMMITTED)]
        assert "bytes on the wire" in acks[1].error and "device labels 256 bytes" in acks[1].error
        assert push.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes on the wire" in push.value.details()
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Push: the request is not a valid message" in garbage.value.details()
        assert decoded == [1, 3]                                  # the refused batch never reached decoding
        assert sized == [len(b.SerializeToString()) for b in batches + [bad]]     # as received
        assert srv.analyzer.rejected == 3                         # garbage is a refusal too, counted and logged
        assert srv.analyzer.writer.budget.used == 0
    finally:
        srv.stop()


@pytest.mark.parametrize("shape", [(256, 0, 0, 0), (8, 200, 50, 200), (8, 3000, 0, 0)])
def test_every_valid_batch_passes_the_screen_of_its_strings(shape):
    b = _widest_batch(*shape)
    screen(b, b.ByteSize())


def _padded(n_processes: int) -> pb.SampleBatch:
    """A valid-looking batch with many empty processes: 2-6 bytes each on the
    wire, each allowed a 20 KiB command line by the counts alone."""
    b = _good(1, time.time() - 30)
    for k in range(n_processes):
        b.processes.add(sample=0, pid=1 + k)
    return b


def test_a_batch_padded_with_empty_entries_is_refused_by_its_strings():
    """Found in a trial: 131k empty processes let 50 MB of over-long strings
    past the counts' allowance (the other agents' ack p99 x12)."""
    b = _padded(20_000)
    b.devices[0].name = "N" * (4 << 20)
    check_size(b, b.ByteSize())                       # the counts alone allow it ...
    with pytest.raises(BatchError, match=r"devices\[0\]\.name: longer than 256 bytes of UTF-8 \(4194304 characters\)"):
        screen(b, b.ByteSize())                       # ... its strings do not
    b = _padded(20_000)
    b.health.add(gpu=0, t=time.time() - 1, kind=pb.HEALTH_KIND_XID, detail="d" * (3 << 20))
    with pytest.raises(BatchError, match=r"health\[0\]\.detail: longer than 4096 bytes"):
        screen(b, b.ByteSize())
    body = _padded(20_000).SerializeToString() + b"\x9a\x06\x80\x80\x80\x02" + b"u" * (4 << 20)   # 4 MiB, field 99
    padded = pb.SampleBatch.FromString(body)
    check_size(padded, len(body))
    with pytest.raises(BatchError, match=r"more than the \d+ that its count=1, 1 columns, 1 devices, 20000 processes.*"
                                         r"fields this analyzer does not know"):
        screen(padded, len(body))


def test_a_command_line_longer_than_cleaning_reads_is_refused_by_name():
    b = _good(1, time.time() - 30)
    b.processes.add(sample=0, pid=7, command="c" * 256)
    decode(b)
    b.processes.add(sample=0, pid=8, command="c" * (ingest.MAX_WIRE_COMMAND_CHARS + 1))
    want = rf"processes\[1\]\.command: {ingest.MAX_WIRE_COMMAND_CHARS + 1} characters, at most " \
           rf"{ingest.MAX_WIRE_COMMAND_CHARS} \(the agent cuts command lines at 256\)"
    with pytest.raises(BatchError, match=want):
        decode(b)
    with pytest.raises(BatchError, match=want):
        screen(b, b.ByteSize())


def test_arrays_that_do_not_match_the_count_are_told_as_such_not_as_a_size():
    b = _good(1, time.time() - 30)
    b.t_f64le += b"\0" * (8 << 20)
    with pytest.raises(BatchError, match=r"t_f64le: 8388616 bytes, expected 8 for count=1"):
        check_size(b, b.ByteSize())
    b = _good(1, time.time() - 30)
    b.columns[0].f64le += b"\0" * 16
    with pytest.raises(BatchError, match=r"columns\[0\]\.f64le: 24 bytes, expected 8 for count=1"):
        check_size(b, b.ByteSize())


def test_a_padded_batch_is_refused_in_its_stream_without_taking_budget(tmp_path, monkeypatch):
    decoded, acquired = [], []
    real_decode = ingest.decode
    monkeypatch.setattr(ingest, "decode", lambda b: (decoded.append(b.seq), real_decode(b))[1])
    srv = AnalyzerServer(tmp_path / "p.duckdb")
    real_acquire = srv.analyzer.writer.budget.acquire

    async def acquire(n):
        acquired.append(n)
        await real_acquire(n)
    monkeypatch.setattr(srv.analyzer.writer.budget, "acquire", acquire)
    try:
        t0 = time.time() - 30
        bad = _padded(50_000)
        bad.seq = 2
        bad.devices[0].name = "N" * (2 << 20)
        with grpc.insecure_channel(srv.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            acks = list(analyzer_pb2_grpc.AnalyzerStub(ch).Ingest(iter([_good(1, t0), bad, _good(3, t0)]), timeout=60))
        assert [(a.seq, a.status) for a in acks] == [(1, pb.BatchAck.COMMITTED), (2, pb.BatchAck.REJECTED),
                                                     (3, pb.BatchAck.COMMITTED)]
        assert "batch seq=2: devices[0].name: longer than 256 bytes of UTF-8" in acks[1].error
        assert decoded == [1, 3] and len(acquired) == 2 and max(acquired) < 1 << 20
    finally:
        srv.stop()
