"""What a server holds of the messages it receives. An aborted call lets go
of its request at once, without waiting for the cyclic collector (found in
a trial: each refused 6 MB batch kept 12 MB, and the analyzer's collector
thresholds left 2.3 GB after 200 refusals)."""
import gc
import time
import tracemalloc

import grpc
import pytest

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch
from gpuscope.v1 import analyzer_pb2_grpc

from tests.helpers import AnalyzerServer


def _refused_batch():
    b = encode_batch("h", "boot", 1, [GpuSample(0, time.time() - 1, {"power_watts": 1.0})], [DeviceInfo(gpu=0)])
    b.boot_id = "b" * 100                     # over its limit: refused after the whole batch was parsed
    for _ in range(500):
        b.health.add(gpu=0, t=time.time(), code=1, detail="d" * 4000)
    return b


def test_a_refused_batch_is_freed_without_the_cyclic_collector(tmp_path):
    srv = AnalyzerServer(tmp_path / "r.duckdb")
    stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(srv.target))
    batch = _refused_batch()
    size = batch.ByteSize()
    codes = set()
    try:
        for _ in range(3):                    # warm up: channels, handlers, logs
            try:
                stub.Push(batch, timeout=10)
            except grpc.RpcError as exc:
                codes.add(exc.code())
        gc.collect()
        gc.disable()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            try:
                stub.Push(batch, timeout=10)
            except grpc.RpcError as exc:
                codes.add(exc.code())
        time.sleep(0.5)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
        srv.stop()
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    assert held < 3 * size, f"{held / 1e6:.1f} MB still held after 20 refusals of {size / 1e6:.1f} MB"



def test_the_extra_port_takes_small_messages_only(tmp_path):
    """The on-call token port accepts anyone who completes TLS: there a
    message is at most EXTRA_PORT_RECEIVE_BYTES, refused by gRPC before any
    of our code runs; the main port keeps its 32 MiB for agents."""
    from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
    from gpuscope.analyzers.service import AnalyzerServicer, add_to_server
    from gpuscope.daemon.serve import EXTRA_PORT_RECEIVE_BYTES, build_server, shutdown
    from gpuscope.v1 import analyzer_pb2 as apb
    from google.protobuf.internal.encoder import _VarintBytes
    a = Analyzer(AnalyzerConfig(str(tmp_path / "x.duckdb"), memory_limit="256MB"))
    servicer = AnalyzerServicer(a)
    server, port, _ = build_server("127.0.0.1:0", [(add_to_server, servicer, "gpuscope.v1.Analyzer")],
                                   extra_ports=[("127.0.0.1:0", None, "--oncall-listen")])
    a.start()
    server.start()
    n = 2 * EXTRA_PORT_RECEIVE_BYTES
    padded = apb.StatusRequest().SerializeToString() + _VarintBytes((1000 << 3) | 2) + _VarintBytes(n) + b"x" * n
    try:
        for p, ok in ((port, True), (server.extra_ports[0], False)):
            with grpc.insecure_channel(f"127.0.0.1:{p}", options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
                stub = analyzer_pb2_grpc.AnalyzerStub(ch)
                assert stub.GetStatus(apb.StatusRequest(), timeout=10).version      # small: both ports
                for method in ("/gpuscope.v1.Analyzer/GetStatus", "/grpc.health.v1.Health/Check"):
                    call = ch.unary_unary(method)
                    if ok:
                        call(padded, timeout=10)
                    else:
                        with pytest.raises(grpc.RpcError) as err:
                            call(padded, timeout=10)
                        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, method
    finally:
        shutdown(server, grace_s=0.2)
        servicer.close()
        a.close()
