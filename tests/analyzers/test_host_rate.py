"""Each host's share of the disk (--host-rate): a host over it is slowed,
the others are not, and nothing it sent is lost (found in a trial: one valid
client filled the disk at the writer's full speed)."""
import threading
import time

import grpc
import numpy as np
import pytest

from gpuscope.analyzers.flow import HostRate
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.cli import build_parser
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb

from tests.analyzers.test_throttle import Clock
from tests.helpers import AnalyzerServer

T0 = time.time() - 3600


def test_a_host_is_held_back_only_by_its_own_debt():
    clock = Clock()
    rate = HostRate(1000, 3000, max_debt=5000, clock=clock)
    assert [rate.charge("a", 1000) for _ in range(3)] == [0.0, 0.0, 0.0]      # the burst
    assert rate.charge("a", 2000) == 0.0          # the bucket was at 0: this one goes, and leaves a debt
    assert rate.charge("a", 1000) == pytest.approx(2.0)      # the next waits for the debt: 2000 B at 1000 B/s
    assert rate.charge("b", 3000) == 0.0           # another host has its own bucket
    clock.t += 1.0
    assert rate.charge("a", 1000) == pytest.approx(2.0)      # 3000 owed, 1000 paid
    assert rate.charge("a", 10) == pytest.approx(3.0)
    assert rate.charge("a", 10) == pytest.approx(3.01)
    rate.charge("a", 3000)
    assert rate.charge("a", 1) is None             # owes more than 5000 B: refused, nothing charged
    assert rate.charge("a", 1) is None and rate.refused == 2 and rate.held == 5
    clock.t += 1000.0                             # paid long ago: full again, no more than the burst
    assert [rate.charge("a", 1000) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.charge("a", 1000) == 0.0 and rate.charge("a", 1) == pytest.approx(1.0)


def test_hosts_paid_up_are_forgotten():
    clock = Clock()
    rate = HostRate(1000, 3000, clock=clock)
    rate.PRUNE_EVERY = 10
    for i in range(9):
        rate.charge(f"h{i}", 100)
    clock.t += 10.0
    rate.charge("last", 100)
    assert set(rate._level) == {"last"}


@pytest.mark.parametrize("value,expected", [("256KiB", 256 << 10), ("1MB/s", 1_000_000), ("0", 0),
                                            ("300000", 300_000), ("1.5MiB", 3 << 19), ("1TiB", 1 << 40), ("1KB", 1000)])
def test_the_flag_takes_sizes_a_second(value, expected):
    assert build_parser().parse_args(["analyzer", "--host-rate", value]).host_rate == expected


@pytest.mark.parametrize("value", ["fast", "12", "-1KiB", "2TiB", "1KiB/min", "999B"])
def test_the_flag_refuses_what_is_not_a_rate(value, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analyzer", "--host-rate", value])
    assert "--host-rate" in capsys.readouterr().err


def _batch(host, seq, n=300):
    samples = [GpuSample(0, T0 + seq + i / 1000, {"power_watts": 100.0 + i, "sm_active": 0.5}) for i in range(n)]
    return encode_batch(host, "boot", seq, samples, [DeviceInfo(gpu=0, name="NVIDIA H200")])


def _rows(srv, host):
    return srv.analyzer.store.reader().execute("SELECT count(*) FROM samples WHERE host = ?", [host]).fetchone()[0]


@pytest.fixture
def srv(tmp_path):
    s = AnalyzerServer(tmp_path / "a.duckdb")
    yield s
    s.stop()


def test_a_host_over_its_rate_is_slowed_and_loses_nothing_while_another_is_not(srv):
    size = _batch("greedy", 1).ByteSize()
    srv.servicer.host_rate = HostRate(4 * size, 2 * size)     # 4 batches a second after 2
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    quiet: list[float] = []

    def other_host():
        for seq in range(1, 6):
            t = time.monotonic()
            assert stub.Push(_batch("quiet", seq), timeout=10).status == pb.BatchAck.COMMITTED
            quiet.append(time.monotonic() - t)
            time.sleep(0.2)
    t0 = time.monotonic()
    th = threading.Thread(target=other_host)
    th.start()
    acks = list(stub.Ingest(iter([_batch("greedy", seq) for seq in range(1, 15)]), timeout=30))
    took = time.monotonic() - t0
    th.join(10)
    assert [a.status for a in acks] == [pb.BatchAck.COMMITTED] * 14
    assert took >= 2.5                 # 14 batches, 3 at once, the rest at 4 a second: ~2.75 s
    assert max(quiet) < 1.0            # its own bucket: never waited behind the greedy host
    assert _rows(srv, "greedy") == 14 * 300
    status = stub.GetStatus(apb.StatusRequest(), timeout=10)
    assert status.batches_held >= 10 and status.batches_over_rate == 0


def test_a_host_too_far_over_its_rate_is_told_to_resend_later(srv):
    size = _batch("greedy", 1).ByteSize()
    srv.servicer.host_rate = HostRate(size, size, max_debt=1.5 * size)      # one batch a second; at most 1.5 owed
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    codes = []

    def push(seq):
        try:
            codes.append(stub.Push(_batch("greedy", seq), timeout=10).status)
        except grpc.RpcError as exc:
            codes.append(exc.code())
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert "host 'greedy' is over its ingest rate" in exc.details() and "resend later" in exc.details()
    threads = [threading.Thread(target=push, args=(seq,)) for seq in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    stored = codes.count(pb.BatchAck.COMMITTED)
    assert 2 <= stored <= 4 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 8 - stored
    assert _rows(srv, "greedy") == stored * 300
    assert stub.GetStatus(apb.StatusRequest(), timeout=10).batches_over_rate == 8 - stored


def _owes(rate: HostRate, host: str) -> float:
    level, at = rate._level[host]
    return -min(rate.burst, level + (time.monotonic() - at) * rate.rate)


def test_what_was_not_stored_is_given_back(srv):
    """Found in a trial: batches whose callers gave up while held, and
    resends answered DUPLICATE, were charged as stored, and a reconnecting
    agent owed for batches it had never had written."""
    size = _batch("g", 1).ByteSize()
    rate = srv.servicer.host_rate = HostRate(size / 10, size)         # a batch per 10 s, after one
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    assert stub.Push(_batch("g", 1), timeout=10).status == pb.BatchAck.COMMITTED      # the burst
    assert stub.Push(_batch("g", 1), timeout=10).status == pb.BatchAck.DUPLICATE      # already stored: given back
    assert _owes(rate, "g") < 0.1 * size
    assert stub.Push(_batch("g", 2), timeout=10).status == pb.BatchAck.COMMITTED      # no wait yet: it owes nothing
    assert 0.8 * size < _owes(rate, "g") < 1.1 * size
    with pytest.raises(grpc.RpcError) as gave_up:
        stub.Push(_batch("g", 3), timeout=0.5)                   # held for ~10 s: the caller gives up
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.3)
    assert _owes(rate, "g") < 1.1 * size                          # still only batch 2's debt
    assert _rows(srv, "g") == 2 * 300


def test_a_batch_refused_after_it_was_charged_is_given_back(srv):
    """A batch the validation refuses (here: samples before 2001) took its
    host's share and the byte budget before it was decoded; both come back."""
    size = _batch("v", 1).ByteSize()
    rate = srv.servicer.host_rate = HostRate(size / 10, size)         # a batch per 10 s, after one
    bad = _batch("v", 1)
    bad.t_f64le = np.arange(1.0, 1.0 + bad.count).astype("<f8").tobytes()    # as large, refused by its times
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Push(bad, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rate._level["v"][0] > 0.9 * size          # the burst is whole again
    assert srv.analyzer.writer.budget.used == 0
    assert stub.Push(_batch("v", 2), timeout=3).status == pb.BatchAck.COMMITTED


def test_a_refund_never_fills_past_the_burst():
    clock = Clock()
    rate = HostRate(1000, 3000, clock=clock)
    rate.charge("a", 1000)
    rate.refund("a", 5000)
    assert rate._level["a"][0] == 3000
    rate.refund("unknown", 10)                # forgotten hosts start full anyway
    assert "unknown" not in rate._level


def test_an_ingest_stream_too_far_over_is_ended_after_the_acks_before(srv):
    size = _batch("deep", 1).ByteSize()
    srv.servicer.host_rate = HostRate(size / 100, size, max_debt=0.5 * size)     # owes one batch: too much
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    acks = []
    with pytest.raises(grpc.RpcError) as err:
        for ack in stub.Ingest(iter([_batch("deep", seq) for seq in (1, 2, 3, 4)]), timeout=30):
            acks.append(ack)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "over its ingest rate" in err.value.details()
    assert [(a.seq, a.status) for a in acks] == [(1, pb.BatchAck.COMMITTED), (2, pb.BatchAck.COMMITTED)]
    assert _rows(srv, "deep") == 2 * 300


@pytest.mark.parametrize("engine", [False, True])
def test_a_host_held_back_by_its_rate_is_not_taken_for_silent(tmp_path, engine):
    """Found in a trial: a host held longer than the staleness horizon
    (3 windows, 3 s here) showed as stale and its finding closed with
    "agent went silent", while its batches waited on our own policy."""
    srv = AnalyzerServer(tmp_path / "a.duckdb", engine=engine)
    try:
        _held_is_heard(srv)
    finally:
        srv.stop()


def _held_is_heard(srv):
    size = _batch("held", 1).ByteSize()
    srv.servicer.host_rate = HostRate(size / 6, size, max_debt=2 * size)   # the third batch waits ~6 s
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    acked = threading.Event()
    acks: list = []

    def send():
        for a in stub.Ingest(iter([_batch("held", seq) for seq in (1, 2, 3)]), timeout=30):
            acks.append(a.status)
            if len(acks) == 2:
                acked.set()
    th = threading.Thread(target=send)
    th.start()
    assert acked.wait(10)
    time.sleep(4.5)                     # past the horizon since the second batch, the third still held
    status = stub.GetStatus(apb.StatusRequest(host="held"), timeout=10)
    assert len(acks) == 2
    assert status.hosts_stale == 0 and [g.stale for g in status.gpus] == [False]
    th.join(20)
    assert acks == [pb.BatchAck.COMMITTED] * 3
    assert stub.GetStatus(apb.StatusRequest(host="held"), timeout=10).samples_committed == 3 * 300
