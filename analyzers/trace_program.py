"""Which program a captured trace ran, and how fast: the program that took
the device's time (fingerprints.py), and its step, the mean time between
the job's calls of it.

A JAX job calls a jitted function once per step; the runtime marks each call
on the calling thread (`PjitFunction(train_step)`, for the module XLA names
`jit_train_step`). The mean time between the first and the last top-level
call, over the calls the trace holds, is the step: dispatch, host work and
waiting for the device included, which is what a slower step is made of. A
job that calls several functions of one name per step (`<lambda>`) gets a
fraction of its step, the same fraction in every run of it, so runs of one
program still compare. On a trace of the host only (JAX on the CPU), the
program is the function the job called most.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from gpuscope.collectors.trace_model import Trace
from gpuscope.xla import hlo_pb2

from .fingerprints import Fingerprint, hlo_fingerprint, module_name_fingerprint

MIN_CALLS = 3          # two calls make one interval: too few to call a step time


def trace_program(trace: Trace) -> dict | None:
    """{fingerprint, kind, name, step_seconds, steps, device_time_fraction}
    of the program that ran most; None when the trace shows no program."""
    key, share = _main_by_device(trace)
    module = _module_name(trace, key) if key is not None else None
    if key is None:
        module = _main_by_calls(trace)
        if module is None:
            return None
        key = module if trace.programs.get(module) else None
    fp = _fingerprint(trace, key, module)
    if fp is None:
        return None
    step, calls = step_time(trace, module or fp.name)
    return dict(fingerprint=fp.value, kind=fp.kind, name=fp.name, step_seconds=step, steps=calls,
                device_time_fraction=share)


def _main_by_device(trace: Trace) -> tuple[str | None, float | None]:
    """The program key whose ops took the most device time, and its share of
    the device time that any program's ops took."""
    time: Counter[str] = Counter()
    for dev in trace.devices:
        has_op = dev.op_idx >= 0
        if not has_op.any():
            continue
        sums = np.bincount(dev.op_idx[has_op], weights=dev.dur_ns[has_op].astype(np.float64), minlength=len(dev.ops))
        for (program, _op), t in zip(dev.ops, sums):
            time[program] += float(t)
    if not time:
        return None, None
    key, t = time.most_common(1)[0]
    total = sum(time.values())
    return key, (t / total if total else None)


def _module_name(trace: Trace, key: str) -> str:
    hlo = trace.programs.get(key)
    if hlo:
        proto = hlo_pb2.HloProto()
        try:
            proto.ParseFromString(hlo)
            if proto.hlo_module.name:
                return proto.hlo_module.name
        except Exception:       # noqa: BLE001 - a bad proto: the key is all we know
            pass
    return key


def _fingerprint(trace: Trace, key: str | None, module: str | None) -> Fingerprint | None:
    if key is not None and trace.programs.get(key):
        fp = hlo_fingerprint(trace.programs[key])
        if fp is not None:
            return fp
    if module is None:
        return None
    ops = [op for dev in trace.devices for (program, op) in dev.ops if program == key]
    return module_name_fingerprint(module, ops)


def _function_of(module: str) -> str:
    """jit_train_step -> train_step; jit__lambda -> <lambda> (JAX's names)."""
    fn = module[4:] if module.startswith("jit_") else module
    return "<lambda>" if fn == "_lambda" else fn


def _calls(trace: Trace) -> Counter[str]:
    ev = trace.host.events
    if ev is None or not len(ev):
        return Counter()
    counts = np.bincount(ev.name_idx, minlength=len(ev.names))
    return Counter({ev.names[i][len("PjitFunction("):-1]: int(n) for i, n in enumerate(counts)
                    if n and ev.names[i].startswith("PjitFunction(") and ev.names[i].endswith(")")})


def _main_by_calls(trace: Trace) -> str | None:
    calls = _calls(trace)
    if not calls:
        return None
    fn = calls.most_common(1)[0][0]
    return "jit__lambda" if fn == "<lambda>" else f"jit_{fn}"


def step_time(trace: Trace, module: str) -> tuple[float | None, int]:
    """(mean seconds between top-level calls of the module's function on
    the thread that calls it most, calls); None under MIN_CALLS calls."""
    ev = trace.host.events
    if ev is None or not len(ev):
        return None, 0
    want = f"PjitFunction({_function_of(module)})"
    idx = [i for i, n in enumerate(ev.names) if n == want]
    if not idx:
        return None, 0
    mask = np.isin(ev.name_idx, idx)
    threads = ev.thread[mask]
    if not len(threads):
        return None, 0
    thread = int(np.bincount(threads).argmax())
    sel = mask & (ev.thread == thread)
    starts, ends = ev.start_ns[sel], ev.end_ns[sel]
    order = np.argsort(starts, kind="stable")
    kept, last_end = [], -1
    for s, e in zip(starts[order], ends[order]):
        if s >= last_end:          # a call nested in another is the same call (the runtime marks both)
            kept.append(int(s))
            last_end = int(e)
    if len(kept) < MIN_CALLS:
        return None, len(kept)
    return (kept[-1] - kept[0]) / (len(kept) - 1) / 1e9, len(kept)
