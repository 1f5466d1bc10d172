"""Validation and decoding of SampleBatch messages into Arrow tables.

Every check names the field at fault, so an agent operator can find the bug
from the INVALID_ARGUMENT message alone. Decoding is zero-copy where the wire
allows: the f64le columns and LSB-first validity bitmaps are Arrow's own
buffer layout.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from gpuscope.collectors import catalogue as cat
from gpuscope.v1 import samples_pb2 as pb

MAX_BATCH_SAMPLES = 200_000
MAX_FUTURE_SKEW_S = 120.0       # agent clocks ahead of ours by more than this: reject
RATIO_CEILING = 1.5             # GPM ratios may overshoot 1 a little; 1.5 is garbage
METRIC_NAMES = cat.NAMES
_HEALTH_NAMES = {v: k.removeprefix("HEALTH_KIND_").lower() for k, v in pb.HealthKind.items()}


class BatchError(ValueError):
    """An invalid batch; str() names the field."""


@dataclass
class DecodedBatch:
    host: str
    boot_id: str
    seq: int
    count: int
    samples: pa.Table                     # host, gpu, t, and the catalogue metrics the batch carries
    t: np.ndarray
    gpu: np.ndarray
    columns: dict[str, np.ndarray]        # metric -> float64, NaN = missing
    processes: pa.Table | None
    devices: list[pb.Device]
    health: list[tuple]                   # rows for the health table
    dropped_samples: int = 0
    job: dict[int, str] = field(default_factory=dict)   # gpu -> job of its last sample


def _array(name: str, data: bytes, itemsize: int, n: int, dtype: str) -> np.ndarray:
    if len(data) != n * itemsize:
        raise BatchError(f"{name}: {len(data)} bytes, expected {n * itemsize} for count={n}")
    return np.frombuffer(data, dtype=dtype)


def decode(batch: pb.SampleBatch, now: float | None = None) -> DecodedBatch:
    now = time.time() if now is None else now
    if not batch.host:
        raise BatchError("host: empty")
    if not batch.boot_id:
        raise BatchError("boot_id: empty")
    if batch.seq < 1:
        raise BatchError("seq: must be >= 1")
    n = batch.count
    if n > MAX_BATCH_SAMPLES:
        raise BatchError(f"count: {n} samples, at most {MAX_BATCH_SAMPLES} per batch")
    t = _array("t_f64le", batch.t_f64le, 8, n, "<f8")
    gpu = _array("gpu_u32le", batch.gpu_u32le, 4, n, "<u4")
    if n:
        if not np.isfinite(t).all() or (t <= 0).any():
            i = int(np.flatnonzero(~np.isfinite(t) | (t <= 0))[0])
            raise BatchError(f"t_f64le[{i}]: {float(t[i])!r} is not a Unix time")
        if t.max() > now + MAX_FUTURE_SKEW_S:
            i = int(t.argmax())
            raise BatchError(f"t_f64le[{i}]: {t[i]:.3f} is {t[i] - now:.0f} s in the future "
                             "(check the agent host's clock)")
    known = {d.gpu for d in batch.devices}
    if n:
        unknown = set(np.unique(gpu).tolist()) - known
        if unknown:
            raise BatchError(f"gpu_u32le: GPU {sorted(unknown)[0]} has samples but no entry in devices")
    arrays: dict[str, pa.Array] = {}
    columns: dict[str, np.ndarray] = {}
    for ci, col in enumerate(batch.columns):
        where = f"columns[{ci}]"
        m = cat.BY_NAME.get(col.metric)
        if m is None:
            raise BatchError(f"{where}.metric: unknown metric {col.metric!r} (see `gpuscope metrics`)")
        if col.metric in arrays:
            raise BatchError(f"{where}.metric: {col.metric!r} appears twice")
        values = _array(f"{where}.f64le ({col.metric})", col.f64le, 8, n, "<f8")
        valid_buf = None
        check = values
        if col.valid:
            if len(col.valid) != (n + 7) // 8:
                raise BatchError(f"{where}.valid ({col.metric}): {len(col.valid)} bytes, expected {(n + 7) // 8}")
            mask = np.unpackbits(np.frombuffer(col.valid, np.uint8), count=n, bitorder="little").astype(bool)
            check = values[mask]
            valid_buf = pa.py_buffer(col.valid)
            full = np.where(mask, values, np.nan)
        else:
            full = values
        if not np.isfinite(check).all():
            i = int(np.flatnonzero(~np.isfinite(values) & (mask if col.valid else True))[0])
            raise BatchError(f"{where}.f64le ({col.metric})[{i}]: {float(values[i])!r} is not a number "
                             "(mark missing values in `valid`, never as NaN)")
        if (check < 0).any():
            i = int(np.flatnonzero(values < 0)[0])
            raise BatchError(f"{where}.f64le ({col.metric})[{i}]: negative value {float(values[i])!r}")
        if m.kind is cat.Kind.RATIO and (check > RATIO_CEILING).any():
            i = int(np.flatnonzero(values > RATIO_CEILING)[0])
            raise BatchError(f"{where}.f64le ({col.metric})[{i}]: {float(values[i])!r} is not a ratio (0-1)")
        arrays[col.metric] = pa.Array.from_buffers(pa.float64(), n, [valid_buf, pa.py_buffer(col.f64le)])
        columns[col.metric] = full
    for pi, p in enumerate(batch.processes):
        if p.sample >= n:
            raise BatchError(f"processes[{pi}].sample: {p.sample} >= count {n}")
        if p.HasField("cpu_cores") and not (np.isfinite(p.cpu_cores) and p.cpu_cores >= 0):
            raise BatchError(f"processes[{pi}].cpu_cores: {p.cpu_cores!r}")
    for hi, h in enumerate(batch.health):
        if h.gpu not in known:
            raise BatchError(f"health[{hi}].gpu: GPU {h.gpu} has no entry in devices")
        if not (np.isfinite(h.t) and 0 < h.t <= now + MAX_FUTURE_SKEW_S):
            raise BatchError(f"health[{hi}].t: {h.t!r} is not a Unix time in the past")

    # Only the metrics the batch carries: the writer's concat fills the rest
    # with nulls, and the store's INSERT names its columns.
    names = ["host", "gpu", "t"] + [m for m in METRIC_NAMES if m in arrays]
    cols = [pa.array([batch.host] * n, pa.string()), pa.array(gpu.astype(np.int32)), pa.array(t)]
    cols += [arrays[m] for m in names[3:]]
    table = pa.Table.from_arrays(cols, names=names)
    processes, job = _processes(batch, t, gpu)
    health = [(batch.host, h.gpu, h.t, _HEALTH_NAMES.get(h.kind, "unspecified"), h.detail,
               h.code if h.HasField("code") else None) for h in batch.health]
    return DecodedBatch(batch.host, batch.boot_id, batch.seq, n, table, t, gpu, columns, processes,
                        list(batch.devices), health, batch.dropped_samples, job)


def _processes(batch: pb.SampleBatch, t: np.ndarray, gpu: np.ndarray) -> tuple[pa.Table | None, dict[int, str]]:
    if not batch.processes:
        return None, {}
    rows = batch.processes
    job: dict[int, tuple[float, int, str]] = {}
    for p in rows:   # the job of a GPU: its process holding the most memory, at the latest sample
        g, ts = int(gpu[p.sample]), float(t[p.sample])
        mem = p.used_memory_bytes if p.HasField("used_memory_bytes") else 0
        cur = job.get(g)
        if cur is None or ts > cur[0] or (ts == cur[0] and mem > cur[1]):
            job[g] = (ts, mem, f"pid:{p.pid}" + (f" {p.command}" if p.command else ""))
    table = pa.table({
        "host": pa.array([batch.host] * len(rows)),
        "gpu": pa.array([int(gpu[p.sample]) for p in rows], pa.int32()),
        "t": pa.array([float(t[p.sample]) for p in rows]),
        "pid": pa.array([p.pid for p in rows], pa.int64()),
        "used_memory_bytes": pa.array([p.used_memory_bytes if p.HasField("used_memory_bytes") else None for p in rows], pa.int64()),
        "cpu_cores": pa.array([p.cpu_cores if p.HasField("cpu_cores") else None for p in rows], pa.float64()),
        "command": pa.array([p.command for p in rows]),
    })
    return table, {g: v[2] for g, v in job.items()}
