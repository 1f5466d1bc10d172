"""Reads what `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] -l 1`
writes, the log a GPU host already has, into a Recording.

    timestamp, index, utilization.gpu [%], utilization.memory [%], power.draw [W], clocks.sm [MHz]
    2026/11/30 12:00:00.123, 0, 95 %, 20 %, 650.12 W, 1980 MHz

The header names the fields (with `nounits`, without their `[unit]`); values
carry their unit unless `nounits`; `[N/A]`, `[Not Supported]` and the like
are missing values. `timestamp` is local time, as nvidia-smi prints it; a
file without it cannot be placed in time and is refused. Fields gpuscope
has no metric for are listed as ignored. A file without a header
(`noheader`) cannot be read: its columns are not named.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path

from . import catalogue as cat

# query-gpu field -> catalogue metric; the scale takes the unit nvidia-smi prints to ours
FIELDS: dict[str, str] = {
    "utilization.gpu": "util_gpu_ratio", "utilization.memory": "util_mem_ratio",
    "memory.used": "mem_used_bytes", "memory.total": "mem_total_bytes",
    "power.draw": "power_watts", "power.draw.average": "power_watts", "power.draw.instant": "power_instant_watts",
    "power.limit": "power_limit_watts", "enforced.power.limit": "power_limit_watts",
    "clocks.sm": "sm_clock_hertz", "clocks.current.sm": "sm_clock_hertz",
    "clocks.mem": "mem_clock_hertz", "clocks.current.memory": "mem_clock_hertz",
    "temperature.gpu": "temp_celsius", "temperature.memory": "mem_temp_celsius",
    "clocks_event_reasons.active": "clock_event_reasons", "clocks_throttle_reasons.active": "clock_event_reasons",
}
UNITS = {"%": 0.01, "W": 1.0, "mW": 1e-3, "MHz": 1e6, "GHz": 1e9, "KiB": 1024.0, "MiB": 2.0 ** 20,
         "GiB": 2.0 ** 30, "B": 1.0, "C": 1.0, "": 1.0}
DEFAULT_UNIT = {"ratio": "%", "bytes": "MiB", "watts": "W", "hertz": "MHz", "celsius": "C", "bitmask": ""}
_HEAD = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(?:\[([^\]]*)\])?\s*$")
_VALUE = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|0x[0-9a-fA-F]+)\s*([A-Za-z%]*)\s*$")


def looks_like(header: list[str]) -> bool:
    """Whether a CSV header is nvidia-smi's (query-gpu field names)."""
    names = {m.group(1) for h in header if (m := _HEAD.match(h))}
    return "timestamp" in names and bool(names & (set(FIELDS) | {"index", "uuid", "pci.bus_id"}))


def read(path: Path, header: list[str], rows, error, warn=lambda message: None):
    """(t, gpu, {metric: values}, ignored columns) from the rows after the
    header; `error(message)` raises the caller's error, `warn(message)`
    tells of the last line dropped."""
    layout = _Layout(path, header, 1, error)
    t, gpu, out = [], [], {m.name: [] for _, m, _ in layout.columns}
    ids: dict[str, int] = {}
    lines = _lines(rows)
    ahead = next(lines, None)
    while ahead is not None:
        (line, row), ahead = ahead, next(lines, None)
        where = f"{path}:{line}"
        if _is_header(row):
            # `nvidia-smi ... >> gpus.csv` run again writes its header again: the same fields read on
            # (in the new header's units: one run may have had nounits); other fields are another log
            again = _Layout(path, [c.strip() for c in row], line, error)
            if sorted(again.names) != sorted(layout.names):
                error(f"{where}: a header with other fields than line 1's ({_difference(layout, again)}): two "
                      f"different logs appended into one file? Split it where the header changes")
            layout = again
            continue
        # Only the last line may be cut short (nvidia-smi -l killed mid-write): it is dropped and said,
        # unless it is the only one. Anywhere else a bad line is an error.
        last = ahead is None and bool(t)
        try:
            sample = _sample(row, layout, where, _cut if last else error, ids)
        except _Cut as exc:
            warn(f"{exc}: the last line, cut short (nvidia-smi stopped mid-write?), was dropped")
            break
        t.append(sample[0])
        if sample[1] is not None:
            gpu.append(sample[1])
        for name, v in sample[2]:
            out[name].append(v)
    return t, gpu, out, layout.ignored


def _lines(rows):
    """(line number, row) of the rows that are not blank; the header is line 1."""
    for line, row in enumerate(rows, start=2):
        if row and not (len(row) == 1 and not row[0].strip()):
            yield line, row


def _sample(row: list[str], layout: "_Layout", where: str, error, ids: dict) -> tuple:
    """(time, GPU or None, [(metric, value)]) of one row."""
    if len(row) != len(layout.names):
        error(f"{where}: {len(row)} cells where the header has {len(layout.names)} (truncated or garbled row)")
    ts = _time(row[layout.ti], where, error)
    gpu = None
    if layout.gi is not None:
        cell = row[layout.gi].strip()
        if not cell.isdecimal():
            error(f"{where}, column index: {cell!r} is not a GPU index")
        gpu = int(cell)
    elif layout.ui is not None:
        gpu = ids.setdefault(row[layout.ui].strip(), len(ids))
    values = [(m.name, _value(row[i], unit, m, f"{where}, column {layout.names[i]}", error))
              for i, m, unit in layout.columns]
    return ts, gpu, values


class _Cut(Exception):
    pass


def _cut(message: str):
    raise _Cut(message)


class _Layout:
    """What a header says: which column is the time, the GPU, and each metric (in which unit)."""

    def __init__(self, path: Path, header: list[str], line: int, error):
        fields = []
        for i, h in enumerate(header):
            m = _HEAD.match(h)
            if m is None:
                error(f"{path}:{line}: column {i + 1} {h!r} is not an nvidia-smi field name")
            fields.append((m.group(1), m.group(2)))
        self.names = [f for f, _ in fields]
        self.ti = self.names.index("timestamp")
        self.gi = self.names.index("index") if "index" in self.names else None
        self.ui = next((self.names.index(k) for k in ("uuid", "pci.bus_id") if k in self.names), None)
        self.columns, self.ignored = [], []
        taken = set()
        for i, (name, unit) in enumerate(fields):
            metric = FIELDS.get(name)
            if metric is not None and metric not in taken:       # the first of two fields for one metric
                taken.add(metric)
                self.columns.append((i, cat.BY_NAME[metric], unit))
            elif i not in (self.ti, self.gi, self.ui):
                self.ignored.append(name)


def _is_header(row: list[str]) -> bool:
    """A row of field names with `timestamp` among them (a data row has a time there)."""
    cells = [c.strip() for c in row]
    return "timestamp" in cells and all(_HEAD.match(c) for c in cells)


def _difference(first: _Layout, again: _Layout) -> str:
    added = [n for n in again.names if n not in first.names]
    gone = [n for n in first.names if n not in again.names]
    return "; ".join(p for p in (f"added {', '.join(added)}" if added else "",
                                 f"without {', '.join(gone)}" if gone else "") if p)


def _time(cell: str, where: str, error) -> float:
    text = cell.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            parsed = time.strptime(text, fmt)
        except ValueError:
            continue
        frac = float("0." + text.rsplit(".", 1)[1]) if fmt.endswith("%f") else 0.0
        return time.mktime(parsed) + frac
    error(f"{where}, column timestamp: {cell!r} is not nvidia-smi's time (YYYY/MM/DD HH:MM:SS.mmm)")


def _value(cell: str, header_unit: str | None, m: cat.Metric, where: str, error) -> float:
    text = cell.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return math.nan                     # [N/A], [Not Supported], [Unknown Error], ...
    v = _VALUE.match(text)
    if v is None:
        error(f"{where}: {cell.strip()!r} is not a number")
    number, unit = v.group(1), v.group(2) or (header_unit or "") or DEFAULT_UNIT.get(m.unit, "")
    if unit not in UNITS:
        error(f"{where}: unit {unit!r} of {cell.strip()!r} is not one nvidia-smi prints for {m.name}")
    x = float(int(number, 16)) if number.startswith("0x") else float(number)
    return x * UNITS[unit]
