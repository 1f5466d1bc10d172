"""The gRPC process's event loop keeps answering on-call calls while agents'
batches are validated and decoded: under overload, a commit group's acks
admit hundreds of waiting streams at once, and decoding them in the loop's
own turn held GetStatus back for up to 1.9 s (docs/benchmarks.md)."""
import time

import grpc

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer

DECODE_S = 0.5


def test_status_is_answered_while_batches_are_being_decoded(tmp_path, monkeypatch):
    import gpuscope.analyzers.ingest as ingest
    real = ingest.decode

    def slow_decode(batch):
        time.sleep(DECODE_S)
        return real(batch)
    monkeypatch.setattr(ingest, "decode", slow_decode)
    srv = AnalyzerServer(tmp_path / "r.duckdb", fleet_check_s=0)
    try:
        t0 = time.time() - 10
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            stub.GetStatus(apb.StatusRequest(), timeout=10)          # connected, the pools warm
            pushes = [stub.Push.future(encode_batch(
                f"host-{i}", "boot", 1, [GpuSample(0, t0 + k, {"power_watts": 100.0}) for k in range(5)],
                [DeviceInfo(gpu=0, name="NVIDIA H200")]), timeout=30) for i in range(4)]
            time.sleep(0.2)                                         # the first is being decoded
            c = time.monotonic()
            stub.GetStatus(apb.StatusRequest(), timeout=10)
            took = time.monotonic() - c
            acks = [p.result() for p in pushes]
        # decoded in the loop's turn, the call waits for all four: ~1.8 s
        assert took < DECODE_S, f"GetStatus took {took:.2f} s while batches were decoded"
        assert [a.status for a in acks] == [pb.BatchAck.COMMITTED] * 4
    finally:
        srv.stop()
