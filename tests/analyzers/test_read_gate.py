"""The read gate (flow.ReadGate): streams of large batches wait before
reading and before parsing while others' large messages wait for the
writer; streams of small batches never wait (found in a trial: 24 streams
of 7 MB batches took the gRPC process to 1.6 GB)."""
import asyncio

from gpuscope.analyzers.flow import ReadGate


def settle():
    return asyncio.sleep(0.05)


def test_small_batches_never_wait_and_hold_nothing():
    gate = ReadGate(limit_bytes=1000, free_bytes=100)

    async def run():
        await gate.budget.acquire(5000)        # the gate full of others' large messages
        slot = gate.stream()
        for _ in range(3):
            await asyncio.wait_for(slot.reserve(), 1)
            await asyncio.wait_for(slot.read(100), 1)
            assert slot.held == 0
            slot.release()
        gate.budget.release(5000)
    asyncio.run(run())
    assert gate.budget.used == 0


def test_a_large_message_waits_before_it_is_parsed_and_the_next_before_it_is_read():
    gate = ReadGate(limit_bytes=1000, free_bytes=100)

    async def run():
        a, b = gate.stream(), gate.stream()
        await a.reserve()
        await a.read(800)                     # a's first large message: room, so it goes on
        assert a.held == 800
        await b.reserve()
        b_read = asyncio.ensure_future(b.read(700))
        await settle()
        assert not b_read.done() and b.held == 0      # read, not parsed: waits for a's to be queued
        a.release()
        await asyncio.wait_for(b_read, 1)
        assert b.held == 700
        a_next = asyncio.ensure_future(a.reserve())   # a's next read waits for room for one like its last
        await settle()
        assert not a_next.done()
        b.release()
        await asyncio.wait_for(a_next, 1)
        assert a.held == 800
        await a.read(50)                              # smaller than reserved: holds the reservation
        assert a.held == 800
        a.release()
        await a.reserve()                             # its last was small: reads without waiting
        assert a.held == 0
    asyncio.run(run())
    assert gate.budget.used == 0


def test_streams_holding_part_never_wait_for_each_other():
    gate = ReadGate(limit_bytes=1000, free_bytes=100)

    async def run():
        slots = [gate.stream() for _ in range(4)]
        for s in slots:
            s.last = 250
            await s.reserve()                         # 4 x 250: the gate is full
        reads = [asyncio.ensure_future(s.read(300)) for s in slots]   # each message larger than reserved
        done, _ = await asyncio.wait(reads, timeout=1)
        assert len(done) == 3                         # they gave back their part: three fit, one waits
        for s in slots:
            if s.held:
                s.release()
        await asyncio.wait_for(asyncio.gather(*reads), 1)
        for s in slots:
            s.release()
    asyncio.run(run())
    assert gate.budget.used == 0


def test_a_stream_cancelled_while_it_waits_leaves_nothing_held():
    gate = ReadGate(limit_bytes=1000, free_bytes=100)

    async def run():
        other = gate.stream()
        await other.read(900)
        slot = gate.stream()
        slot.last = 500
        waiting = asyncio.ensure_future(slot.read(600))
        await settle()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        slot.release()
        other.release()
    asyncio.run(run())
    assert gate.budget.used == 0


def _large_batch(host: str, seq: int, n: int):
    import time

    import numpy as np
    from gpuscope.v1 import samples_pb2 as pb
    t0 = time.time() - 30
    b = pb.SampleBatch(host=host, boot_id=f"boot-{host}", seq=seq, count=n,
                       t_f64le=(t0 + np.arange(n) * (20.0 / n)).astype("<f8").tobytes(), gpu_u32le=bytes(4 * n))
    for metric in ("util_gpu_ratio", "util_mem_ratio", "power_watts"):
        b.columns.add(metric=metric, f64le=np.full(n, 0.5).astype("<f8").tobytes())
    b.devices.add(gpu=0, uuid=f"GPU-{host}", name="NVIDIA H200", architecture="hopper")
    return b


def test_a_server_parses_no_more_large_messages_than_its_gate_holds(tmp_path):
    """Six streams of 1 MB batches against a writer that takes one at a
    time: at most two are parsed and waiting at once (the gate holds 2.5 MB),
    every batch is acknowledged, and the gate is empty afterwards."""
    import threading

    import grpc
    from gpuscope.analyzers import flow
    from gpuscope.v1 import analyzer_pb2_grpc
    from tests.helpers import AnalyzerServer

    srv = AnalyzerServer(tmp_path / "g.duckdb")
    servicer = srv.servicer
    servicer._reading = ReadGate(limit_bytes=2_500_000, free_bytes=256 << 10)
    srv.analyzer.writer.budget = flow.ByteBudget(1)          # one batch queued at a time
    inside, most = 0, 0
    admit = servicer._admit

    async def counted(data, context, method):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            return await admit(data, context, method)
        finally:
            inside -= 1
    servicer._admit = counted
    acked: dict[str, int] = {}

    def stream(i: int) -> None:
        host = f"big-{i}"
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            acks = stub.Ingest(iter([_large_batch(host, s, 30_000) for s in range(1, 5)]), timeout=120)
            acked[host] = sum(1 for a in acks if a.status == a.COMMITTED)
    try:
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        assert acked == {f"big-{i}": 4 for i in range(6)}
        assert 1 <= most <= 2
        assert servicer._reading.budget.used == 0 and servicer._reading.budget.waits > 0
    finally:
        srv.stop()
