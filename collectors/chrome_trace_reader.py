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

from .host_model import HostBuilder
from .trace_events import BAD_ARGS, Args, Meta, decode_kineto_gzip, decode_tolerant, decode_typed
from .trace_model import (MAX_TIME_NS, Trace, _Builder, as_int64, count_skip, kind_of,
                          parse_bytes, plain_bytes, skip_warning, us_to_ns)
from .xspace_reader import TraceError

DEVICE_PREFIXES = ("/device:GPU:", "GPU ")     # jax: "/device:GPU:0"; torch/kineto: "GPU 0"
MAX_JSON_BYTES = 1 << 30                       # decompressed; a zip bomb stops here
_BAD = object()                                # an unusable pid/tid
_NO_ARGS = Args()


def parse_chrome_trace(data: bytes, source: str = "<bytes>") -> Trace:
    if not data:
        raise TraceError(f"{source}: empty file")
    try:
        return _parse(data, source)
    except (RecursionError, OverflowError) as exc:      # a value no check foresaw: the file's fault, said so
        raise TraceError(f"{source}: unreadable trace ({type(exc).__name__}: {str(exc)[:200]})") from None


def _parse(data: bytes, source: str) -> Trace:
    meta = None
    if data[:2] == b"\x1f\x8b":
        events = _Events()
        try:
            meta = decode_kineto_gzip(data, MAX_JSON_BYTES, lambda: _too_big(source), events.add)
        except zlib.error as exc:
            raise TraceError(f"{source}: corrupt or truncated gzip ({exc})") from None
        if meta is None:
            data = _gunzip(data, source)
    if meta is None:
        events = _Events()                      # what a sliced read took is dropped
        decoded, typed = decode_typed(data), True
        if decoded is None:
            decoded, typed = decode_tolerant(_load_json(data, source)), False
        if decoded is None:
            raise TraceError(f"{source}: no traceEvents array")
        events.add(decoded[0], typed)
        meta = decoded[1]
    return events.trace(meta, source)


_NOT_SET = -(1 << 63) + 1        # a correlation id the event does not give
# Kineto categories that are not a thread's work: the interpreter's own frames (the outermost spans the
# whole capture) and the profiler's span of itself ("PyTorch Profiler (0)", on a thread of its own)
_NOT_WORK = frozenset(("python_function", "Trace"))
_TIME_LIMIT = float(MAX_TIME_NS + 1)      # 2**62: a float below it is at most MAX_TIME_NS


class _Events:
    """A trace's events, taken a slice at a time into columns: a slice's
    structs are dropped once read, and a clean slice is read with a few
    passes in C rather than a Python loop per event. A slice with anything
    odd in it is read event by event, each odd event skipped and counted."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}
        self.procs: dict = {}
        self.gpu_labels: dict = {}               # pid -> "GPU N" from process_labels
        self.threads: dict = {}                 # (pid, tid) -> thread name
        self.keys: dict[tuple, int] = {}        # (pid, tid) -> index
        self.names: dict[str, int] = {}
        self.pid_no: dict = {}
        self.tid_no: dict = {}
        # thread, start, end, name, corr, on-GPU annotation, not work (_NOT_WORK)
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.args: list[list] = []              # each slice's args (a device event's are read once devices are known)
        self.n = 0

    def add(self, events: list, typed: bool = False) -> None:
        """One slice; `typed`: TypedEvents, whose types msgspec checked."""
        if not typed:                    # a tolerant read marks events that are not objects with None
            bad = sum(1 for e in events if e is None)
            if bad:
                self.skipped["events that are not objects"] = self.skipped.get("events that are not objects", 0) + bad
                events = [e for e in events if e is not None]
        for e in [e for e in events if e.ph == "M"]:
            self._meta(e)
        xs = [e for e in events if e.ph == "X"]
        if xs and not self._columns(xs, typed):
            self._one_by_one(xs)

    def _meta(self, e) -> None:
        what = e.name
        if what not in ("process_name", "thread_name", "process_labels"):
            return
        pid, tid, args = _id(e.pid), _id(e.tid), e.args
        if pid is _BAD or tid is _BAD or args is BAD_ARGS:
            count_skip(self.skipped, "metadata events with a bad pid, tid or args")
            return
        if what == "process_labels":
            # Recent Kineto names every process "python" and says which is a
            # GPU only here ("GPU 0"); older ones put "GPU 0" in the name.
            label = _text(args.labels if args is not None else "")
            if label.startswith("GPU "):
                self.gpu_labels[pid] = label
            return
        label = _text(args.name if args is not None else "")
        if what == "process_name":
            self.procs[pid] = label
        else:
            self.threads[(pid, tid)] = label

    def _columns(self, xs: list, typed: bool) -> bool:
        """A clean slice in bulk; False (nothing taken) if any event is odd."""
        ts, dur = [e.ts for e in xs], [e.dur for e in xs]
        pids, tids, names = [e.pid for e in xs], [e.tid for e in xs], [e.name for e in xs]
        args = [e.args for e in xs]
        if not typed and (not {*map(type, ts), *map(type, dur)} <= {float, int}
                          or not {*map(type, pids), *map(type, tids)} <= {int, str}
                          or not set(map(type, names)) <= {str} or any(a is BAD_ARGS for a in args)):
            return False
        try:
            with np.errstate(invalid="ignore", over="ignore"):
                start, length = np.array(ts, np.float64) * 1000, np.array(dur, np.float64) * 1000
        except (OverflowError, TypeError, ValueError):    # an int of hundreds of digits: one by one
            return False
        # as us_to_ns: at most MAX_TIME_NS, compared exactly (2**62 - 1 as a float is 2**62)
        if not ((start >= 0) & (start < _TIME_LIMIT) & (length >= 0) & (length < _TIME_LIMIT)).all():
            return False
        start = start.astype(np.int64)
        corr = [_NOT_SET if a is None else a.correlation_id if a.correlation_id is not None
                else a.correlation if a.correlation is not None else _NOT_SET for a in args]
        try:
            if not set(map(type, corr)) <= {int}:
                raise TypeError
            corr = np.array(corr, np.int64)
        except (TypeError, OverflowError):   # ids as text, floats, past int64: one by one, as as_int64 reads them
            corr = np.array([c if c == _NOT_SET else as_int64(c) for c in corr], np.int64)
        cats = [e.cat for e in xs]
        self._take(pids, tids, start, start + length.astype(np.int64), names, corr,
                   np.array([c == "gpu_user_annotation" for c in cats], bool),
                   np.array([c in _NOT_WORK for c in cats], bool), args)
        return True

    def _one_by_one(self, xs: list) -> None:
        rows = []
        for e in xs:
            ts, dur = us_to_ns(e.ts), us_to_ns(e.dur)
            if ts is None or dur is None:
                count_skip(self.skipped, "with a bad ts or dur")
                continue
            pid, tid, args, name = _id(e.pid), _id(e.tid), e.args, e.name
            if pid is _BAD or tid is _BAD:
                count_skip(self.skipped, "with a bad pid or tid")
                continue
            if args is BAD_ARGS:
                count_skip(self.skipped, "with args that are not an object")
                continue
            if not isinstance(name, str):
                count_skip(self.skipped, "with a name that is not a string")
                continue
            c = _NOT_SET if args is None else _first_set(args.correlation_id, args.correlation, _NOT_SET)
            rows.append((pid, tid, ts, ts + dur, name, c if c == _NOT_SET else as_int64(c),
                         e.cat == "gpu_user_annotation", e.cat in _NOT_WORK, args))
        if rows:
            pids, tids, start, end, names, corr, annot, frame, args = zip(*rows)
            self._take(list(pids), list(tids), np.array(start, np.int64), np.array(end, np.int64), list(names),
                       np.array(corr, np.int64), np.array(annot, bool), np.array(frame, bool), list(args))

    def _take(self, pids, tids, start, end, names, corr, annot, frame, args) -> None:
        # a thread is a (pid, tid) pair: numbered through the distinct pairs, not a tuple per event
        p, t = _numbered(pids, self.pid_no), _numbered(tids, self.tid_no)
        pairs, first, inverse = np.unique((p.astype(np.int64) << 32) | t, return_index=True, return_inverse=True)
        pid_of, tid_of = list(self.pid_no), list(self.tid_no)
        number = np.empty(len(pairs), np.int32)
        for k in np.argsort(first, kind="stable").tolist():     # numbered as they first appear, as one by one
            c = int(pairs[k])
            number[k] = self.keys.setdefault((pid_of[c >> 32], tid_of[c & 0xFFFFFFFF]), len(self.keys))
        self.args.append(args)
        self.parts.append((number[inverse.ravel()], start, end, _numbered(names, self.names), corr, annot, frame))
        self.n += len(pids)

    def trace(self, meta: Meta, source: str) -> Trace:
        device_pids = {**self.gpu_labels,
                       **{pid: name for pid, name in self.procs.items() if name.startswith(DEVICE_PREFIXES)}}
        props = _device_properties(meta.deviceProperties)
        builders = {}
        # Kineto labels a process for every GPU index it could see (16 on a one-GPU host); the GPUs that
        # exist are in deviceProperties: a labelled one that is neither there nor active is not a GPU
        active = {k[0] for k in self.keys}
        for pid, name in device_pids.items():
            index = name.split()[-1] if not name.startswith("/device") else name.rsplit(":", 1)[-1]
            if props and index not in props and pid not in active:
                continue
            builders[pid] = _Builder(name if name.startswith("/device") else f"/device:GPU:{index}",
                                     props.get(index, {}))
        if not self.parts:
            why = f"; {sum(self.skipped.values())} unusable events skipped" if self.skipped else ""
            raise TraceError(f"{source}: no complete ('X') events with a usable ts and dur{why}")
        thread, start, end, name, corr, annot, frame = (np.concatenate(c) for c in zip(*self.parts))
        keys = list(self.keys)
        on_device = np.array([k[0] in builders for k in keys], bool)[thread]
        names = list(self.names)
        args = [a for part in self.args for a in part] if on_device.any() else []
        for i in np.flatnonzero(on_device & ~annot).tolist():
            pid, tid = keys[thread[i]]
            a = args[i] or _NO_ARGS
            n = names[name[i]]
            op = _text(a.hlo_op)
            module = _text(a.program_id or a.hlo_module or "")
            details = _text(a.memcpy_details or a.Memset_details or a.bytes or "")
            nbytes = parse_bytes(details) if ":" in details else plain_bytes(details)
            stream = self.threads.get((pid, tid), "")
            kind = kind_of(n if n.startswith(("Memcpy", "Memset")) else f"{stream} {n}", op)
            c = int(corr[i])
            builders[pid].add(int(start[i]), int(end[i] - start[i]), kind, as_int64(tid), -1 if c == _NOT_SET else c,
                              n, (module, op) if op else None, nbytes)
        host = ~on_device
        hb = HostBuilder()
        thread_of = np.array([hb.thread_index(k, self.threads.get(k, "")) if not (k[0] in builders) else -1
                              for k in keys], np.int32)
        name_of = np.full(len(names), -1, np.int32)
        for i in dict.fromkeys(name[host].tolist()):        # first seen first, as the host builder numbers them
            name_of[i] = hb.name_index(names[i])
        h_corr = corr[host]
        hb.add_many(thread_of[thread[host]], start[host], end[host], name_of[name[host]],
                    np.where(h_corr == _NOT_SET, _NO_LAUNCH, h_corr), _NO_LAUNCH, frame[host])
        warnings = ["trace-event JSON carries no HLO and no device peaks: ops are placed on the roofline by kernel "
                    "name only (a JAX job's .xplane.pb has both)"]
        if not builders:
            warnings.append("no GPU device process: a CPU-only job, or device tracing was off")
        warnings += skip_warning(self.skipped)
        lo, hi = int(start.min()), int(end.max())
        start_unix, hostnames = _origin(meta, lo)
        return Trace(source=source, format="chrome-json", devices=[b.build() for b in builders.values()],
                     host=hb.build(), start_ns=lo, end_ns=hi, warnings=warnings, skipped=self.skipped,
                     start_unix_ns=start_unix, hostnames=hostnames)


def _origin(meta: Meta, lo: int) -> tuple[int | None, list[str]]:
    """Kineto's `baseTimeNanoseconds` (what its `ts` microseconds count from)
    and `host_name`: the trace's wall-clock start and where it ran."""
    base = meta.baseTimeNanoseconds
    start = None
    if isinstance(base, int) and not isinstance(base, bool) and 0 < base and 0 < base + lo < (1 << 63):
        start = base + lo
    host = meta.host_name
    return start, [host[:253]] if isinstance(host, str) and host else []


_NO_LAUNCH = -(1 << 63)          # not a launch (-1 is a launch whose id is unreadable)


def _device_properties(entries) -> dict[str, dict]:
    """Kineto's `deviceProperties` (torch traces): GPU index -> the props the
    analysis reads (name, compute capability, SMs). Anything odd is ignored:
    the trace's events do not depend on it."""
    out: dict[str, dict] = {}
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


def _numbered(values: list, numbers: dict) -> np.ndarray:
    """Each value's number in `numbers` (new values numbered as they come)."""
    for v in dict.fromkeys(values):
        numbers.setdefault(v, len(numbers))
    return np.fromiter(map(numbers.__getitem__, values), np.int32, len(values))


def _too_big(source: str) -> TraceError:
    return TraceError(f"{source}: decompresses to more than {MAX_JSON_BYTES >> 20} MiB; "
                      f"not a trace this reader takes whole")


def _first_set(*values):
    return next((v for v in values if v is not None), values[-1])


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
                    raise _too_big(source)
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
