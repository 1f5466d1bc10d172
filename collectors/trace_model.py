"""A profiler trace, reduced to what analysis needs, independent of the file
format it came from (XSpace protobuf or Chrome trace-event JSON).

Times are nanoseconds from the trace's own origin; `start_unix_ns` maps them
to wall time when the file says (XSpace's "Task Environment" plane).

Readers never trust a file's numbers: an event whose time or duration is not
a finite number in [0, MAX_TIME_NS] is skipped and counted in
`Trace.skipped`, so that every time, end and difference of times fits int64
and no arithmetic on a timeline can overflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .host_model import HostTimeline

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_TIME_NS = (1 << 62) - 1      # ~146 years: a start or a duration beyond it is not a clock's; start + dur fits int64
MAX_BYTES = float(1 << 60)       # 1 EiB: a byte count beyond it is not a transfer's

KERNEL, MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D, MEMCPY_P2P, MEMSET, COLLECTIVE = range(7)
KIND_NAMES = ("kernel", "memcpy_h2d", "memcpy_d2h", "memcpy_d2d", "memcpy_p2p", "memset", "collective")
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                  "collective-broadcast", "send", "recv")


@dataclass
class DeviceTimeline:
    """Every activity of one GPU: kernels, copies, memsets, collectives."""
    name: str                          # "/device:GPU:0"
    props: dict[str, float | str]      # device name, memory_bandwidth (B/s), core_count, clock_rate_hz, compute_cap
    start_ns: np.ndarray               # int64
    dur_ns: np.ndarray                 # int64
    kind: np.ndarray                   # int8, see KIND_NAMES
    stream: np.ndarray                 # int64
    correlation: np.ndarray            # int64, -1 when unknown
    name_idx: np.ndarray               # int32 into names
    names: list[str]                   # kernel / activity names
    op_idx: np.ndarray                 # int32 into ops, -1 when unknown
    ops: list[tuple[str, str]]         # (program key, HLO instruction name)
    bytes: np.ndarray                  # float64, NaN unless the event says (copies)

    def __len__(self) -> int:
        return len(self.start_ns)


@dataclass
class Trace:
    source: str
    format: str                        # "xplane" or "chrome-json"
    devices: list[DeviceTimeline]
    host: HostTimeline
    start_ns: int                      # trace origin .. end, over every event
    end_ns: int
    start_unix_ns: int | None = None
    hostnames: list[str] = field(default_factory=list)
    programs: dict[str, bytes] = field(default_factory=dict)   # program key -> serialized HloProto
    warnings: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)     # why -> events left out as unusable

    @property
    def span_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def skipped_events(self) -> int:
        return sum(self.skipped.values())


def kind_of(stream_or_name: str, hlo_op: str = "") -> int:
    """Classify an activity from its stream or event name and its HLO op."""
    s = stream_or_name
    if "MemcpyH2D" in s or "Memcpy HtoD" in s:
        return MEMCPY_H2D
    if "MemcpyD2H" in s or "Memcpy DtoH" in s:
        return MEMCPY_D2H
    if "MemcpyP2P" in s or "Memcpy PtoP" in s:
        return MEMCPY_P2P
    if "MemcpyD2D" in s or "Memcpy DtoD" in s:
        return MEMCPY_D2D
    if s.startswith("Memset"):
        return MEMSET
    low = s.lower()
    if "nccl" in low or "rccl" in low or hlo_op.startswith(COLLECTIVE_OPS):
        return COLLECTIVE
    return KERNEL


class _Builder:
    """Accumulates one device's events before they become arrays."""

    def __init__(self, name: str, props: dict):
        self.name, self.props = name, props
        self.cols: dict[str, list] = {k: [] for k in ("start", "dur", "kind", "stream", "corr", "name", "op", "bytes")}
        self.names: dict[str, int] = {}
        self.ops: dict[tuple[str, str], int] = {}

    def add(self, start: int, dur: int, kind: int, stream: int, corr: int, name: str,
            op: tuple[str, str] | None, nbytes: float) -> None:
        c = self.cols
        c["start"].append(start)
        c["dur"].append(dur)
        c["kind"].append(kind)
        c["stream"].append(stream)
        c["corr"].append(corr)
        c["name"].append(self.names.setdefault(name, len(self.names)))
        c["op"].append(self.ops.setdefault(op, len(self.ops)) if op else -1)
        c["bytes"].append(nbytes)

    def build(self) -> DeviceTimeline:
        c = self.cols
        order = np.argsort(np.asarray(c["start"], dtype=np.int64), kind="stable")
        arr = lambda k, dt: np.asarray(c[k], dtype=dt)[order] if c[k] else np.empty(0, dt)  # noqa: E731
        return DeviceTimeline(self.name, self.props, arr("start", np.int64), arr("dur", np.int64),
                              arr("kind", np.int8), arr("stream", np.int64), arr("corr", np.int64),
                              arr("name", np.int32), list(self.names), arr("op", np.int32), list(self.ops),
                              arr("bytes", np.float64))


def parse_bytes(details: str) -> float:
    """The byte count inside memcpy/memset details -> float; NaN if absent or
    not a plausible byte count. CUPTI's XSpace writes `size:268435456`
    (`kind_src:pinned kind_dst:device size:268435456 ...`), older writers
    `num_bytes:268435456`."""
    for key in ("num_bytes:", "size:"):
        i = details.find(key)
        while i > 0 and details[i - 1] not in " ,;{":     # a whole key, not the end of another
            i = details.find(key, i + 1)
        if i < 0:
            continue
        j = i + len(key)
        k = j
        while k < len(details) and "0" <= details[k] <= "9":     # ASCII only: str.isdigit() admits '²'
            k += 1
        return plain_bytes(details[j:k])
    return float("nan")


def plain_bytes(text: str) -> float:
    """A byte count written as plain ASCII digits -> float; NaN otherwise."""
    if not text or len(text) > 19 or not text.isascii() or not text.isdigit():
        return float("nan")
    n = float(text)
    return n if n <= MAX_BYTES else float("nan")


def as_int64(v, default: int = -1) -> int:
    """An id a file gives (correlation id, stream, tid) as an int64, or
    `default` when it is not one: lists, NaN, 1e300 and "abc" all say unknown."""
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v if INT64_MIN <= v <= INT64_MAX else default
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and INT64_MIN <= v < INT64_MAX else default
    if isinstance(v, (str, bytes)) and len(v) <= 32:
        try:
            return as_int64(int(v), default)
        except ValueError:
            return default
    return default


def us_to_ns(v) -> int | None:
    """A trace-event time or duration (microseconds; a number or a numeric
    string) -> integer nanoseconds, or None unless it is finite and within
    [0, MAX_TIME_NS]."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        if not 0 <= v <= MAX_TIME_NS // 1000:
            return None
        f = float(v)
    elif isinstance(v, float):
        f = v
    elif isinstance(v, str) and len(v) <= 64:
        try:
            f = float(v)
        except ValueError:
            return None
    else:
        return None
    ns = f * 1000
    return int(ns) if 0 <= ns <= MAX_TIME_NS else None      # NaN fails both comparisons


def count_skip(skipped: dict[str, int], why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


def skip_warning(skipped: dict[str, int]) -> list[str]:
    """One warning that says how many events were left out, and why."""
    if not skipped:
        return []
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1]))
    return [f"skipped {sum(skipped.values())} unusable events ({why})"]
