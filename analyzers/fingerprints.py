"""What makes two runs "the same program": a fingerprint of the compiled
HLO a capture saw, or of the command line that started the job.

HLO: XLA's HloProto of the program that took the device's time (else, on a
host-only trace, the one the job called most). The fingerprint hashes the
program's structure: every computation's instructions in order, each as its
opcode, shape, parameter number, fusion kind, dimensions, custom-call target,
dot dimensions and operands/called computations by position. Left out on
purpose: names and ids (they follow compile order and XLA's counters),
source metadata (line numbers move with unrelated edits), backend configs
(GPU autotuning may pick another of two near-equal kernels in each process)
and constants. The same jitted function with the same shapes and dtypes is
one program on every host and in every run; a changed shape, dtype, op or
fusion is another.

Command lines: the executable's basename and the arguments, without what
changes from run to run of one program (seeds, ports, addresses, ranks,
output/log/checkpoint paths, run names and ids, timestamps) and without
redacted secrets. A serving engine's command (vLLM, SGLang, TensorRT-LLM)
names the model it serves, and its fingerprint is the model with the
engine's configuration flags.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from gpuscope.security.redact import REDACTED
from gpuscope.xla import hlo_pb2

HLO, HLO_NAME, COMMAND, SERVING = "hlo", "hlo-name", "command", "serving"


@dataclass(frozen=True)
class Fingerprint:
    value: str            # 16 hex digits
    kind: str             # HLO, HLO_NAME, COMMAND, SERVING
    name: str             # for people: jit_train_step, python3 train.py, vllm serve meta-llama/Llama-3-8B
    canonical: str = ""   # the command line it was taken of, without its volatile arguments


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\x00")
    return h.hexdigest()[:16]


def hlo_fingerprint(hlo: bytes) -> Fingerprint | None:
    """The structure of one serialized HloProto; None when it does not parse
    or holds no instruction."""
    proto = hlo_pb2.HloProto()
    try:
        proto.ParseFromString(hlo)
    except Exception:       # noqa: BLE001 - protobuf raises DecodeError or others on garbage
        return None
    module = proto.hlo_module
    order = {c.id: i for i, c in enumerate(module.computations)}
    parts: list[str] = [f"entry {order.get(module.entry_computation_id, -1)}"]
    count = 0
    for comp in module.computations:
        local = {ins.id: i for i, ins in enumerate(comp.instructions)}
        parts.append(f"computation fusion={comp.is_fusion_computation} root={local.get(comp.root_id, -1)}")
        for ins in comp.instructions:
            count += 1
            dots = ins.dot_dimension_numbers
            parts.append("|".join((
                ins.opcode, ins.shape.SerializeToString(deterministic=True).hex(), str(ins.parameter_number),
                ins.fusion_kind, ",".join(map(str, ins.dimensions)), ins.custom_call_target,
                dots.SerializeToString(deterministic=True).hex(),
                ",".join(str(local.get(o, "?")) for o in ins.operand_ids),
                ",".join(str(order.get(c, "?")) for c in ins.called_computation_ids))))
    if not count:
        return None
    return Fingerprint(_digest(*parts), HLO, module.name or "?")


# jit_train_step.123 / jit_train_step(123) -> jit_train_step
_MODULE_SUFFIX = re.compile(r"[.(]\d+\)?$")


def module_name_fingerprint(module: str, ops: list[str]) -> Fingerprint:
    """A program known by name only (a trace that carries no HLO: Chrome
    trace JSON): its module name and the set of op names it ran. Weaker
    than HLO: two programs of one name and the same ops are one."""
    name = _MODULE_SUFFIX.sub("", module) or "?"
    return Fingerprint(_digest(name, *sorted(set(ops))), HLO_NAME, name)


# Flags whose values change from run to run of one program (whole words of the flag's name).
_VOLATILE_WORDS = {"seed", "port", "ports", "addr", "address", "host", "hostname", "ip", "rank", "local",
                   "node", "nodes", "output", "out", "outdir", "dir", "log", "logs", "logdir", "logging",
                   "ckpt", "checkpoint", "checkpoints", "save", "resume", "run", "name", "id", "uuid", "tag",
                   "timestamp", "time", "date", "wandb", "tensorboard", "profile", "profiler", "trace",
                   "coordinator", "master", "process", "world", "dist", "url", "served"}
_FLAG = re.compile(r"^--?([A-Za-z][\w.-]*)(?:=(.*))?$")
# A flag's value, when it is one: not itself a flag (negative numbers are values)
_IS_VALUE = re.compile(r"^(?!-[A-Za-z-])")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_INTERPRETER = re.compile(r"^(python|pypy|torchrun|accelerate|deepspeed|mpirun|srun|uv|conda)")
_PYTHON = re.compile(r"^(python|pypy)[\d.]*$")
# Python's own options before its script: -u -B -O... take no value; -W and -X take one; -m names the
# module to run, -c the code (python --help). torchrun starts every worker as `python -u SCRIPT`.
_PY_OPTION = re.compile(r"^-([bBdEiIOPqsSuvx]*)([cmWX]?)(.*)$")
_SERVING = (  # (engine, how its command starts, which argument names the model)
    ("vllm", re.compile(r"^vllm serve\b|vllm\.entrypoints\."), ("model",)),
    ("sglang", re.compile(r"sglang\.launch_server|^sglang serve\b"), ("model-path", "model_path", "model")),
    ("tensorrt-llm", re.compile(r"^trtllm-serve\b"), ("model",)),
)


def _words(flag: str) -> set[str]:
    return set(re.split(r"[-_.]", flag.lower()))


# Words that name what a program computes: with one of them, a flag of a weak volatile word is configuration
# (--model_name_or_path, --tokenizer-name, --local-batch-size, --output-layer-size), not a run's own value.
_WEAK_VOLATILE = {"name", "id", "local", "output", "out", "time", "tag"}
_CONFIG_WORDS = {"model", "tokenizer", "dataset", "config", "batch", "size", "layer", "layers", "dim", "len",
                 "length", "dtype", "precision", "vocab", "hidden", "heads", "experts"}


def _volatile(flag: str) -> bool:
    words = _words(flag)
    hits = words & _VOLATILE_WORDS
    if hits and hits <= _WEAK_VOLATILE and words & _CONFIG_WORDS:
        return False
    return bool(hits)


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def canonical_command(command: str) -> list[str]:
    """The command's words without its volatile and secret arguments, the
    executable and scripts by basename, flags sorted; leading VAR=value
    words dropped."""
    words = command.split()
    if words and words[0].startswith("pid:"):
        words = words[1:]
    while words and _ENV.match(words[0]):
        words = words[1:]
    head, words = _without_interpreter_options(words)
    out: list[str] = [_base(w) if n == 0 else w for n, w in enumerate(head)]
    i = 0
    while i < len(words):
        w = words[i]
        m = _FLAG.match(w)
        if m:
            flag, value = m.group(1), m.group(2)
            takes_next = value is None and i + 1 < len(words) and _IS_VALUE.match(words[i + 1]) is not None
            if takes_next:
                value = words[i + 1]
            i += 2 if takes_next else 1
            if _volatile(flag) or (value is not None and REDACTED in value):
                continue
            out.append(f"--{flag}" + (f"={value}" if value is not None else ""))
            continue
        out.append(_base(w) if "/" in w and (not out or _INTERPRETER.match(out[0]) or w.endswith(".py")) else w)
        i += 1
    if out:
        out[0] = re.sub(r"(\d+(\.\d+)*)$", "", out[0]) or out[0]      # python3.11 and python3 are one
    # flags in any order are one command; positional words keep theirs
    return [w for w in out if not w.startswith("--")] + sorted(w for w in out if w.startswith("--"))


def _without_interpreter_options(words: list[str]) -> tuple[list[str], list[str]]:
    """A Python interpreter's command without its own options (`python -u
    train.py` is `python train.py`; `-m pkg.mod` stays, as the program), and
    without the interpreter when it runs a console script by its shebang
    (/proc shows `/usr/bin/python3 /usr/local/bin/vllm serve M` for `vllm
    serve M`). Returns the words to keep as they are (the interpreter,
    `-m MODULE` or `-c`) and the rest, to read as arguments."""
    if not words or not _PYTHON.match(_base(words[0])):
        return [], words
    out, i = [words[0]], 1
    while i < len(words):
        m = _PY_OPTION.match(words[i])
        if not m or words[i] == "-" or words[i].startswith("--"):
            break
        letter, value = m.group(2), m.group(3)
        if letter == "c":
            return out + ["-c"], ([value] if value else []) + words[i + 1:]
        if letter and not value and i + 1 < len(words):
            value, i = words[i + 1], i + 1
        i += 1
        if letter == "m":
            return out + ["-m", value], words[i:]
    script = words[i] if i < len(words) else ""
    if "/bin/" in script and not script.endswith(".py"):
        return [], words[i:]        # a console script: the program is the script
    return out, words[i:]


def command_fingerprint(command: str) -> Fingerprint | None:
    """None for a command with nothing left to tell programs apart by."""
    words = canonical_command(command)
    if not words:
        return None
    text = " ".join(words)
    for engine, starts, model_flags in _SERVING:
        if starts.search(text):
            model = _serving_model(words, model_flags)
            return Fingerprint(_digest(SERVING, engine, text), SERVING,
                               f"{engine} {model}" if model else engine, text)
    script = next((w for w in words[1:] if w.endswith(".py") or not w.startswith("-")), "")
    name = f"{words[0]} {script}".strip() if _INTERPRETER.match(words[0]) else words[0]
    return Fingerprint(_digest(COMMAND, text), COMMAND, name, text)


def _serving_model(words: list[str], flags: tuple[str, ...]) -> str:
    for w in words:
        m = _FLAG.match(w)
        if m and m.group(1) in flags and m.group(2):
            return m.group(2)
    if len(words) > 2 and words[1] == "serve" and not words[2].startswith("-"):
        return words[2]      # vllm serve MODEL
    return ""
