"""Records -> wire messages. The only place the agent builds protos."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from gpuscope.security.redact import redact_command

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS, Attribution, DeviceInfo, GpuSample, HealthKind, HealthRecord
from gpuscope.v1 import samples_pb2 as pb

_HEALTH = {
    HealthKind.GPU_LOST: pb.HEALTH_KIND_GPU_LOST,
    HealthKind.XID: pb.HEALTH_KIND_XID,
    HealthKind.ECC_UNCORRECTED: pb.HEALTH_KIND_ECC_UNCORRECTED,
    HealthKind.SOURCE_ERROR: pb.HEALTH_KIND_SOURCE_ERROR,
    HealthKind.RECOVERED: pb.HEALTH_KIND_RECOVERED,
}
_NAMES = cat.NAMES


def device_pb(d: DeviceInfo) -> pb.Device:
    m = pb.Device(gpu=d.gpu, uuid=d.uuid, name=d.name, architecture=d.architecture,
                  gpm_supported=d.gpm_supported, lost=d.lost, source=d.source, driver_version=d.driver_version)
    if d.memory_total_bytes is not None:
        m.memory_total_bytes = int(d.memory_total_bytes)
    if d.power_limit_watts is not None:
        m.power_limit_watts = d.power_limit_watts
    if d.pcie_generation is not None:
        m.pcie_generation = d.pcie_generation
    if d.pcie_width is not None:
        m.pcie_width = d.pcie_width
    if d.pcie_max_generation is not None:
        m.pcie_max_generation = d.pcie_max_generation
    if d.pcie_max_width is not None:
        m.pcie_max_width = d.pcie_max_width
    if d.pcie_busy_generation is not None:
        m.pcie_busy_generation = d.pcie_busy_generation
    if d.pcie_busy_width is not None:
        m.pcie_busy_width = d.pcie_busy_width
    return m


def encode_batch(host: str, boot_id: str, seq: int, samples: Sequence[GpuSample],
                 devices: Iterable[DeviceInfo], health: Iterable[HealthRecord] = (),
                 dropped: int = 0, redacted: dict[str, str] | None = None) -> pb.SampleBatch:
    """`redacted`: command lines already redacted (command -> as sent), e.g.
    by the uplink sizing the batch; completed here."""
    n = len(samples)
    batch = pb.SampleBatch(host=host, boot_id=boot_id, seq=seq, count=n, dropped_samples=dropped)
    batch.t_f64le = np.fromiter((s.t for s in samples), dtype="<f8", count=n).tobytes()
    batch.gpu_u32le = np.fromiter((s.gpu for s in samples), dtype="<u4", count=n).tobytes()
    present: set[str] = set()
    for s in samples:
        present.update(s.values)
    nan = math.nan
    for name in _NAMES:
        if name not in present:
            continue
        vals = np.fromiter((s.values.get(name, nan) for s in samples), dtype="<f8", count=n)
        missing = np.isnan(vals)
        col = batch.columns.add(metric=name)
        if missing.any():
            col.valid = np.packbits(~missing, bitorder="little").tobytes()
            vals[missing] = 0.0
        col.f64le = vals.tobytes()
    redacted = {} if redacted is None else redacted     # a process repeats in every sample: redact each once
    # ...and so does its attribution, one object shared by its samples: each is sent once a
    # batch, found by identity (no hashing of its labels per sample), equal ones merged
    by_id: dict[int, int] = {}
    by_value: dict[Attribution, int] = {}
    for i, s in enumerate(samples):
        for p in s.processes:
            command = redacted.get(p.command)
            if command is None:
                command = redacted[p.command] = redact_command(p.command)
            a, index = p.attribution, None
            if a is not None:
                index = by_id.get(id(a))
                if index is None:
                    index = by_value.get(a)
                    if index is None:
                        index = by_value[a] = len(batch.attributions)
                        batch.attributions.append(attribution_pb(a))
                    by_id[id(a)] = index
            ps = batch.processes.add(sample=i, pid=p.pid, command=command, attribution=index)
            if p.used_memory_bytes is not None:
                ps.used_memory_bytes = int(p.used_memory_bytes)
            if p.cpu_cores is not None:
                ps.cpu_cores = p.cpu_cores
    for d in devices:
        m = batch.devices.add()
        m.CopyFrom(device_pb(d))
        if d.attribution is not None:
            index = by_value.get(d.attribution)
            if index is None:
                index = by_value[d.attribution] = len(batch.attributions)
                batch.attributions.append(attribution_pb(d.attribution))
            m.attribution = index
    for h in health:
        e = batch.health.add(gpu=h.gpu, t=h.t, kind=_HEALTH[h.kind], detail=h.detail)
        if h.code is not None:
            e.code = h.code
    return batch


def attribution_pb(a: Attribution) -> pb.Attribution:
    return pb.Attribution(**{f: v for f in ATTRIBUTION_FIELDS if (v := getattr(a, f))})


def capture_pb(rec) -> pb.CaptureRecord:
    """daemon.captures.CaptureRecord -> wire."""
    m = pb.CaptureRecord(id=rec.id, host=rec.host, target=rec.target, gpus=rec.gpus, job=rec.job, start=rec.start,
                         end=rec.end, duration_ms=rec.duration_ms, path=rec.path, size_bytes=rec.size_bytes,
                         status=rec.status, error=rec.error, trigger=rec.trigger, kind=rec.kind)
    if rec.pid is not None:
        m.pid = rec.pid
    return m
