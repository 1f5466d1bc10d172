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

import csv
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


def read(path: Path, header: list[str], rows, error):
    """(t, gpu, {metric: values}, ignored columns) from the rows after the
    header; `error(message)` raises the caller's error."""
    fields = []
    for i, h in enumerate(header):
        m = _HEAD.match(h)
        if m is None:
            error(f"{path}: column {i + 1} {h!r} is not an nvidia-smi field name")
        fields.append((m.group(1), m.group(2)))
    names = [f for f, _ in fields]
    ti = names.index("timestamp")
    gi = names.index("index") if "index" in names else None
    ui = next((names.index(k) for k in ("uuid", "pci.bus_id") if k in names), None)
    columns, ignored = [], []
    for i, (name, unit) in enumerate(fields):
        metric = FIELDS.get(name)
        if metric is not None and metric not in (cat.BY_NAME[FIELDS[n]].name for n, _ in fields[:i] if n in FIELDS):
            columns.append((i, cat.BY_NAME[metric], unit))
        elif i not in (ti, gi, ui):
            ignored.append(name)
    t, gpu, out = [], [], {m.name: [] for _, m, _ in columns}
    ids: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{path}:{line}"
        if len(row) != len(header):
            error(f"{where}: {len(row)} cells where the header has {len(header)} (truncated or garbled row)")
        t.append(_time(row[ti], where, error))
        if gi is not None:
            cell = row[gi].strip()
            if not cell.isdecimal():
                error(f"{where}, column index: {cell!r} is not a GPU index")
            gpu.append(int(cell))
        elif ui is not None:
            gpu.append(ids.setdefault(row[ui].strip(), len(ids)))
        for i, m, unit in columns:
            out[m.name].append(_value(row[i], unit, m, f"{where}, column {fields[i][0]}", error))
    return t, gpu, out, ignored


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
