"""A serving engine's steps on the host, from the spans of its torch trace:
how long a step takes, and what share of it goes to running the model, to
scheduling, to sampling and to the rest.

A vLLM step is one scheduler decision followed by one forward pass and one
sampling of the next tokens. Which of them a trace shows depends on the
process it was taken in (../shared/fixtures/vllm-0.32-cpu, vLLM 0.32):
- the engine core (`EngineCore.step`, when the model runs in its process)
  holds the whole step: the step is that span;
- a worker (rank<N> traces with the multiprocess executor) runs
  `execute_model` and then `sample_tokens`, one RPC each, while the scheduler
  runs in the engine core's process: a step runs from the start of an
  `execute_model` to the end of the last part before the next one, and
  scheduling is absent from it (None), not zero.

Spans are named by the Python tracer (`vllm/v1/worker/gpu_worker.py(1300):
execute_model`) and by vLLM's per-step annotation
(`execute_context_1(6)_generation_0(0)`, around the model runner's
execute_model). Where parts nest (vLLM before 0.11 sampled inside
execute_model), the innermost counts: time in sampling is sampling even
inside execute_model. Everything is measured on the thread that runs the
most steps, with interval arithmetic over the matching spans only.
"""
from __future__ import annotations

import re

import numpy as np

from gpuscope.collectors.host_model import HostEvents
from gpuscope.collectors.intervals import covered_before, merge

STEP, SAMPLING, SCHEDULING, MODEL = range(1, 5)
PARTS = ((SAMPLING, "sampling"), (SCHEDULING, "scheduling"), (MODEL, "model_execution"))   # innermost first

_PY = r"(?:^|/)vllm/{path}\.py\(\d+\): (?:{functions})$"
# role <- span name; the first that matches wins
ROLES = (
    (STEP, _PY.format(path=r"v1/engine/core", functions="step|step_with_batch_queue")),
    (SAMPLING, _PY.format(path=r"[\w/]+", functions="sample_tokens|_sample")),
    (SAMPLING, _PY.format(path=r"v1/sample/sampler", functions="forward")),
    (SCHEDULING, _PY.format(path=r"v1/core/sched/[\w/]+", functions="schedule|update_from_output")),
    (MODEL, _PY.format(path=r"[\w/]+", functions="execute_model")),
    (MODEL, r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$"),
)
_ROLES = [(role, re.compile(pattern)) for role, pattern in ROLES]


def role_of(name: str) -> int:
    """The span's part of a step (STEP, SAMPLING, SCHEDULING, MODEL), 0 for none."""
    return next((role for role, pattern in _ROLES if pattern.search(name)), 0)


def host_steps(ev: HostEvents | None) -> dict | None:
    """Step count, step time (ms: mean, p50, p99) and the fractions of step
    time in each part; None when the trace has no step of a known engine.
    A part whose spans the trace does not have is None."""
    if ev is None or not len(ev):
        return None
    roles = np.fromiter((role_of(n) for n in ev.names), np.int8, len(ev.names))
    if not roles.any():
        return None
    role = roles[ev.name_idx]
    anchor = STEP if (role == STEP).any() else MODEL
    if not (role == anchor).any():
        return None
    thread = int(np.bincount(ev.thread[role == anchor]).argmax())
    mine = (ev.thread == thread) & (role > 0)
    start, end, role = ev.start_ns[mine], ev.end_ns[mine], role[mine]
    lo, hi = _steps(start, end, role, anchor)
    dur = hi - lo
    total = int(dur.sum())
    if not len(lo) or total <= 0:
        return None
    fractions: dict[str, float | None] = {}
    inner = (np.empty(0, np.int64), np.empty(0, np.int64))
    covered_inner = np.zeros(len(lo), np.int64)
    for part, key in PARTS:                       # each part's time: what it covers that an inner part does not
        m = role == part
        if not m.any():
            fractions[key] = None
            continue
        inner = merge(np.concatenate([inner[0], start[m]]), np.concatenate([inner[1], end[m]]))
        covered = covered_before(inner, hi) - covered_before(inner, lo)
        fractions[key] = float((covered - covered_inner).sum()) / total
        covered_inner = covered
    fractions["other"] = float((dur - covered_inner).sum()) / total
    return dict(steps=int(len(lo)), basis="engine core steps" if anchor == STEP else
                "worker steps: execute_model to the end of its sampling (the scheduler runs in another process)",
                duration_ms=dict(mean=_ms(dur.mean()), p50=_ms(np.percentile(dur, 50)),
                                 p99=_ms(np.percentile(dur, 99))),
                **{f"{k}_fraction": v for k, v in fractions.items()})


def _steps(start: np.ndarray, end: np.ndarray, role: np.ndarray, anchor: int) -> tuple[np.ndarray, np.ndarray]:
    """Each step's [start, end): the engine core's step spans, merged; or,
    on a worker, from each execute_model (its nested calls merged) to the
    latest end of a part that starts before the next one."""
    a = role == anchor
    lo, hi = merge(start[a], end[a])
    if anchor == STEP or not len(lo):
        return lo, hi
    step = np.searchsorted(lo, start, side="right") - 1          # the step each part starts in
    inside = step >= 0
    ends = hi.copy()
    np.maximum.at(ends, step[inside], end[inside])
    nxt = np.append(lo[1:], np.iinfo(np.int64).max)
    return lo, np.minimum(ends, nxt)


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)
