"""`gpuscope calibrate` as a person runs it: JSON and table output, a GPU in
use refused unless forced, bad arguments named."""
import json
import os
import subprocess
import sys

import pytest

from gpuscope.daemon.cli import build_parser
from gpuscope.daemon.cliutil import UsageError
from gpuscope.daemon.cmd_calibrate import cmd_calibrate
from tests.fakes.nvml import FakeNvml, h200

ARGS = ["calibrate", "--quick", "--platform", "cpu", "--dtypes", "bf16,fp32"]


def test_json_carries_ceilings_and_the_gpus_conditions(capsys, tmp_path):
    fake = FakeNvml([h200(sm_clock_mhz=1755, power_mw=650_000)])
    out_file = tmp_path / "cal.json"
    ns = build_parser().parse_args(ARGS + ["--json", "--output", str(out_file)])
    assert cmd_calibrate(ns, nvml_module=fake) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(out_file.read_text())
    assert out["gpu"]["name"] == "NVIDIA H200" and out["gpu"]["uuid"]
    assert out["ceilings"]["bf16_flop_per_second"] > 0 and out["ceilings"]["hbm_bytes_per_second"] > 0
    conds = [m["conditions"] for m in out["measurements"] if m["value"] is not None]
    assert conds and all(c["sm_clock_hertz"]["median"] == 1.755e9 for c in conds)
    assert all(c["power_watts"]["max"] == 650.0 for c in conds)
    assert out["forced"] is False


def test_a_gpu_held_by_another_process_is_refused_unless_forced(capsys):
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)])])
    with pytest.raises(UsageError, match=r"GPU 0 is in use by pid 4242.*--force"):
        cmd_calibrate(build_parser().parse_args(ARGS), nvml_module=fake)
    assert cmd_calibrate(build_parser().parse_args(ARGS + ["--force"]), nvml_module=fake) == 0
    text = capsys.readouterr().out
    assert "forced while in use" in text and "matmul_bf16" in text and "FLOP/s" in text


def test_bad_arguments_are_named():
    fake = FakeNvml([h200()])
    with pytest.raises(UsageError, match=r"--dtypes: unknown int4; choose from bf16"):
        cmd_calibrate(build_parser().parse_args(ARGS[:-2] + ["--dtypes", "int4"]), nvml_module=fake)
    with pytest.raises(UsageError, match=r"--gpu 3: NVML sees 1 GPU"):
        cmd_calibrate(build_parser().parse_args(ARGS + ["--gpu", "3"]), nvml_module=fake)


def test_without_nvml_or_gpu_the_command_says_what_to_do():
    """The real command on this GPU-less machine: the CPU backend calibrates
    with a note; asking for the GPU fails with a one-line hint."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", *a], capture_output=True,
                                    text=True, timeout=300, env={**os.environ, "XLA_FLAGS": ""})
    ok = run(*ARGS)
    assert ok.returncode == 0, ok.stderr
    assert "hbm_triad" in ok.stdout and "no NVML here" in ok.stdout
    bad = run("calibrate", "--platform", "gpu")
    assert bad.returncode == 1 and "without a GPU use --platform cpu" in bad.stderr
    assert "Traceback" not in bad.stderr
