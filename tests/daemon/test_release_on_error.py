"""An aborted call lets go of its request at once, without waiting for the
cyclic collector (found in a trial: each refused 6 MB batch kept 12 MB, and
the analyzer's collector thresholds left 2.3 GB after 200 refusals)."""
import gc
import time
import tracemalloc

import grpc

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

