"""Reads Chrome trace-event JSON (`*.trace.json.gz`, `perfetto_trace.json.gz`,
what jax.profiler and the torch profiler write beside an XSpace) into a Trace.

The JSON carries timelines but no HLO and no device peaks, so analysis of a
JSON trace has no roofline; it says so in its summary.
"""
from __future__ import annotations

import gzip
import json
import zlib

import numpy as np

from .trace_model import TRANSFER_MARKERS, HostTimeline, Trace, _Builder, kind_of, parse_bytes
from .xspace_reader import DISPATCH_MARKERS, TraceError, _union_ns

DEVICE_PREFIXES = ("/device:GPU:", "GPU ")     # jax: "/device:GPU:0"; torch/kineto: "GPU 0"


def parse_chrome_trace(data: bytes, source: str = "<bytes>") -> Trace:
    if not data:
        raise TraceError(f"{source}: empty file")
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{source}: corrupt or truncated gzip ({exc})") from None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{source}: not trace-event JSON ({exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceError(f"{source}: no traceEvents array")
    procs: dict = {}
    threads: dict = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str((e.get("args") or {}).get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
    device_pids = {pid: name for pid, name in procs.items() if name.startswith(DEVICE_PREFIXES)}
    builders = {pid: _Builder(name if name.startswith("/device") else f"/device:GPU:{name.split()[-1]}", {})
                for pid, name in device_pids.items()}
    corr, launch = [], []
    host_iv: dict = {}
    lo, hi = None, None
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts = int(float(e["ts"]) * 1000)
            dur = int(float(e.get("dur", 0)) * 1000)
        except (KeyError, TypeError, ValueError):
            continue
        lo = ts if lo is None else min(lo, ts)
        hi = ts + dur if hi is None else max(hi, ts + dur)
        pid, args, name = e.get("pid"), e.get("args") or {}, str(e.get("name", ""))
        b = builders.get(pid)
        if b is not None:
            stream = threads.get((pid, e.get("tid")), "")
            op = str(args.get("hlo_op", ""))
            module = str(args.get("program_id") or args.get("hlo_module") or "")
            details = str(args.get("memcpy_details") or args.get("Memset_details") or args.get("bytes") or "")
            nbytes = parse_bytes(details) if "num_bytes" in details else float(details) if details.isdigit() else np.nan
            kind = kind_of(name if name.startswith(("Memcpy", "Memset")) else f"{stream} {name}", op)
            c = args.get("correlation_id", args.get("correlation", -1))
            b.add(ts, dur, kind, _int(e.get("tid")), _int(c), name, (module, op) if op else None, nbytes)
        else:
            host_iv.setdefault((pid, e.get("tid")), []).append(
                (ts, ts + dur, any(m in name for m in DISPATCH_MARKERS), any(m in name for m in TRANSFER_MARKERS)))
            c = args.get("correlation_id", args.get("correlation"))
            if c is not None:
                corr.append(_int(c))
                launch.append(ts)
    if lo is None:
        raise TraceError(f"{source}: no complete ('X') events")
    busiest, dispatch, xfer = 0, 0, []
    for iv in host_iv.values():
        arr = np.asarray(iv, dtype=np.int64)
        busiest = max(busiest, _union_ns(arr[:, 0], arr[:, 1]))
        d = arr[arr[:, 2] == 1]
        if len(d):
            dispatch += _union_ns(d[:, 0], d[:, 1])
        xfer.append(arr[arr[:, 3] == 1])
    x = np.concatenate(xfer) if xfer else np.empty((0, 4), np.int64)
    host = HostTimeline(np.asarray(corr, np.int64), np.asarray(launch, np.int64), dispatch, busiest, len(host_iv),
                        transfer_ns=_union_ns(x[:, 0], x[:, 1]))
    warnings = ["trace-event JSON: no HLO and no device peaks, so no roofline; summarize the .xplane.pb for one"]
    if not builders:
        warnings.append("no GPU device process: a CPU-only job, or device tracing was off")
    return Trace(source=source, format="chrome-json", devices=[b.build() for b in builders.values()], host=host,
                 start_ns=lo, end_ns=hi, warnings=warnings)


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1
