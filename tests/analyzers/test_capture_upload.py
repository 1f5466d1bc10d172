"""Traces come in chunks (UploadCapture), so the analyzer takes no message
over MAX_RECEIVE_BYTES: each is copied on its event loop before any check,
and one client's 100 MB messages took two thirds of the loop's time. An
upload that breaks its own rules is refused naming how; a good one is
stored as ReportCapture's was."""
import re
import threading
import time

import grpc
import pytest

from gpuscope.analyzers import capture_upload
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.daemon.serve import MAX_RECEIVE_BYTES
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb
from tests.conftest import FIXTURE
from tests.helpers import AnalyzerServer


def _trace() -> bytes:
    run = next((FIXTURE / "traces" / "launch_bound" / "plugins" / "profile").iterdir())
    return (run / "vm.xplane.pb").read_bytes()


def _record(cid="up1"):
    return pb.CaptureRecord(id=cid, host="h1", target="127.0.0.1:9012", pid=461, gpus=[0], start=time.time() - 5,
                            end=time.time() - 4, duration_ms=500, status="ok", trigger="on-call")


@pytest.fixture
def srv(tmp_path):
    s = AnalyzerServer(tmp_path / "u.duckdb")
    yield s
    s.stop()


def _upload(srv, chunks):
    with grpc.insecure_channel(srv.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        return analyzer_pb2_grpc.AnalyzerStub(ch).UploadCapture(iter(chunks), timeout=30)


def test_a_trace_in_chunks_is_summarized_and_stored_like_a_report(fixture_dir, srv):
    trace = _trace()
    assert len(trace) > 3 * 64 << 10
    chunks = list(clients.capture_chunks(_record(), trace, size=64 << 10))
    assert len(chunks) > 3 and chunks[0].trace_bytes == len(trace)
    summary = _upload(srv, chunks)
    assert summary.verdict == "launch-bound" and summary.record.id == "up1"
    stored = srv.analyzer.store.captures("h1")
    assert [(c["id"], c["verdict"]) for c in stored] == [("up1", "launch-bound")]
    # the agent's own client sends the same way, in 1 MiB chunks
    clients.report_capture(srv.target, _record("up2"), trace)
    assert {c["id"] for c in srv.analyzer.store.captures("h1")} == {"up1", "up2"}


@pytest.mark.parametrize("chunks,message", [
    ([], "no chunk came"),
    ([apb.CaptureChunk(data=b"x")], "the first chunk must carry the capture's record"),
    ([apb.CaptureChunk(record=_record(), trace_bytes=capture_upload.MAX_TRACE_BYTES + 1)],
     r"trace_bytes: 268435457, at most 268435456"),
    ([apb.CaptureChunk(record=_record(), trace_bytes=4, data=b"ab"), apb.CaptureChunk(data=b"cde")],
     "chunk 1: the trace runs past the 4 bytes its first chunk announced"),
    ([apb.CaptureChunk(record=_record(), trace_bytes=4, data=b"ab")],
     "the upload ended after 2 of the 4 bytes"),
    ([apb.CaptureChunk(record=_record(), trace_bytes=4, data=b"ab"), apb.CaptureChunk(record=_record(), data=b"cd")],
     "chunk 1: only the first chunk carries the record"),
    ([apb.CaptureChunk(record=_record(), trace_bytes=2 << 20, data=b"x" * ((1 << 20) + 1))],
     "chunk 0: 1048577 bytes of data, at most 1048576"),
    ([apb.CaptureChunk(record=pb.CaptureRecord(id="bad id!", host="h1", target="x", status="ok"))],
     r"record: record\.id"),
])
def test_an_upload_that_breaks_its_rules_is_refused_naming_how(srv, chunks, message):
    with pytest.raises(grpc.RpcError) as err:
        _upload(srv, chunks)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, err.value.details()), err.value.details()
    assert srv.analyzer.store.captures("h1") == []


def test_a_message_over_the_servers_limit_is_refused_by_grpc_and_the_others_go_on(srv):
    """A 40 MiB message is refused before our code sees it; the agents' own
    are cut at 8 MiB (daemon/uplink.py)."""
    good = encode_batch("h1", "0123456789abcdef", 1, [GpuSample(0, time.time() - 5, {"power_watts": 1.0})],
                        [DeviceInfo(gpu=0, name="NVIDIA H200")])
    with grpc.insecure_channel(srv.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        big = apb.CaptureReport(record=_record("big"), xspace=b"x" * (MAX_RECEIVE_BYTES + (8 << 20)))
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportCapture(big, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Push(good, timeout=30).status == pb.BatchAck.COMMITTED


def _stalled(cid, release: threading.Event):
    """An upload that announces its trace, sends a byte and stalls."""
    yield apb.CaptureChunk(record=_record(cid), trace_bytes=10, data=b"x")
    release.wait(10)


def _hold_two(srv, release: threading.Event) -> list[threading.Thread]:
    """Two stalled uploads of host h1, each ended by the analyzer."""
    def hold(cid):
        with pytest.raises(grpc.RpcError):
            _upload(srv, _stalled(cid, release))
    threads = [threading.Thread(target=hold, args=(f"s{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)                                   # both open
    return threads


def test_stalled_uploads_cannot_hold_every_agents_captures_up(fixture_dir, srv, monkeypatch):
    """Two clients that announce a trace and stall hold both slots only until
    UPLOAD_RECEIVE_S; an upload that finds no slot within UPLOAD_WAIT_S is
    told to resend later. Then a real upload goes through."""
    from gpuscope.analyzers import service
    monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 1.5)
    monkeypatch.setattr(service, "UPLOAD_WAIT_S", 0.3)
    release = threading.Event()

    codes = []

    def call(cid):
        try:
            _upload(srv, _stalled(cid, release))
        except grpc.RpcError as exc:
            codes.append(exc.code())
    threads = [threading.Thread(target=call, args=(f"s{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)                                   # both slots held
    with pytest.raises(grpc.RpcError) as busy:
        _upload(srv, clients.capture_chunks(_record("late"), _trace()))
    assert busy.value.code() == grpc.StatusCode.UNAVAILABLE and "resend later" in busy.value.details()
    for t in threads:
        t.join(10)
    release.set()
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
    assert _upload(srv, clients.capture_chunks(_record("ok"), _trace())).verdict == "launch-bound"


def test_uploads_past_the_open_limit_are_refused_at_once_and_the_agent_sends_again(fixture_dir, srv, monkeypatch):
    """gRPC buffers what streams waiting for a slot send: 200 waiting uploads
    took 9.8 GB (found in a trial). Past MAX_OPEN_UPLOADS an upload, or an
    older agent's ReportCapture, is refused at once; the agent's client
    sends its report again after a pause, and it lands once a slot frees."""
    from gpuscope.analyzers import service
    monkeypatch.setattr(service, "MAX_OPEN_UPLOADS", 2)
    monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 2.0)
    release = threading.Event()
    threads = _hold_two(srv, release)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as full:
        _upload(srv, clients.capture_chunks(_record("late"), _trace()))
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - t0 < 1.0
    assert "2 capture uploads are open (2 of host 'h1'), at most 2 (4 a host); resend later" in full.value.details()
    with grpc.insecure_channel(srv.target) as ch:
        with pytest.raises(grpc.RpcError) as legacy:
            analyzer_pb2_grpc.AnalyzerStub(ch).ReportCapture(apb.CaptureReport(record=_record("old")), timeout=10)
    assert legacy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    clients.report_capture(srv.target, _record("again"), _trace(), backoff_s=1.0)   # 1 + 2 s: past the stall
    release.set()
    for t in threads:
        t.join(10)
    assert {c["id"] for c in srv.analyzer.store.captures("h1")} == {"again"}


def test_a_refused_report_stops_waiting_to_be_sent_again_once_the_agent_stops(fixture_dir, srv, monkeypatch):
    """Its pauses (5, 10, 20 s) ignored the agent's shutdown: a refused
    report held its thread for minutes after the agent was told to stop."""
    from gpuscope.analyzers import service
    monkeypatch.setattr(service, "MAX_OPEN_UPLOADS", 2)
    monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 20.0)
    release, stop = threading.Event(), threading.Event()
    threads = _hold_two(srv, release)
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(clients.ClientError) as refused:
        clients.report_capture(srv.target, _record("stopping"), _trace(), backoff_s=30.0, stop=stop)
    assert time.monotonic() - t0 < 5.0 and "RESOURCE_EXHAUSTED" in str(refused.value)
    release.set()
    for t in threads:
        t.join(10)
    assert "stopping" not in {c["id"] for c in srv.analyzer.store.captures("h1")}


def test_an_older_agents_report_is_admitted_before_its_message_is_received(fixture_dir, srv, monkeypatch):
    """ReportCapture carries the whole trace in one message, which gRPC
    received before any limit of ours ran (100 reports of 29 MiB at once took
    5.3 GB in a trial). Its place is now taken first: a caller that sends
    nothing is refused at once when the uploads are full, and one holding a
    place without sending is ended after UPLOAD_RECEIVE_S."""
    from gpuscope.analyzers import service
    monkeypatch.setattr(service, "MAX_OPEN_UPLOADS", 2)
    monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 1.0)
    never = threading.Event()

    def nothing():
        never.wait(10)
        yield from ()

    def report(ch):         # the method as a stream: the client decides when (if ever) the message goes
        return ch.stream_unary("/gpuscope.v1.Analyzer/ReportCapture",
                               request_serializer=apb.CaptureReport.SerializeToString,
                               response_deserializer=apb.CaptureSummary.FromString)
    with grpc.insecure_channel(srv.target) as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as silent:
            report(ch)(nothing(), timeout=10)
        assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and 0.9 < time.monotonic() - t0 < 5
        assert "did not arrive within 1 s" in silent.value.details()
        monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 20.0)
        release = threading.Event()
        threads = _hold_two(srv, release)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as full:
            report(ch)(nothing(), timeout=10)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - t0 < 2
        never.set()
        release.set()
        for t in threads:
            t.join(10)
        summary = analyzer_pb2_grpc.AnalyzerStub(ch).ReportCapture(
            apb.CaptureReport(record=_record("unary"), xspace=_trace()), timeout=30)      # an older agent's call
    assert summary.record.id == "unary"


def _record_of(host, cid):
    r = _record(cid)
    r.host = host
    return r


def test_one_host_cannot_hold_every_open_upload(fixture_dir, srv, monkeypatch):
    """Found in a trial: one client's stalled streams held all 8 open uploads,
    and an honest agent's report was refused on every try."""
    from gpuscope.analyzers import service
    monkeypatch.setattr(service, "UPLOAD_RECEIVE_S", 2.0)
    monkeypatch.setattr(service, "MAX_OPEN_UPLOADS_PER_HOST", 2)
    release = threading.Event()
    threads = _hold_two(srv, release)
    with pytest.raises(grpc.RpcError) as third:              # a third from the same host
        _upload(srv, clients.capture_chunks(_record("h1more"), _trace()))
    assert third.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "(2 of host 'h1')" in third.value.details()
    other = _upload(srv, clients.capture_chunks(_record_of("h2", "fromh2"), _trace()))   # waits for a slot, lands
    assert other.record.id == "fromh2"
    release.set()
    for t in threads:
        t.join(10)


def test_a_slot_is_held_until_the_trace_is_stored_even_if_its_caller_gave_up(fixture_dir, srv, monkeypatch):
    """Found in a trial: callers that gave up freed their slots while their
    traces were still being stored, so more traces were held than slots."""
    gate = threading.Event()
    real = srv.analyzer.report_capture

    def slow(record, xspace):
        gate.wait(10)
        return real(record, xspace)
    monkeypatch.setattr(srv.analyzer, "report_capture", slow)
    for cid in ("gone1", "gone2"):
        with pytest.raises(grpc.RpcError) as err:
            with grpc.insecure_channel(srv.target) as ch:
                analyzer_pb2_grpc.AnalyzerStub(ch).UploadCapture(clients.capture_chunks(_record(cid), _trace()),
                                                                 timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    servicer = srv.servicer
    assert servicer._uploads_open == 2 and servicer._uploads.locked()     # both traces still held
    gate.set()
    deadline = time.monotonic() + 10
    while servicer._uploads_open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert servicer._uploads_open == 0 and not servicer._host_uploads
    assert {c["id"] for c in srv.analyzer.store.captures("h1")} == {"gone1", "gone2"}


def test_a_capture_the_store_cannot_write_is_unavailable_and_stored_when_sent_again(fixture_dir, srv, monkeypatch):
    """Found in a trial on a full disk: the report got UNKNOWN "Unexpected
    <class '_duckdb.TransactionException'>", the agent did not send it again,
    and the capture was lost."""
    import duckdb

    from gpuscope.analyzers.store import Store
    real = Store.upsert_capture
    full = [True]

    def upsert(self, row):
        if full:
            raise duckdb.IOException("IO Error: Could not write file \"f.duckdb.wal\": No space left on device")
        return real(self, row)
    monkeypatch.setattr(Store, "upsert_capture", upsert)
    with pytest.raises(clients.ClientError) as err:
        clients.report_capture(srv.target, _record("full"), _trace(), attempts=1)
    said = str(err.value)
    assert said == (f"{srv.target}: the capture was not stored, resend later: IO Error: Could not write file "
                    f"\"f.duckdb.wal\": No space left on device"), said
    assert srv.analyzer.store.captures("h1") == []
    threading.Timer(0.5, full.clear).start()              # room again while the agent waits to send it again
    clients.report_capture(srv.target, _record("full"), _trace(), attempts=3, backoff_s=1.0)
    assert [c["id"] for c in srv.analyzer.store.captures("h1")] == ["full"]
