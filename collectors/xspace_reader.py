"""Reads an XSpace (`*.xplane.pb`, what jax.profiler writes and the profiler
service returns) into a Trace."""
from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from gpuscope.xla import xplane_pb2

from .trace_model import TRANSFER_MARKERS, HostTimeline, Trace, _Builder, kind_of, parse_bytes

DISPATCH_MARKERS = ("PjitFunction", "PjRt", "Execute", "cuLaunch", "cudaLaunch", "hipLaunch", "ThunkExecutor",
                    "LaunchKernel")


class TraceError(ValueError):
    """A trace that cannot be read; the message says which file and why."""


def _stat_value(stat, names: dict[int, str]):
    which = stat.WhichOneof("value")
    if which is None:
        return None
    v = getattr(stat, which)
    return names.get(v, "") if which == "ref_value" else v


def parse_xspace(data: bytes, source: str = "<bytes>") -> Trace:
    if not data:
        raise TraceError(f"{source}: empty file")
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
    for plane in space.planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        if plane.name.startswith("/device:GPU:"):
            dev = _device(plane, names)
            devices.append(dev)
            if len(dev):
                starts.append(int(dev.start_ns[0]))
                ends.append(int((dev.start_ns + dev.dur_ns).max()))
        elif plane.name == "/host:CPU":
            host, lo, hi = _host(plane, names)
            if lo is not None:
                starts.append(lo)
                ends.append(hi)
        elif plane.name == "/host:metadata":
            programs.update(_programs(plane, names))
        elif plane.name == "Task Environment":
            for s in plane.stats:
                if names.get(s.metadata_id) == "profile_start_time":
                    start_unix = int(_stat_value(s, names))
    warnings = list(space.warnings) + [f"profiler error: {e}" for e in space.errors]
    if not devices:
        warnings.append("no GPU device plane: a CPU-only job, or device tracing was off")
    if not starts:
        raise TraceError(f"{source}: no events in any plane")
    return Trace(source=source, format="xplane", devices=devices, host=host, start_ns=min(starts),
                 end_ns=max(ends), start_unix_ns=start_unix, hostnames=list(space.hostnames),
                 programs=programs, warnings=warnings)


def _device(plane, names: dict[int, str]):
    props: dict[str, float | str] = {}
    for s in plane.stats:
        key, v = names.get(s.metadata_id, ""), _stat_value(s, names)
        if key == "gpu_device_name":
            props["name"] = v
        elif key == "memory_bandwidth":
            props["memory_bandwidth"] = float(v)          # bytes/s
        elif key == "core_count":
            props["core_count"] = float(v)
        elif key == "clock_rate":
            props["clock_rate_hz"] = float(v) * 1e3      # XSpace says kHz
        elif key == "compute_cap_major":
            props["cc_major"] = float(v)
        elif key == "compute_cap_minor":
            props["cc_minor"] = float(v)
    ids = {n: i for i, n in names.items()}
    corr_id, op_id, mod_id, prog_id = (ids.get(k) for k in ("correlation_id", "hlo_op", "hlo_module", "program_id"))
    bytes_ids = {ids[k] for k in ("memcpy_details", "Memset_details", "memset_details") if k in ids}
    b = _Builder(plane.name, props)
    meta = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
        base = line.timestamp_ns
        stream_name = line.name
        for e in line.events:
            name = meta.get(e.metadata_id, "")
            corr, op, module, program, nbytes = -1, "", "", None, float("nan")
            for s in e.stats:
                m = s.metadata_id
                if m == corr_id:
                    v = _stat_value(s, names)
                    corr = int(v) if v not in (None, "") else -1
                elif m == op_id:
                    op = _stat_value(s, names)
                elif m == mod_id:
                    module = _stat_value(s, names)
                elif m == prog_id:
                    program = _stat_value(s, names)
                elif m in bytes_ids:
                    nbytes = parse_bytes(str(_stat_value(s, names)))
            kind = kind_of(name if name.startswith(("Memcpy", "Memset")) else stream_name + " " + name, op)
            key = (str(program) if program not in (None, "") else module, op) if op else None
            b.add(base + e.offset_ps // 1000, e.duration_ps // 1000, kind, line.id, corr, name, key, nbytes)
    return b.build()


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    if not len(starts):
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    group_start = s[new]
    group_end = np.maximum.reduceat(e, np.flatnonzero(new))
    return int((group_end - group_start).sum())


def _host(plane, names: dict[int, str]):
    corr_id = next((i for i, n in names.items() if n == "correlation_id"), None)
    meta = {k: v.name for k, v in plane.event_metadata.items()}
    dispatch_meta = {k for k, n in meta.items() if any(m in n for m in DISPATCH_MARKERS)}
    transfer_meta = {k for k, n in meta.items() if any(m in n for m in TRANSFER_MARKERS)}
    corr, launch, lo, hi = [], [], None, None
    xfer_s, xfer_e = [], []
    busiest, dispatch = 0, 0
    for line in plane.lines:
        if not line.events:
            continue
        base = line.timestamp_ns
        n = len(line.events)
        st = np.empty(n, np.int64)
        en = np.empty(n, np.int64)
        disp = np.zeros(n, bool)
        for i, e in enumerate(line.events):
            t = base + e.offset_ps // 1000
            st[i], en[i] = t, t + e.duration_ps // 1000
            if e.metadata_id in dispatch_meta:
                disp[i] = True
            if e.metadata_id in transfer_meta:
                xfer_s.append(st[i])
                xfer_e.append(en[i])
            if e.stats and corr_id is not None:
                for s in e.stats:
                    if s.metadata_id == corr_id:
                        corr.append(int(_stat_value(s, names) or -1))
                        launch.append(t)
                        break
        lo = int(st.min()) if lo is None else min(lo, int(st.min()))
        hi = int(en.max()) if hi is None else max(hi, int(en.max()))
        busy = _union_ns(st, en)
        if busy > busiest:
            busiest = busy
        if disp.any():
            dispatch += _union_ns(st[disp], en[disp])
    host = HostTimeline(np.asarray(corr, np.int64), np.asarray(launch, np.int64), dispatch_ns=dispatch,
                        busy_ns=busiest, threads=sum(1 for ln in plane.lines if ln.events),
                        transfer_ns=_union_ns(np.asarray(xfer_s, np.int64), np.asarray(xfer_e, np.int64)))
    return host, lo, hi


def _programs(plane, names: dict[int, str]) -> dict[str, bytes]:
    """program key -> serialized HloProto. Keyed by program id and by
    `module(program id)` name as the device events may carry either."""
    out: dict[str, bytes] = {}
    for m in plane.event_metadata.values():
        hlo, program = None, None
        for s in m.stats:
            key = names.get(s.metadata_id)
            if key == "Hlo Proto":
                hlo = s.bytes_value
            elif key == "program_id":
                program = _stat_value(s, names)
        if not hlo:
            continue
        module, _, rest = m.name.partition("(")
        pid = str(program) if program not in (None, "", 0) else rest.rstrip(")")
        out[pid] = hlo
        # By module name only while it is unique: two programs named jit__lambda make it ambiguous.
        out[module] = b"" if module in out else hlo
    return out
