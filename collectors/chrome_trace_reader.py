"""Reads Chrome trace-event JSON (`*.trace.json.gz`, `perfetto_trace.json.gz`,
what jax.profiler and the torch profiler write beside an XSpace) into a Trace.

The JSON carries timelines but no HLO and no device peaks, so analysis of a
JSON trace has no roofline; it says so in its summary.

A well-formed file with odd events is read, not refused: an event whose
`ts`/`dur` is not a finite number in range, whose `pid`/`tid` is a list or
an object, whose `args` is not an object or whose `name` is not a string is
skipped and counted (`Trace.skipped`). Only a file with no usable complete
event is an error.
"""
from __future__ import annotations

import json
import math
import zlib

import numpy as np

from .host_model import HostBuilder, HostTimeline
from .trace_model import (Trace, _Builder, as_int64, count_skip, kind_of,
                          parse_bytes, plain_bytes, skip_warning, us_to_ns)
from .xspace_reader import TraceError

DEVICE_PREFIXES = ("/device:GPU:", "GPU ")     # jax: "/device:GPU:0"; torch/kineto: "GPU 0"
MAX_JSON_BYTES = 1 << 30                       # decompressed; a zip bomb stops here
_BAD = object()                                # an unusable pid/tid


def parse_chrome_trace(data: bytes, source: str = "<bytes>") -> Trace:
    if not data:
        raise TraceError(f"{source}: empty file")
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, source)
    doc = _load_json(data, source)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceError(f"{source}: no traceEvents array")
    skipped: dict[str, int] = {}
    procs: dict = {}
    threads: dict = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            what = e.get("name")
            if what != "process_name" and what != "thread_name":
                continue
            pid, tid, args = _id(e.get("pid")), _id(e.get("tid")), e.get("args")
            if pid is _BAD or tid is _BAD or not isinstance(args, (dict, type(None))):
                count_skip(skipped, "metadata events with a bad pid, tid or args")
                continue
            label = _text((args or {}).get("name", ""))
            if what == "process_name":
                procs[pid] = label
            else:
                threads[(pid, tid)] = label
    device_pids = {pid: name for pid, name in procs.items() if name.startswith(DEVICE_PREFIXES)}
    props = _device_properties(doc)
    builders = {}
    for pid, name in device_pids.items():
        index = name.split()[-1] if not name.startswith("/device") else name.rsplit(":", 1)[-1]
        builders[pid] = _Builder(name if name.startswith("/device") else f"/device:GPU:{index}", props.get(index, {}))
    host_rows: list[tuple] = []
    lo, hi = None, None
    for e in events:
        if not isinstance(e, dict):
            count_skip(skipped, "events that are not objects")
            continue
        if e.get("ph") != "X":
            continue
        ts, dur = us_to_ns(e.get("ts")), us_to_ns(e.get("dur", 0))
        if ts is None or dur is None:
            count_skip(skipped, "with a bad ts or dur")
            continue
        pid, tid, args, name = _id(e.get("pid")), _id(e.get("tid")), e.get("args"), e.get("name", "")
        if pid is _BAD or tid is _BAD:
            count_skip(skipped, "with a bad pid or tid")
            continue
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            count_skip(skipped, "with args that are not an object")
            continue
        if not isinstance(name, str):
            count_skip(skipped, "with a name that is not a string")
            continue
        lo = ts if lo is None else min(lo, ts)
        hi = ts + dur if hi is None else max(hi, ts + dur)
        b = builders.get(pid)
        if b is not None and e.get("cat") == "gpu_user_annotation":
            continue            # torch's record_function / ProfilerStep ranges drawn on the GPU row: not activity
        if b is not None:
            stream = threads.get((pid, tid), "")
            op = _text(args.get("hlo_op", ""))
            module = _text(args.get("program_id") or args.get("hlo_module") or "")
            details = _text(args.get("memcpy_details") or args.get("Memset_details") or args.get("bytes") or "")
            nbytes = parse_bytes(details) if ":" in details else plain_bytes(details)
            kind = kind_of(name if name.startswith(("Memcpy", "Memset")) else f"{stream} {name}", op)
            c = args.get("correlation_id", args.get("correlation", -1))
            b.add(ts, dur, kind, as_int64(tid), as_int64(c), name, (module, op) if op else None, nbytes)
        else:
            c = args.get("correlation_id", args.get("correlation"))
            host_rows.append(((pid, tid), ts, ts + dur, name, _NO_LAUNCH if c is None else as_int64(c)))
    if lo is None:
        why = f"; {sum(skipped.values())} unusable events skipped" if skipped else ""
        raise TraceError(f"{source}: no complete ('X') events with a usable ts and dur{why}")
    host = _host(host_rows, threads)
    warnings = ["trace-event JSON carries no HLO and no device peaks: ops are placed on the roofline by kernel "
                "name only (a JAX job's .xplane.pb has both)"]
    if not builders:
        warnings.append("no GPU device process: a CPU-only job, or device tracing was off")
    warnings += skip_warning(skipped)
    start_unix, hostnames = _origin(doc, lo)
    return Trace(source=source, format="chrome-json", devices=[b.build() for b in builders.values()], host=host,
                 start_ns=lo, end_ns=hi, warnings=warnings, skipped=skipped, start_unix_ns=start_unix,
                 hostnames=hostnames)


def _origin(doc, lo: int) -> tuple[int | None, list[str]]:
    """Kineto's `baseTimeNanoseconds` (what its `ts` microseconds count from)
    and `host_name`: the trace's wall-clock start and where it ran."""
    if not isinstance(doc, dict):
        return None, []
    base = doc.get("baseTimeNanoseconds")
    start = None
    if isinstance(base, int) and not isinstance(base, bool) and 0 < base and 0 < base + lo < (1 << 63):
        start = base + lo
    host = doc.get("host_name")
    return start, [host[:253]] if isinstance(host, str) and host else []


_NO_LAUNCH = -(1 << 63)          # not a launch (-1 is a launch whose id is unreadable)


def _host(rows: list[tuple], thread_names: dict) -> HostTimeline:
    """The host's events, indexed in bulk (one dict lookup per event, in C)."""
    hb = HostBuilder()
    if rows:
        keys, starts, ends, names, corrs = zip(*rows)
        n = len(rows)
        thread_of = {k: hb.thread_index(k, thread_names.get(k, "")) for k in dict.fromkeys(keys)}
        name_of = {k: hb.name_index(k) for k in dict.fromkeys(names)}
        hb.add_many(np.fromiter(map(thread_of.__getitem__, keys), np.int32, n), np.asarray(starts, np.int64),
                    np.asarray(ends, np.int64), np.fromiter(map(name_of.__getitem__, names), np.int32, n),
                    np.asarray(corrs, np.int64), _NO_LAUNCH)
    return hb.build()


def _device_properties(doc) -> dict[str, dict]:
    """Kineto's `deviceProperties` (torch traces): GPU index -> the props the
    analysis reads (name, compute capability, SMs). Anything odd is ignored:
    the trace's events do not depend on it."""
    out: dict[str, dict] = {}
    entries = doc.get("deviceProperties") if isinstance(doc, dict) else None
    for d in entries if isinstance(entries, list) else []:
        if not isinstance(d, dict) or isinstance(d.get("id"), bool) or not isinstance(d.get("id"), int):
            continue
        p: dict = {}
        if isinstance(d.get("name"), str):
            p["name"] = d["name"][:128]
        for key, prop in (("computeMajor", "cc_major"), ("computeMinor", "cc_minor"), ("numSms", "core_count")):
            v = d.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100_000:
                p[prop] = float(v)
        out[str(d["id"])] = p
    return out


def _gunzip(data: bytes, source: str) -> bytes:
    """Every gzip member, up to MAX_JSON_BYTES of output; bytes after the
    last member that are not another member are ignored (zero padding)."""
    out: list[bytes] = []
    total, rest = 0, data
    try:
        while rest[:2] == b"\x1f\x8b":
            d = zlib.decompressobj(wbits=31)
            chunk = rest
            while True:
                piece = d.decompress(chunk, MAX_JSON_BYTES + 1 - total)
                total += len(piece)
                out.append(piece)
                if total > MAX_JSON_BYTES:
                    raise TraceError(f"{source}: decompresses to more than {MAX_JSON_BYTES >> 20} MiB; "
                                     f"not a trace this reader takes whole")
                if d.eof or not d.unconsumed_tail:
                    break
                chunk = d.unconsumed_tail
            if not d.eof:
                raise TraceError(f"{source}: corrupt or truncated gzip (ends before the end of its stream)")
            rest = d.unused_data
    except zlib.error as exc:
        raise TraceError(f"{source}: corrupt or truncated gzip ({exc})") from None
    return b"".join(out)


def _load_json(data: bytes, source: str):
    try:
        try:
            return json.loads(data)
        except ValueError as exc:
            if "integer string conversion" not in str(exc):
                raise
            # An integer of thousands of digits: read it as a float (inf), which no field accepts.
            return json.loads(data, parse_int=lambda s: int(s) if len(s) < 100 else float(s))
    except RecursionError:
        raise TraceError(f"{source}: trace-event JSON nested too deeply to read") from None
    except ValueError as exc:       # UnicodeDecodeError included
        raise TraceError(f"{source}: not trace-event JSON ({exc})") from None


def _id(v):
    """A pid or tid as a dict key: ints, strings, finite floats and null pass;
    lists, objects, booleans and NaN are unusable."""
    if v is None or isinstance(v, (str, int)) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return v
    return _BAD


def _text(v) -> str:
    """A name or argument as text; lists and objects (never names) as ""."""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v) if not isinstance(v, int) or abs(v) < 10 ** 30 else ""
    return ""
