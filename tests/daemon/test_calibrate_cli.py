"""`gpuscope calibrate` as a person runs it: JSON and table output, a GPU in
use refused unless forced, bad arguments named."""
import json
import os
import subprocess
import sys

import pytest

from gpuscope.daemon.cli import build_parser
from gpuscope.daemon.cliutil import UsageError
from gpuscope.daemon import cmd_calibrate as cmd
from gpuscope.daemon.cmd_calibrate import cmd_calibrate
from tests.fakes.nvml import FakeNvml, h200

ARGS = ["calibrate", "--quick", "--platform", "cpu", "--dtypes", "bf16,fp32"]


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """No GPU backend here: JAX's CPU backend stands in for the GPU that the
    fake NVML describes, so the GPU path (probe, in-use check) runs."""
    monkeypatch.setattr(cmd, "GPU_PLATFORMS", ("cpu",))


def test_json_carries_ceilings_and_the_gpus_conditions(capsys, tmp_path, cpu_as_gpu):
    fake = FakeNvml([h200(sm_clock_mhz=1755, power_mw=650_000)])
    out_file = tmp_path / "cal.json"
    ns = build_parser().parse_args(ARGS + ["--json", "--output", str(out_file)])
    assert cmd_calibrate(ns, nvml_module=fake) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(out_file.read_text())
    assert out["gpu"]["name"] == "NVIDIA H200" and out["gpu"]["uuid"] and out["gpu"]["driver"] == "570.124.06"
    assert out["ceilings"]["bf16_flop_per_second"] > 0 and out["ceilings"]["hbm_bytes_per_second"] > 0
    conds = [m["conditions"] for m in out["measurements"] if m["value"] is not None]
    assert conds and all(c["sm_clock_hertz"]["median"] == 1.755e9 for c in conds)
    assert all(c["power_watts"]["max"] == 650.0 for c in conds)
    assert out["forced"] is False


def test_a_gpu_held_by_another_process_is_refused_unless_forced(capsys, cpu_as_gpu):
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)])])
    with pytest.raises(UsageError, match=r"GPU 0 is in use by pid 4242.*--force"):
        cmd_calibrate(build_parser().parse_args(ARGS), nvml_module=fake)
    assert cmd_calibrate(build_parser().parse_args(ARGS + ["--force"]), nvml_module=fake) == 0
    text = capsys.readouterr().out
    assert "forced while in use" in text and "matmul_bf16" in text and "FLOP/s" in text


def test_the_cpu_backend_is_never_labelled_as_the_gpu(capsys):
    """Found in a trial: --platform cpu (or JAX without its CUDA plugin) on a
    GPU host printed the CPU's figures under the GPU's name and clocks, and
    refused to run because a job held the GPU it would not touch."""
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)])])
    assert cmd_calibrate(build_parser().parse_args(ARGS + ["--json"]), nvml_module=fake) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == {} and "not a GPU's" in out["note"]
    assert all(m["conditions"] == {} for m in out["measurements"])


def test_a_bad_output_is_refused_before_measuring_and_a_late_failure_keeps_the_results(tmp_path, capsys,
                                                                                      monkeypatch):
    for bad, why in ((tmp_path / "no" / "x.json", "no directory"), (tmp_path, "is a directory")):
        with pytest.raises(UsageError, match=why):
            cmd_calibrate(build_parser().parse_args(ARGS + ["--output", str(bad)]), nvml_module=FakeNvml([h200()]))
    target = tmp_path / "x.json"
    real_open = open

    def full_disk(path, *a, **k):
        if str(path) == str(target):
            raise OSError(28, "No space left on device")
        return real_open(path, *a, **k)
    monkeypatch.setattr("builtins.open", full_disk)
    assert cmd_calibrate(build_parser().parse_args(ARGS + ["--output", str(target)]),
                         nvml_module=FakeNvml([h200()])) == 1
    out, err = capsys.readouterr()
    assert "hbm_triad" in out and "No space left on device" in err


def test_bad_arguments_are_named(cpu_as_gpu):
    fake = FakeNvml([h200()])
    with pytest.raises(UsageError, match=r"--dtypes: unknown int4; choose from bf16"):
        cmd_calibrate(build_parser().parse_args(ARGS[:-2] + ["--dtypes", "int4"]), nvml_module=fake)
    with pytest.raises(UsageError, match=r"--gpu 3: NVML sees 1 GPU"):
        cmd_calibrate(build_parser().parse_args(ARGS + ["--gpu", "3"]), nvml_module=fake)


def test_without_nvml_or_gpu_the_command_says_what_to_do():
    """The real command on this GPU-less machine: the CPU backend calibrates
    with a note when asked for by name; asking for the GPU fails with a
    one-line hint; asking for nothing stops with exit 2 before measuring
    (found in a trial: it measured the CPU and exited 0, with a note)."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", *a], capture_output=True,
                                    text=True, timeout=300, env={**os.environ, "XLA_FLAGS": ""})
    ok = run(*ARGS)
    assert ok.returncode == 0, ok.stderr
    assert "hbm_triad" in ok.stdout and "these are its figures, not a GPU's" in ok.stdout
    bad = run("calibrate", "--platform", "gpu")
    assert bad.returncode == 1 and "without a GPU use --platform cpu" in bad.stderr
    assert "Traceback" not in bad.stderr
    unasked = run("calibrate", "--quick")
    assert unasked.returncode == 2 and not unasked.stdout and "measuring" not in unasked.stderr
    (line,) = unasked.stderr.splitlines()
    assert line.startswith("gpuscope calibrate: error: no GPU is visible to JAX (Unknown backend"), line
    assert "install JAX's CUDA plugin (e.g. pip install 'jax[cuda12]'" in line
    assert "or pass --platform cpu to measure this host's CPU on purpose" in line
