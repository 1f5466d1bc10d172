"""The fuzzed batches and capture reports through the real gRPC server:
every batch an Ingest stream takes gets its ack (COMMITTED, DUPLICATE or
REJECTED naming the field), Push and ReportCapture answer OK or
INVALID_ARGUMENT, never UNKNOWN or INTERNAL, and valid data still lands."""
from __future__ import annotations

import time

import grpc
import pytest
from hypothesis import given, settings, strategies as st

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb
from tests.fuzz.test_fuzz_batches import FUZZ, TEXT, batches
from tests.helpers import AnalyzerServer

ANSWERED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = AnalyzerServer(tmp_path_factory.mktemp("grpc-fuzz") / "g.duckdb")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        yield analyzer_pb2_grpc.AnalyzerStub(ch)


@settings(max_examples=300, **FUZZ)
@given(st.lists(batches(), min_size=1, max_size=6))
def test_an_ingest_stream_answers_every_batch_it_took(stub, sent):
    for i, b in enumerate(sent):
        b.seq = i + 1
        b.boot_id = "fuzz-" + str(abs(hash(b.SerializeToString())) % 10**12)
    acks = list(stub.Ingest(iter(sent), timeout=60))
    assert [a.seq for a in acks] == [b.seq for b in sent]
    for a in acks:
        assert a.status in (pb.BatchAck.COMMITTED, pb.BatchAck.DUPLICATE, pb.BatchAck.REJECTED)
        if a.status == pb.BatchAck.REJECTED:
            assert a.error.startswith("INVALID_ARGUMENT: batch seq=") and len(a.error) < 2000


@settings(max_examples=150, **FUZZ)
@given(batches())
def test_push_is_acked_or_refused_naming_the_field(stub, batch):
    try:
        assert stub.Push(batch, timeout=30).status in (pb.BatchAck.COMMITTED, pb.BatchAck.DUPLICATE)
    except grpc.RpcError as exc:
        assert exc.code() in ANSWERED, (exc.code(), exc.details())


@st.composite
def capture_reports(draw) -> apb.CaptureReport:
    rec = pb.CaptureRecord(id=draw(st.sampled_from(["c1", "", "x" * 65, "ok_id-2"]) | TEXT),
                           host=draw(st.sampled_from(["h1", "", "h" * 300]) | TEXT),
                           target=draw(TEXT), job=draw(TEXT), path=draw(TEXT), status=draw(TEXT),
                           error=draw(TEXT), trigger=draw(TEXT), kind=draw(st.sampled_from(["jax", "torch-http", ""])),
                           start=draw(st.floats(allow_nan=True) | st.just(time.time())),
                           end=draw(st.floats(allow_nan=True) | st.just(time.time())),
                           duration_ms=draw(st.integers(0, 2**32 - 1)),
                           size_bytes=draw(st.integers(0, 2**64 - 1)),
                           gpus=draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)))
    if draw(st.booleans()):
        rec.pid = draw(st.integers(0, 2**32 - 1))
    xspace = draw(st.binary(max_size=512) | st.sampled_from([b"", b"{}", b'{"traceEvents": [{"ph": "X"}]}']))
    return apb.CaptureReport(record=rec, xspace=xspace)


@settings(max_examples=500, **FUZZ)
@given(capture_reports())
def test_capture_reports_are_stored_or_refused_naming_the_field(stub, report):
    try:
        stub.ReportCapture(report, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in ANSWERED, (exc.code(), exc.details())


def test_after_the_fuzzing_valid_data_lands(server, stub):
    s = [GpuSample(0, time.time() - 1, {"power_watts": 300.0})]
    assert stub.Push(encode_batch("after-grpc", "b", 1, s, [DeviceInfo(gpu=0)]), timeout=30).status == \
        pb.BatchAck.COMMITTED
    assert server.analyzer.store.reader().execute(
        "SELECT count(*) FROM samples WHERE host = 'after-grpc'").fetchone()[0] == 1


@pytest.mark.parametrize("method", ["Push", "ReportCapture"])
def test_bytes_that_are_no_message_are_invalid_argument(server, method):
    with grpc.insecure_channel(server.target) as ch:
        call = ch.unary_unary(f"/gpuscope.v1.Analyzer/{method}")     # raw bytes, no serializer
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and method in err.value.details()


def test_garbage_on_an_ingest_stream_ends_it_as_invalid_argument(server):
    with grpc.insecure_channel(server.target) as ch:
        call = ch.stream_stream("/gpuscope.v1.Analyzer/Ingest")
        with pytest.raises(grpc.RpcError) as err:
            list(call(iter([b"\xff\xff\xff\xff garbage"]), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_garbage_after_good_batches_ends_the_stream_after_their_acks(server):
    """Found in a trial: the garbage ended the stream at once, and the
    batches before it, committed, were never acknowledged (their resends
    came back DUPLICATE: nothing lost, but the agent was told nothing)."""
    good = [encode_batch("mid", "boot-mid", seq, [GpuSample(0, time.time() - 10 + seq, {"power_watts": 100.0})],
                         [DeviceInfo(gpu=0)]).SerializeToString() for seq in (1, 2, 3)]
    acks = []
    with grpc.insecure_channel(server.target) as ch:
        call = ch.stream_stream("/gpuscope.v1.Analyzer/Ingest", response_deserializer=pb.BatchAck.FromString)
        with pytest.raises(grpc.RpcError) as err:
            for ack in call(iter([*good, b"\xff\xff\xff\xff garbage"]), timeout=10):
                acks.append(ack)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid message" in err.value.details()
    assert [(a.seq, a.status) for a in acks] == [(s, pb.BatchAck.COMMITTED) for s in (1, 2, 3)]
