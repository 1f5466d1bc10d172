"""Reads an XSpace (`*.xplane.pb`, what jax.profiler writes and the profiler
service returns) into a Trace.

Bytes that do not parse as an XSpace are a TraceError; values that parse but
make no sense are not: an event whose start or duration falls outside
[0, MAX_TIME_NS] is skipped and counted, a stat of an unexpected type or
value is ignored (and counted in a warning), a reference to metadata that is
missing reads as unnamed, and an HLO proto that does not parse leaves its
ops without a cost.
"""
from __future__ import annotations

import math
import operator

import numpy as np
from google.protobuf.message import DecodeError

from gpuscope.xla import xplane_pb2

from .host_model import HostBuilder, HostTimeline
from .trace_model import (MAX_TIME_NS, Trace, _Builder, as_int64, count_skip,
                          kind_of, parse_bytes, skip_warning)

MAX_TRACE_BYTES = (1 << 31) - 1       # protobuf's own limit on one message
MAX_DEVICE_PROP = 1e18                # bandwidth in B/s, SM count, clock in kHz: beyond this it is not a GPU's
BAD_TIME = "with a start or duration out of range"


class TraceError(ValueError):
    """A trace that cannot be read; the message says which file and why."""


def _stat_value(stat, names: dict[int, str]):
    which = stat.WhichOneof("value")
    if which is None:
        return None
    v = getattr(stat, which)
    return names.get(v, "") if which == "ref_value" else v


def _stat_text(stat, names: dict[int, str]) -> str | None:
    """A stat as text (names, HLO ops, program ids, memcpy details); None when empty."""
    v = _stat_value(stat, names)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    elif isinstance(v, float):
        v = str(v) if math.isfinite(v) else None
    elif isinstance(v, int):
        v = str(v)
    return v or None


_INVALID = object()


def _stat_int(stat, names: dict[int, str]) -> int | None:
    """An id or a time as an int64; None when the stat holds none."""
    v = as_int64(_stat_value(stat, names), default=_INVALID)
    return None if v is _INVALID else v


def _stat_number(stat, names: dict[int, str]) -> float | None:
    """A device property: a finite number in [0, MAX_DEVICE_PROP], else None."""
    v = _stat_value(stat, names)
    if isinstance(v, str) and len(v) <= 64:
        try:
            v = float(v)
        except ValueError:
            return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    v = float(v)
    return v if 0 <= v <= MAX_DEVICE_PROP else None         # NaN fails too


def parse_xspace(data: bytes, source: str = "<bytes>") -> Trace:
    if not data:
        raise TraceError(f"{source}: empty file")
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{source}: {len(data)} bytes, over protobuf's 2 GiB limit for one XSpace")
    space = xplane_pb2.XSpace()
    try:
        space.ParseFromString(data)
    except DecodeError as exc:
        raise TraceError(f"{source}: not an XSpace protobuf (truncated or garbled: {exc})") from None
    if not space.planes:
        raise TraceError(f"{source}: no planes; not an XSpace written by a profiler")
    devices, starts, ends = [], [], []
    host = HostTimeline(np.empty(0, np.int64), np.empty(0, np.int64))
    programs: dict[str, bytes] = {}
    start_unix = None
    skipped: dict[str, int] = {}
    ignored: dict[str, int] = {}            # stat name -> values of an unexpected type or range
    # device planes first: their activity names say which host events are launches
    for plane in sorted(space.planes, key=lambda p: p.name == "/host:CPU"):
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        if plane.name.startswith("/device:GPU:"):
            dev = _device(plane, names, skipped, ignored)
            devices.append(dev)
            if len(dev):
                starts.append(int(dev.start_ns[0]))
                ends.append(int((dev.start_ns + dev.dur_ns).max()))
        elif plane.name == "/host:CPU":
            host, lo, hi = _host(plane, names, skipped, {n for d in devices for n in d.names})
            if lo is not None:
                starts.append(lo)
                ends.append(hi)
        elif plane.name == "/host:metadata":
            programs.update(_programs(plane, names))
        elif plane.name == "Task Environment":
            for s in plane.stats:
                if names.get(s.metadata_id) == "profile_start_time":
                    v = _stat_int(s, names)
                    if v is not None and v > 0:
                        start_unix = v
                    else:
                        count_skip(ignored, "profile_start_time")
    warnings = list(space.warnings) + [f"profiler error: {e}" for e in space.errors]
    if not devices:
        warnings.append("no GPU device plane: a CPU-only job, or device tracing was off")
    warnings += skip_warning(skipped)
    if ignored:
        warnings.append(f"ignored {sum(ignored.values())} stats of an unexpected type or value "
                        f"({', '.join(sorted(ignored))})")
    if not starts:
        why = f"; {sum(skipped.values())} unusable events skipped" if skipped else ""
        raise TraceError(f"{source}: no events in any plane{why}")
    return Trace(source=source, format="xplane", devices=devices, host=host, start_ns=min(starts),
                 end_ns=max(ends), start_unix_ns=start_unix, hostnames=list(space.hostnames),
                 programs=programs, warnings=warnings, skipped=skipped)


DEVICE_PROPS = {"memory_bandwidth": ("memory_bandwidth", 1.0),     # bytes/s
                "core_count": ("core_count", 1.0),
                "clock_rate": ("clock_rate_hz", 1e3),              # XSpace says kHz
                "compute_cap_major": ("cc_major", 1.0),
                "compute_cap_minor": ("cc_minor", 1.0)}


def _device(plane, names: dict[int, str], skipped: dict[str, int], ignored: dict[str, int]):
    props: dict[str, float | str] = {}
    for s in plane.stats:
        key = names.get(s.metadata_id, "")
        if key == "gpu_device_name":
            v = _stat_text(s, names)
            if v is not None:
                props["name"] = v
        elif key in DEVICE_PROPS:
            prop, scale = DEVICE_PROPS[key]
            v = _stat_number(s, names)
            if v is None or (v < 1 and not (v == 0 and key == "compute_cap_minor")):   # 9.0's minor is 0
                count_skip(ignored, key)    # missing is not zero, and 5e-324 B/s is no GPU's bandwidth
            else:
                props[prop] = v * scale
    ids = {n: i for i, n in names.items()}
    corr_id, op_id, mod_id, prog_id = (ids.get(k) for k in ("correlation_id", "hlo_op", "hlo_module", "program_id"))
    bytes_ids = {ids[k] for k in ("memcpy_details", "Memset_details", "memset_details") if k in ids}
    b = _Builder(plane.name, props)
    meta = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
        base = line.timestamp_ns
        stream_name = line.name
        for e in line.events:
            start, dur = base + e.offset_ps // 1000, e.duration_ps // 1000
            if not (0 <= start <= MAX_TIME_NS and 0 <= dur <= MAX_TIME_NS):
                count_skip(skipped, BAD_TIME)
                continue
            name = meta.get(e.metadata_id, "")
            corr, op, module, program, nbytes = -1, "", "", None, float("nan")
            for s in e.stats:
                m = s.metadata_id
                if m == corr_id:
                    v = _stat_int(s, names)
                    corr = v if v is not None else -1
                elif m == op_id:
                    op = _stat_text(s, names) or ""
                elif m == mod_id:
                    module = _stat_text(s, names) or ""
                elif m == prog_id:
                    program = _stat_text(s, names)
                elif m in bytes_ids:
                    nbytes = parse_bytes(_stat_text(s, names) or "")
            kind = kind_of(name if name.startswith(("Memcpy", "Memset")) else stream_name + " " + name, op)
            key = (program if program is not None else module, op) if op else None
            b.add(start, dur, kind, line.id, corr, name, key, nbytes)
    return b.build()


def _host(plane, names: dict[int, str], skipped: dict[str, int], device_names: set[str]):
    """Every host event, by thread. Launches are the events that carry a
    correlation id; only events that can be one are looked at for it (reading
    every event's stats costs 0.1 s on the largest bundled trace): those named
    after a device activity (XLA names its launch after the kernel) or after a
    launch API (cuLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, ...)."""
    corr_id = next((i for i, n in names.items() if n == "correlation_id"), None)
    hb = HostBuilder()
    unnamed = hb.name_index("")
    index = {k: hb.name_index(v.name) for k, v in plane.event_metadata.items()}
    can_launch = {k for k, v in plane.event_metadata.items()
                  if v.name in device_names or any(m in v.name for m in LAUNCH_API_MARKERS)}
    lo = hi = None
    for line in plane.lines:
        events = line.events
        if not events:
            continue
        thread = hb.thread_index(line.id, line.display_name or line.name)
        # field by field through C (attrgetter), then array arithmetic: the
        # largest bundled trace has 395,000 host events on one line
        cols = np.fromiter(map(_EVENT_FIELDS, events), dtype=_THREE_INT64, count=len(events))
        off, dur, mids = _ps_to_ns(cols[:, 0]), _ps_to_ns(cols[:, 1]), cols[:, 2]
        t = off + line.timestamp_ns if 0 <= line.timestamp_ns <= MAX_TIME_NS else np.full(len(off), -1, np.int64)
        ok = (off >= 0) & (dur >= 0) & (t >= 0) & (t <= MAX_TIME_NS)
        for _ in range(int((~ok).sum())):
            count_skip(skipped, BAD_TIME)
        uniq, inverse = np.unique(mids, return_inverse=True)     # ids are any int64: map the few distinct ones
        name = np.asarray([index.get(int(m), unnamed) for m in uniq], np.int64)[inverse.reshape(-1)]
        corr = np.full(len(events), _NO_LAUNCH, np.int64)
        if corr_id is not None and can_launch:
            for i in np.flatnonzero(np.isin(mids, list(can_launch))):
                for st in events[int(i)].stats:
                    if st.metadata_id == corr_id:
                        c = _stat_int(st, names)
                        corr[i] = -1 if c is None else c
                        break
        hb.add_many(thread, t[ok], (t + dur)[ok], name[ok], corr[ok], _NO_LAUNCH)
        if ok.any():
            lo = int(t[ok].min()) if lo is None else min(lo, int(t[ok].min()))
            hi = int((t + dur)[ok].max()) if hi is None else max(hi, int((t + dur)[ok].max()))
    return hb.build(), lo, hi


_EVENT_FIELDS = operator.attrgetter("offset_ps", "duration_ps", "metadata_id")
_THREE_INT64 = np.dtype((np.int64, 3))
LAUNCH_API_MARKERS = ("Launch", "Memcpy", "Memset", "memcpy", "memset", "Graph", "nccl", "Nccl")
_NO_LAUNCH = np.iinfo(np.int64).min        # not a launch (-1 is a launch whose id is unreadable)


def _ps_to_ns(ps: np.ndarray) -> np.ndarray:
    """Picoseconds (int64) -> int64 ns; -1 where out of [0, MAX_TIME_NS]."""
    ns = ps // 1000
    return np.where((ns < 0) | (ns > MAX_TIME_NS), -1, ns)


def _programs(plane, names: dict[int, str]) -> dict[str, bytes]:
    """program key -> serialized HloProto. Keyed by program id and by
    `module(program id)` name as the device events may carry either."""
    out: dict[str, bytes] = {}
    for m in plane.event_metadata.values():
        hlo, program = None, None
        for s in m.stats:
            key = names.get(s.metadata_id)
            if key == "Hlo Proto":
                hlo = s.bytes_value          # b"" when the stat holds another type: no program
            elif key == "program_id":
                program = _stat_text(s, names)
        if not hlo:
            continue
        module, _, rest = m.name.partition("(")
        pid = program if program not in (None, "0") else rest.rstrip(")")
        out[pid] = hlo
        # By module name only while it is unique: two programs named jit__lambda make it ambiguous.
        out[module] = b"" if module in out else hlo
    return out
