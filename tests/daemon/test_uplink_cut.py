"""A batch is cut before the analyzer would refuse it: at most 131,072
processes (its limit), and about 8 MiB (it takes no message over 32 MiB).
A host with many processes on each GPU, catching up after an outage, had
its 4,096-sample batches refused for good."""
import time

from gpuscope.analyzers.batch_size import check_size, screen
from gpuscope.analyzers.ingest import decode
from gpuscope.collectors.records import DeviceInfo, GpuSample, ProcessRecord
from gpuscope.daemon.serve import MAX_RECEIVE_BYTES
from gpuscope.daemon.uplink import MAX_BATCH_BYTES, MAX_BATCH_PROCESSES, Uplink, UplinkConfig


def _uplink() -> Uplink:
    return Uplink(UplinkConfig(target="127.0.0.1:1", buffer_samples=100_000), "h", "0123456789abcdef",
                  lambda: [DeviceInfo(gpu=g, name="NVIDIA H200") for g in range(8)])


def _batches(up: Uplink):
    up.flush()
    return [(b, n) for b, n, _ in up._unacked.values()]


def _samples(n: int, processes: int, command: str):
    now = time.time() - 600
    procs = tuple(ProcessRecord(1000 + k, 1 << 30, 0.5, command) for k in range(processes))
    values = {"power_watts": 300.0, "sm_active_ratio": 0.5, "gpu_util_ratio": 0.9}
    return [GpuSample(i % 8, now + i * 0.01, values, procs) for i in range(n)]


def test_many_processes_a_sample_are_cut_at_the_analyzers_limit_and_taken():
    up = _uplink()
    up.submit(_samples(4096, 40, "python serve.py"))            # 163,840 processes in 4,096 samples
    batches = _batches(up)
    assert sum(n for _, n in batches) == 4096 and len(batches) == 2
    for b, _ in batches:
        assert len(b.processes) <= MAX_BATCH_PROCESSES
        check_size(b, b.ByteSize())
        decode(b)                                                 # the analyzer takes each


def test_long_command_lines_are_cut_by_size_under_the_servers_limit():
    up = _uplink()
    up.submit(_samples(4096, 16, "é" * 256))                    # the longest procstat keeps, 2 bytes a character
    batches = _batches(up)
    assert sum(n for _, n in batches) == 4096 and len(batches) > 1
    for b, _ in batches:
        size = b.ByteSize()
        assert size <= MAX_BATCH_BYTES < MAX_RECEIVE_BYTES
        check_size(b, size)
        screen(b, size)


def test_an_ordinary_host_still_sends_full_batches():
    up = _uplink()
    up.submit(_samples(4096, 2, "python train.py --lr 3e-4"))
    assert [n for _, n in _batches(up)] == [4096]


def test_many_distinct_command_lines_are_cut_at_the_analyzers_limit():
    """Found in a trial: short-lived workers, each with its own command line,
    made a 3,200-sample catch-up batch of 1.6 M distinct characters, which
    the analyzer refuses (at most 1 M a batch) and the agent then drops."""
    now = time.time() - 600
    samples = [GpuSample(i % 8, now + i * 0.01, {"power_watts": 300.0},
                         (ProcessRecord(10_000 + 2 * i, 1 << 30, 0.5, f"worker {i:05d} " + "w" * 240),
                          ProcessRecord(10_001 + 2 * i, 1 << 30, 0.5, f"worker {i:05d}b " + "w" * 240)))
               for i in range(3200)]
    up = _uplink()
    up.submit(samples)
    batches = _batches(up)
    assert sum(n for _, n in batches) == 3200 and len(batches) == 2
    for b, _ in batches:
        decode(b)


def test_command_lines_are_counted_as_sent_after_redaction():
    """Found in a trial: `--token=a0` becomes `--token=<redacted>`, so 256
    characters as read became 407 as sent, and a batch cut by the lengths
    as read was refused."""
    now = time.time() - 600
    secrets = " ".join(f"--token=a{k}" for k in range(24))
    samples = [GpuSample(i % 8, now + i * 0.01, {"power_watts": 300.0},
                         tuple(ProcessRecord(10_000 + 2 * i + j, 1 << 30, 0.5,
                                             f"python w.py --task {i}{j} {secrets}"[:256]) for j in range(2)))
               for i in range(3200)]
    up = _uplink()
    up.submit(samples)
    batches = _batches(up)
    assert sum(n for _, n in batches) == 3200
    for b, _ in batches:
        assert "<redacted>" in b.processes[0].command
        decode(b)
