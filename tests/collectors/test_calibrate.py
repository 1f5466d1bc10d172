"""Calibration runs for real on JAX's CPU backend: the same code path as on
a GPU, CPU figures."""
import itertools
import json
import os
import subprocess
import sys

import pytest

from gpuscope.collectors.calibrate import MATMUL_DTYPES, CalibrateConfig, CalibrationError, Calibrator

SMALL = dict(quick=True, platform="cpu", stream_bytes=8 << 20, matmul_n=256, transfer_bytes=4 << 20,
             min_repeat_s=0.005)


def test_every_dimension_measured_with_its_repeats_and_conditions():
    ticks = itertools.count()
    seen = []
    result = Calibrator(CalibrateConfig(**SMALL), probe=lambda: {"sm_clock_hertz": 1.98e9 + next(ticks)},
                        progress=seen.append).run()
    by = {m.name: m for m in result.measurements}
    for name in ("hbm_copy", "hbm_triad", "launch_roundtrip", "dispatch_rate", "h2d", "d2h"):
        m = by[name]
        assert m.value and m.value > 0 and m.error is None, m
        assert m.repeats >= 5 and m.spread is not None and m.spread >= 0
        assert m.conditions["sm_clock_hertz"]["min"] >= 1.98e9, "the probe's readings during the run are kept"
    # a copy moves two bytes per byte of array, a triad three, whatever the speed
    assert by["hbm_copy"].params["bytes_per_call"] == 2 * by["hbm_copy"].params["array_bytes"]
    assert by["hbm_triad"].params["bytes_per_call"] == 3 * by["hbm_triad"].params["array_bytes"]
    assert by["launch_roundtrip"].unit == "seconds" and by["launch_roundtrip"].best <= by["launch_roundtrip"].value
    assert by["hbm_copy"].best >= by["hbm_copy"].value, "best is the fastest repeat"
    # each dtype either measured or says why not; never a silent zero
    for d in MATMUL_DTYPES:
        m = by[f"matmul_{d}"]
        assert (m.value is not None and m.value > 0) != (m.error is not None), m
    assert by["d2d"].value is None and "one device" in by["d2d"].error
    assert seen == ["device memory bandwidth", "matrix products", "launch path", "host transfers",
                    "device to device"]
    c = result.ceilings()
    assert c["hbm_bytes_per_second"] == max(by["hbm_copy"].value, by["hbm_triad"].value)
    assert c["launch_roundtrip_seconds"] == by["launch_roundtrip"].value
    assert "d2d_bytes_per_second" not in c
    d = result.to_dict()
    json.dumps(d)
    assert d["device"]["platform"] == "cpu" and d["device"]["jax"]


def test_a_failing_probe_does_not_stop_calibration():
    def probe():
        raise OSError("NVML went away")
    result = Calibrator(CalibrateConfig(**SMALL, dtypes=("fp32",)), probe=probe).run()
    assert all(m.conditions == {} for m in result.measurements)
    assert result.device["probe_error"] == "OSError: NVML went away"
    assert result.ceilings()["fp32_flop_per_second"] > 0


def test_a_device_that_does_not_exist_is_named():
    with pytest.raises(CalibrationError, match=r"device 3 does not exist: JAX sees 1 cpu device"):
        Calibrator(CalibrateConfig(**{**SMALL, "dtypes": ("fp32",)}, device=3)).run()


def test_peer_copies_between_two_devices():
    """Two CPU devices (XLA's host-platform device count) stand in for two
    GPUs: the device-to-device path runs and is measured."""
    code = ("import json; from gpuscope.collectors.calibrate import *; "
            "r = Calibrator(CalibrateConfig(quick=True, platform='cpu', stream_bytes=4<<20, matmul_n=128, "
            "transfer_bytes=4<<20, min_repeat_s=0.005, dtypes=('fp32',))).run(); "
            "print(json.dumps(r.to_dict()))")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    d2d = [m for m in out["measurements"] if m["name"] == "d2d"][0]
    assert d2d["value"] > 0 and d2d["params"]["from"] == 0 and d2d["params"]["to"] == 1
    assert out["ceilings"]["d2d_bytes_per_second"] == d2d["value"]
