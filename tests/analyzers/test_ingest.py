import math
import time

import numpy as np
import pytest

from gpuscope.analyzers.ingest import BatchError, decode
from gpuscope.analyzers.writer import samples_table
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch


def batch(n=4, gpus=(0, 1), values=None, t0=None):
    t0 = time.time() - 10 if t0 is None else t0
    samples = [GpuSample(gpus[i % len(gpus)], t0 + i, dict(values or {"util_gpu_ratio": 0.5, "power_watts": 300.0}))
               for i in range(n)]
    return encode_batch("h1", "boot", 1, samples, [DeviceInfo(gpu=g) for g in gpus])


def test_round_trip_keeps_missing_as_missing():
    samples = [GpuSample(0, time.time() - 2, {"util_gpu_ratio": 0.5}), GpuSample(0, time.time() - 1, {"power_watts": 100.0})]
    d = decode(encode_batch("h", "b", 1, samples, [DeviceInfo(gpu=0)]))
    table = samples_table([d])
    assert table.column("util_gpu_ratio").to_pylist() == [0.5, None]
    assert table.column("power_watts").to_pylist() == [None, 100.0]
    assert "temp_celsius" not in table.column_names          # absent metrics are not sent as nulls
    assert math.isnan(d.values[1, d.names.index("util_gpu_ratio")])


def test_a_group_of_batches_with_different_metrics_stores_nulls_for_the_missing():
    a = decode(encode_batch("h", "b", 1, [GpuSample(0, time.time() - 2, {"power_watts": 100.0})], [DeviceInfo(gpu=0)]))
    b = decode(encode_batch("g", "b", 1, [GpuSample(1, time.time() - 1, {"util_gpu_ratio": 0.5, "power_watts": 90.0})],
                            [DeviceInfo(gpu=1)]))
    table = samples_table([a, b])
    assert table.column("host").to_pylist() == ["h", "g"] and table.column("gpu").to_pylist() == [0, 1]
    assert table.column("util_gpu_ratio").to_pylist() == [None, 0.5]
    assert table.column("power_watts").to_pylist() == [100.0, 90.0]


def _set(b, metric, i, value):
    col = next(c for c in b.columns if c.metric == metric)
    arr = np.frombuffer(col.f64le, "<f8").copy()
    arr[i] = value
    col.f64le = arr.tobytes()
    return b


@pytest.mark.parametrize("mutate,match", [
    (lambda b: _set(b, "power_watts", 2, float("nan")), r"columns\[\d\]\.f64le \(power_watts\)\[2\]: nan is not a number"),
    (lambda b: _set(b, "power_watts", 1, -5.0), r"power_watts\)\[1\]: negative"),
    (lambda b: _set(b, "util_gpu_ratio", 0, 95.0), r"util_gpu_ratio\)\[0\]: 95.0 is not a ratio"),
    (lambda b: setattr(b, "t_f64le", np.full(4, time.time() + 3600, "<f8").tobytes()), r"t_f64le\[0\]: .* in the future"),
    (lambda b: setattr(b, "t_f64le", b"\0" * 7), r"t_f64le: 7 bytes, expected 32"),
    (lambda b: b.devices.pop(), r"gpu_u32le: GPU 1 has samples but no entry in devices"),
    (lambda b: setattr(b.columns[0], "metric", "util_gpu_percent"), r"columns\[0\]\.metric: unknown metric 'util_gpu_percent'"),
    (lambda b: setattr(b, "host", ""), r"host: empty"),
    (lambda b: setattr(b, "count", 10**7), r"count: 10000000 samples, at most"),
    (lambda b: setattr(b.columns[0], "valid", b"\x01\x02"), r"columns\[0\]\.valid .*2 bytes, expected 1"),
    (lambda b: b.processes.add(sample=99, pid=1), r"processes\[0\]\.sample: 99 >= count 4"),
])
def test_bad_batches_name_the_field(mutate, match):
    b = batch()
    mutate(b)
    with pytest.raises(BatchError, match=match):
        decode(b)


def test_the_link_s_best_reaches_the_devices_table(tmp_path):
    from gpuscope.analyzers.store import Store, StoreConfig
    dev = DeviceInfo(gpu=0, uuid="GPU-1", pcie_generation=5, pcie_width=8, pcie_max_generation=5, pcie_max_width=16,
                     driver_version="570.124.06")
    d = decode(encode_batch("h1", "boot", 1, [GpuSample(0, time.time() - 1, {"power_watts": 1.0})], [dev]))
    assert (d.devices[0].pcie_width, d.devices[0].pcie_max_width) == (8, 16)
    s = Store(StoreConfig(str(tmp_path / "d.duckdb")))
    s.upsert_devices([("h1", *d.devices[0], time.time())])
    row = s.devices()[0]
    assert (row["pcie_width"], row["pcie_max_generation"], row["pcie_max_width"]) == (8, 5, 16)
    assert row["driver_version"] == "570.124.06"
    s.close()


def test_command_lines_are_cleaned_once_and_the_memory_of_them_is_bounded(monkeypatch):
    from gpuscope.analyzers import ingest
    monkeypatch.setattr(ingest, "_CLEANED", {})
    monkeypatch.setattr(ingest, "MAX_CLEANED", 100)
    line = "python serve.py --hf-token=hf_abcdefghijklmnop --port 8000"
    first = ingest._cleaned(line)
    assert first == ingest.clean_command(line) and "hf_abcdefghijklmnop" not in first
    assert ingest._cleaned(line) is first                     # remembered
    assert all("hf_abcdefghijklmnop" not in v for v in ingest._CLEANED.values())
    assert not any(isinstance(k, str) for k in ingest._CLEANED)      # by digest: no raw secret kept
    for i in range(1000):
        ingest._cleaned(f"python job{i}.py")
    assert len(ingest._CLEANED) <= 100
    long = "x" * (ingest._CLEANED_KEY_CHARS + 1)
    before = len(ingest._CLEANED)
    assert ingest._cleaned(long) == ingest.clean_command(long) and len(ingest._CLEANED) == before
