"""Measured ceilings in the store: checked at the edge, kept with history,
the newest per GPU UUID current."""
import math

import pytest

from gpuscope.analyzers.calibrations import CalibrationInvalid, parse_calibration
from gpuscope.analyzers.store import Store, StoreConfig
from tests.helpers import calibration_record


def _add(store, host="h1", **kw):
    cal, rows = parse_calibration(host, calibration_record(**kw), received=1_700_000_100.0)
    return store.add_calibration(cal, rows)


@pytest.fixture
def store(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "c.duckdb")))
    yield s
    s.close()


def test_history_is_kept_and_the_newest_per_uuid_is_current(store):
    _add(store, started_at=1.7e9, hbm=4.0e12)
    _add(store, started_at=1.7e9 + 3600, hbm=4.2e12)
    _add(store, host="h2", uuid="GPU-bbbb", name="NVIDIA A100-SXM4-80GB", hbm=1.9e12, bf16=2.8e14)
    current = store.ceilings()
    assert [(c["host"], c["uuid"]) for c in current] == [("h1", "GPU-aaaa"), ("h2", "GPU-bbbb")]
    assert current[0]["ceilings"]["hbm_triad"]["value"] == 4.2e12
    assert current[0]["ceilings"]["hbm_triad"]["conditions"]["sm_clock_hertz"]["median"] == 1.98e9
    assert current[0]["ceilings"]["d2d"]["error"].startswith("one device")
    assert (current[0]["driver"], current[0]["cuda"], current[0]["jax"]) == ("570.124.06", "cuda 12080", "0.6.2")
    assert len(store.ceilings(uuid="GPU-aaaa", history=True)) == 2
    assert [c["host"] for c in store.ceilings(model="a100")] == ["h2"]
    assert [c["uuid"] for c in store.ceilings(host="h1")] == ["GPU-aaaa"]
    assert store.measured_peaks("GPU-aaaa") == (4.2e12, 7.0e14, 1.7e9 + 3600)
    assert store.measured_peaks("GPU-none") is None


def test_sending_the_same_run_again_replaces_it(store):
    assert _add(store) == _add(store)
    assert len(store.ceilings(history=True)) == 1
    assert store.count("ceilings") == 7


def test_a_cpu_result_never_takes_a_gpu_s_uuid(store):
    gpu_run = _add(store)
    r = calibration_record(platform="cpu")
    r["gpu"] = dict(index=0, uuid="GPU-aaaa", name="NVIDIA H200")      # the same start and the GPU's UUID
    cpu_run = store.add_calibration(*parse_calibration("h1", r, received=1_700_000_100.0))
    assert gpu_run != cpu_run and {c["uuid"] for c in store.ceilings()} == {"GPU-aaaa", "cpu:h1:0"}


def test_a_cpu_result_is_stored_and_marked(store):
    _add(store, platform="cpu", name="cpu")
    (c,) = store.ceilings()
    assert c["platform"] == "cpu" and c["uuid"] == "cpu:h1:0"


@pytest.mark.parametrize("change, field", [
    (lambda r: r["measurements"][0].update(value=math.nan), "measurements[0].value"),
    (lambda r: r["measurements"][0].update(value=-1.0), "measurements[0].value"),
    (lambda r: r["measurements"][1].update(unit="furlongs"), "measurements[1].unit"),
    (lambda r: r["measurements"][2].update(name="x" * 500), "measurements[2].name"),
    (lambda r: r["gpu"].update(uuid=""), "gpu.uuid"),
    (lambda r: r["gpu"].update(uuid="U" * 1000), "gpu.uuid"),
    (lambda r: r.update(started_at=math.inf), "started_at"),
    (lambda r: r.update(measurements=[]), "measurements"),
    (lambda r: r["device"].update(platform=None), "device.platform"),
    (lambda r: r["device"].update(platform="tpu"), "device.platform"),
    (lambda r: r["measurements"].append(dict(r["measurements"][2])), "measurements[7].name"),       # twice
    (lambda r: r["measurements"][1].update(unit="seconds"), "measurements[1].unit"),      # HBM in seconds
    (lambda r: r["measurements"][2].update(unit="bytes_per_second"), "measurements[2].unit"),
    (lambda r: r["measurements"][1].update(value=1e30), "measurements[1].value"),         # past any device
    (lambda r: r["measurements"][3].update(value=1e-12), "measurements[3].value"),        # a 1 ps launch
    (lambda r: r.update(started_at=4e9), "started_at"),                                   # the year 2096
])
def test_bad_input_is_refused_naming_the_field(change, field):
    r = calibration_record()
    change(r)
    with pytest.raises(CalibrationInvalid) as exc:
        parse_calibration("h1", r, received=1_700_000_100.0)
    assert str(exc.value).startswith(f"{field}:")
