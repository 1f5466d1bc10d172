"""Calibrations agents send (`gpuscope calibrate --send`): checked here, at
the edge, before the store sees them, and turned into what the roofline uses.

A calibration is `Calibration.to_dict()` (collectors/calibrate.py) plus the
`gpu` block NVML gave (uuid, name) and the sender's versions. The store keeps
every one (history); the newest per GPU UUID is that GPU's current ceilings.
"""
from __future__ import annotations

import json
import math
from typing import Any

from gpuscope.collectors.calibrate import GPU_PLATFORMS, MATMUL_DTYPES, UNITS

# Each measurement's one unit: a matmul in FLOP/s, the rest as calibrate declares
UNIT_OF = dict(UNITS, **{f"matmul_{d}": "flop_per_second" for d in MATMUL_DTYPES})
KNOWN_UNITS = frozenset(UNIT_OF.values())
KNOWN_NAMES = frozenset(UNIT_OF)
# Past any device this decade can reach, by unit: a value above is a bug or a forgery, and stored
# it would be a GPU's ceiling for good (10x B200's HBM and dense FP8; launch latency under 10 ns)
PLAUSIBLE = {"bytes_per_second": (1e6, 1e14), "flop_per_second": (1e6, 1e17), "seconds": (1e-8, 10.0),
             "calls_per_second": (1.0, 1e9)}
FUTURE_SLACK_S = 86_400.0      # clocks disagree, but a run from tomorrow is not a run
MAX_NAME = 64            # a measurement's name
MAX_TEXT = 256           # host, uuid, model, versions, error
MAX_MEASUREMENTS = 64
MAX_CONDITIONS_BYTES = 16 << 10
CPU_PLATFORMS = ("cpu",)
PLATFORMS = tuple(GPU_PLATFORMS) + CPU_PLATFORMS
# Which measurements stand for the roofline's two peaks (the highest median of those present)
HBM_NAMES = ("hbm_triad", "hbm_copy")
MATMUL_PEAK = "matmul_bf16"


class CalibrationInvalid(ValueError):
    """A calibration the analyzer refuses; the message names the field."""


def _text(v: Any, field: str, required: bool = False) -> str | None:
    if v is None or v == "":
        if required:
            raise CalibrationInvalid(f"{field}: empty")
        return None
    if not isinstance(v, str):
        raise CalibrationInvalid(f"{field}: expected text, got {type(v).__name__}")
    if len(v) > MAX_TEXT:
        raise CalibrationInvalid(f"{field}: {len(v)} characters, at most {MAX_TEXT}")
    return v


def _number(v: Any, field: str, positive: bool = True) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CalibrationInvalid(f"{field}: {v!r} is not a finite number")
    if positive and v <= 0 or v < 0:
        raise CalibrationInvalid(f"{field}: {v!r}, expected {'> 0' if positive else '>= 0'}")
    return float(v)


def _plausible(v: Any, field: str, unit: str) -> float | None:
    x = _number(v, field)
    lo, hi = PLAUSIBLE[unit]
    if x is not None and not lo <= x <= hi:
        raise CalibrationInvalid(f"{field}: {x:g} {unit} is outside what any device reaches ({lo:g} to {hi:g})")
    return x


def parse_calibration(host: str, record: dict, received: float) -> tuple[dict, list[dict]]:
    """(the calibrations row, its ceilings rows) of one record; raises
    CalibrationInvalid naming the first bad field."""
    if not isinstance(record, dict):
        raise CalibrationInvalid("calibration: expected a JSON object")
    device, gpu = record.get("device") or {}, record.get("gpu") or {}
    if not isinstance(device, dict) or not isinstance(gpu, dict):
        raise CalibrationInvalid("device/gpu: expected objects")
    platform = _text(device.get("platform"), "device.platform", required=True)
    if platform not in PLATFORMS:
        raise CalibrationInvalid(f"device.platform: {platform[:MAX_NAME]!r}, expected one of {', '.join(PLATFORMS)}")
    uuid = _text(gpu.get("uuid"), "gpu.uuid", required=platform not in CPU_PLATFORMS)
    if platform in CPU_PLATFORMS:
        uuid = None          # a CPU's figures must never stand as (or replace) a GPU's
    index = gpu.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1024:
        raise CalibrationInvalid(f"gpu.index: {index!r}, expected 0-1023")
    cal = dict(host=_text(host, "host", required=True), gpu=index, uuid=uuid or f"{platform}:{host}:{index}",
               model=_text(gpu.get("name") or device.get("device_kind"), "gpu.name"),
               driver=_text(gpu.get("driver"), "gpu.driver"),
               cuda=_text(device.get("platform_version"), "device.platform_version"),
               jax=_text(device.get("jax"), "device.jax"), platform=platform,
               started_at=_number(record.get("started_at"), "started_at"),
               duration_s=_number(record.get("duration_s"), "duration_s", positive=False),
               quick=bool(record.get("quick")), forced=bool(record.get("forced")), received=received)
    if cal["started_at"] is None:
        raise CalibrationInvalid("started_at: missing")
    if cal["started_at"] > received + FUTURE_SLACK_S:
        raise CalibrationInvalid(f"started_at: {cal['started_at']!r} is in the future (the analyzer's clock: "
                                 f"{received:.0f}); check the sender's clock")
    ms = record.get("measurements")
    if not isinstance(ms, list) or not ms:
        raise CalibrationInvalid("measurements: expected a non-empty list")
    if len(ms) > MAX_MEASUREMENTS:
        raise CalibrationInvalid(f"measurements: {len(ms)}, at most {MAX_MEASUREMENTS}")
    rows = []
    for i, m in enumerate(ms):
        where = f"measurements[{i}]"
        if not isinstance(m, dict):
            raise CalibrationInvalid(f"{where}: expected an object")
        name = _text(m.get("name"), f"{where}.name", required=True)
        if len(name) > MAX_NAME or name not in KNOWN_NAMES:
            raise CalibrationInvalid(f"{where}.name: {name[:MAX_NAME]!r} is not a known measurement")
        if any(r["name"] == name for r in rows):
            raise CalibrationInvalid(f"{where}.name: {name!r} is measured twice in one calibration")
        unit = _text(m.get("unit"), f"{where}.unit", required=True)
        if unit != UNIT_OF[name]:
            raise CalibrationInvalid(f"{where}.unit: {unit[:MAX_NAME]!r}, {name} is in {UNIT_OF[name]}")
        repeats = m.get("repeats", 0)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or not 0 <= repeats < 1_000_000:
            raise CalibrationInvalid(f"{where}.repeats: {repeats!r}")
        conditions = m.get("conditions") or {}
        if not isinstance(conditions, dict):
            raise CalibrationInvalid(f"{where}.conditions: expected an object")
        text = json.dumps(conditions, allow_nan=False, default=str) if conditions else None
        if text and len(text) > MAX_CONDITIONS_BYTES:
            raise CalibrationInvalid(f"{where}.conditions: {len(text)} bytes, at most {MAX_CONDITIONS_BYTES}")
        rows.append(dict(uuid=cal["uuid"], host=cal["host"], gpu=index, name=name, unit=unit,
                         value=_plausible(m.get("value"), f"{where}.value", unit),
                         best=_plausible(m.get("best"), f"{where}.best", unit),
                         spread=_number(m.get("spread"), f"{where}.spread", positive=False),
                         repeats=repeats, conditions=text, error=_text(m.get("error"), f"{where}.error")))
    return cal, rows


def peaks_from(ceilings: list[dict]) -> tuple[float | None, float | None]:
    """(HBM bytes/s, BF16 matmul FLOP/s) from one calibration's ceilings rows."""
    by = {r["name"]: r["value"] for r in ceilings if r.get("value")}
    hbm = [by[n] for n in HBM_NAMES if n in by]
    return (max(hbm) if hbm else None), by.get(MATMUL_PEAK)
