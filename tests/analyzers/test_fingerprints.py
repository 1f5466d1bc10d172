"""What makes two runs the same program: the HLO a capture saw (real JAX
programs, traced in their own processes) and the command line without what
changes from run to run."""
import glob
from pathlib import Path

import pytest

from gpuscope.analyzers.fingerprints import COMMAND, SERVING, canonical_command, command_fingerprint
from gpuscope.analyzers.trace_program import trace_program
from gpuscope.collectors.xspace_reader import parse_xspace
from tests.jax_jobs import traced_job

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "h200-run1" / "traces"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobs")
    return {n: traced_job(tmp, n, v) for n, v in (("first", "same"), ("second", "same"), ("changed", "changed"),
                                                 ("slow", "slow"))}


def test_the_same_jax_program_run_twice_gets_one_fingerprint_and_a_changed_one_another(jobs):
    a, b, changed, slow = (trace_program(parse_xspace(jobs[n])) for n in ("first", "second", "changed", "slow"))
    assert a["kind"] == "hlo" and a["name"] == "jit_train_step"
    assert a["fingerprint"] == b["fingerprint"] == slow["fingerprint"]
    assert changed["fingerprint"] != a["fingerprint"] and changed["name"] == "jit_train_step"
    # the step: the time between the job's calls of its program; a host that waits 20 ms makes it longer
    assert a["steps"] == 12 and a["step_seconds"] < 0.02
    assert 0.02 <= slow["step_seconds"] < 0.05


@pytest.mark.parametrize("phase, name, step", [
    # 1 GiB f32 x*a+b reads and writes 2 GiB a step: at the recording's 3.91 TB/s, 0.55 ms
    ("hbm_stream", "jit__lambda", 2 * 2**30 / 3.91e12),
    # 8192^3 bf16 at 647 TFLOP/s
    ("matmul_bf16", "jit__lambda", 2 * 8192**3 / 647e12),
])
def test_the_h200_recording_s_programs_and_steps(phase, name, step):
    (path,) = glob.glob(str(FIXTURES / phase / "**" / "*.xplane.pb"), recursive=True)
    p = trace_program(parse_xspace(Path(path).read_bytes(), path))
    assert p["kind"] == "hlo" and p["name"] == name and p["device_time_fraction"] == 1.0
    assert p["step_seconds"] == pytest.approx(step, rel=0.15)


def test_a_trace_without_a_program_has_none():
    (path,) = glob.glob(str(FIXTURES / "pcie_h2d_d2h" / "**" / "*.xplane.pb"), recursive=True)
    assert trace_program(parse_xspace(Path(path).read_bytes(), path)) is None


def test_what_changes_from_run_to_run_is_not_the_program():
    a = command_fingerprint("pid:1 /usr/bin/python3.11 /home/a/run-17/train.py --lr 3e-4 --seed 7 "
                            "--output-dir /ckpt/run-17 --master-port 29500 --local_rank=0 --hf-token <redacted>")
    b = command_fingerprint("HF_HOME=/x python3 /srv/b/train.py --lr 3e-4 --seed=8 --output-dir /ckpt/run-18 "
                            "--master-port 29511 --local_rank=3")
    assert a == b and a.kind == COMMAND and a.name == "python train.py"
    assert a.canonical == "python train.py --lr=3e-4"
    assert command_fingerprint("python3 train.py --lr 1e-3 --seed 7") != a         # another learning rate
    assert command_fingerprint("python3 eval.py --lr 3e-4") != a
    assert command_fingerprint("") is None


def test_a_serving_engine_is_its_model_and_configuration():
    a = command_fingerprint("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --port 8000 "
                            "--host 0.0.0.0 --max-num-batched-tokens 8192")
    b = command_fingerprint("/opt/venv/bin/vllm serve meta-llama/Llama-3.1-8B --port 9000 --tensor-parallel-size 2 "
                            "--max-num-batched-tokens 8192")
    assert a.kind == SERVING and a.name == "vllm meta-llama/Llama-3.1-8B"
    assert canonical_command("vllm serve m --port 1")[:2] == ["vllm", "serve"]
    assert b == a
    assert command_fingerprint("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 4 --port 8000 "
                               "--max-num-batched-tokens 8192") != a
    s = command_fingerprint("python3 -m sglang.launch_server --model-path Qwen/Qwen2-7B --port 30000 --tp 2")
    assert s.kind == SERVING and s.name == "sglang Qwen/Qwen2-7B"


def test_python_s_own_options_are_not_the_program_s_arguments():
    # torchrun starts each worker as `python -u SCRIPT ...`, with the script as the launcher was given it
    a = command_fingerprint("/usr/bin/python3 -u /home/a/run-17/train.py --lr 3e-4 --seed 7")
    b = command_fingerprint("/opt/venv/bin/python3.11 -u /home/a/run-18/train.py --lr 3e-4 --seed 8")
    assert a == b == command_fingerprint("python3 train.py --lr 3e-4")
    assert a.name == "python train.py"
    # a module is the program: `python -m pkg.train` is named after it, and another module is another program
    m = command_fingerprint("python3 -u -m pkg.train --lr 3e-4 --seed 1")
    assert m.name == "python pkg.train" and m.canonical == "python -m pkg.train --lr=3e-4"
    assert command_fingerprint("python -W ignore -mpkg.train --lr 3e-4") == m
    assert command_fingerprint("python3 -m pkg.eval --lr 3e-4") != m
    assert canonical_command("python3 -c import jax; jax.devices()") == ["python", "-c", "import", "jax;",
                                                                          "jax.devices()"]
    # after the script, -u is the script's own flag
    assert canonical_command("python3 train.py -u 3") == ["python", "train.py", "--u=3"]


def test_a_console_script_is_its_own_program_not_the_interpreter_s():
    # /proc shows the shebang's interpreter first: this is `vllm serve ...` as the engine runs it
    shown = command_fingerprint("/usr/bin/python3 /usr/local/bin/vllm serve meta-llama/Llama-3.1-8B "
                                "--tensor-parallel-size 2 --port 8000")
    assert shown == command_fingerprint("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --port 9000")
    assert shown.kind == SERVING and shown.name == "vllm meta-llama/Llama-3.1-8B"
    assert command_fingerprint("/usr/bin/python3 -u /usr/local/bin/torchrun --nproc_per_node 8 train.py") == \
        command_fingerprint("torchrun --nproc_per_node 8 train.py")


def test_a_flag_that_names_the_model_or_the_batch_is_configuration_not_a_run_s_own_value():
    # Hugging Face's scripts: one script fine-tunes any model, named by --model_name_or_path
    small = command_fingerprint("python3 run_clm.py --model_name_or_path meta-llama/Llama-3.1-8B --output_dir /o/1 "
                                "--run_name a")
    big = command_fingerprint("python3 run_clm.py --model_name_or_path meta-llama/Llama-3.1-70B --output_dir /o/2 "
                              "--run_name b")
    assert small != big
    assert command_fingerprint("python3 t.py --model-name 8b") != command_fingerprint("python3 t.py --model-name 70b")
    assert canonical_command("python3 t.py --local-batch-size 32 --local_rank 3 --run-name x --served-model-name y") \
        == ["python", "t.py", "--local-batch-size=32"]
