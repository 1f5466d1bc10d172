"""Concurrent flushes (the flush loop plus stop() or a caller) must still give
every batch a `min_unacked_seq` at or below its own seq: the analyzer rejects
anything else, and a rejected batch is never resent."""
import threading
import time

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import uplink as uplink_mod
from gpuscope.daemon.uplink import Uplink, UplinkConfig


def test_concurrent_flushes_keep_seqs_in_order(monkeypatch):
    real = uplink_mod.encode_batch

    def slow_on_odd(host, boot, seq, *rest):
        if seq % 2:
            time.sleep(0.01)           # the window in which another flush overtook this one
        return real(host, boot, seq, *rest)

    monkeypatch.setattr(uplink_mod, "encode_batch", slow_on_odd)
    up = Uplink(UplinkConfig(target="127.0.0.1:1", max_batch_samples=1, buffer_samples=10_000),
                "h", "b", lambda: [DeviceInfo(gpu=0)])
    up.submit([GpuSample(0, 1000.0 + i, {"power_watts": 1.0}) for i in range(60)])
    flushers = [threading.Thread(target=up.flush) for _ in range(4)]
    for th in flushers:
        th.start()
    for th in flushers:
        th.join()
    batches = [b for b, *_ in up._unacked.values()]
    assert [b.seq for b in batches] == list(range(1, 61))
    assert all(b.min_unacked_seq == 1 for b in batches)
