"""DCGM field values -> catalogue metrics, in one pass over DCGM's array.

dcgmEntitiesGetLatestValues answers an array of c_dcgmFieldValue_v2, each
4,128 bytes (a 4 KiB union for strings and blobs). Read field by field
through the bindings' ctypes hooks (which decode every attribute), a tick of
8 GPUs x 30 fields costs over a millisecond; a numpy view of the same bytes
reads status, type and value of all of them at once, without a copy.

A value counts only when its status is DCGM_ST_OK, its type is a number,
and it is below its type's BLANK sentinel: DCGM writes BLANK (and BLANK+1..3
for not found, not supported, not permitted) where it has no value, paused
profiling included. Missing is not zero: such a field is left out.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from itertools import compress
from types import ModuleType

import numpy as np

from . import dcgm_fields as df

_NO_METRIC = ""


@dataclass
class _Plan:
    """What one request's answer looks like when DCGM keeps the order asked."""
    entities: np.ndarray        # expected entity id of each value
    fields: np.ndarray          # expected field id of each value
    scale: np.ndarray           # per field asked: DCGM's unit -> the catalogue's
    names: list[str]            # per field asked: the catalogue metric ("" when none)
    mapped: np.ndarray          # per field asked: has a metric


class FieldValueReader:
    """Built once per loaded bindings: the layout comes from their own structure."""

    def __init__(self, structs: ModuleType, fields: ModuleType, value: ModuleType):
        t, u = structs.c_dcgmFieldValue_v2, structs.c_dcgmFieldValue_v1_value
        at = t.value.offset
        self.dtype = np.dtype({
            "names": ["entity_group", "entity", "field", "type", "status", "i64", "dbl"],
            "formats": ["<u4", "<u4", "<u2", "<i2", "<i4", "<i8", "<f8"],
            "offsets": [t.entityGroupId.offset, t.entityId.offset, t.fieldId.offset, t.fieldType.offset,
                        t.status.offset, at + u.i64.offset, at + u.dbl.offset],
            "itemsize": ctypes.sizeof(t)})
        self.gpu_group = fields.DCGM_FE_GPU
        self.int64, self.double = ord(fields.DCGM_FT_INT64), ord(fields.DCGM_FT_DOUBLE)
        self.int64_blank, self.fp64_blank = value.DCGM_INT64_BLANK, value.DCGM_FP64_BLANK
        self.gpu_is_lost = structs.DCGM_ST_GPU_IS_LOST
        size = max(f.id for f in df.FIELDS) + 1
        self.scale = np.zeros(size)               # by field id: DCGM's unit -> the catalogue's
        self.metric = [_NO_METRIC] * size         # by field id: the catalogue metric
        for f in df.FIELDS:
            self.scale[f.id], self.metric[f.id] = f.scale, f.metric
        self._plans: dict[tuple, _Plan] = {}

    def read(self, array, entities: list[int], field_ids: list[int]
             ) -> tuple[dict[int, dict[str, float]], set[int]]:
        """({gpu: {metric: value}}, GPUs DCGM says are lost) from the array
        dcgmEntitiesGetLatestValues answered for these entities (GPU ids) and
        fields. DCGM may answer entities in any order, so each value's own
        entity and field ids are read; cached values come entity by entity,
        field by field, as asked (DcgmCacheManager::GetMultipleLatestSamples),
        and then each GPU's dict is built in C (itertools.compress) instead
        of value by value."""
        ne, nf = len(entities), len(field_ids)
        v = np.frombuffer(array, dtype=self.dtype, count=ne * nf)
        status, kind = v["status"], v["type"]
        is_dbl = kind == self.double
        dbl, i64 = v["dbl"], v["i64"]
        good = ((status == 0) & (v["entity_group"] == self.gpu_group)
                & ((is_dbl & (dbl < self.fp64_blank)) | ((kind == self.int64) & (i64 < self.int64_blank))))
        raw = np.where(is_dbl, dbl, i64)
        lost = set(v["entity"][status == self.gpu_is_lost].tolist()) if (status == self.gpu_is_lost).any() else set()
        plan = self._plan(tuple(entities), tuple(field_ids))
        if (v["entity"] == plan.entities).all() and (v["field"] == plan.fields).all():
            scaled = (raw.reshape(ne, nf) * plan.scale).tolist()
            good = (good.reshape(ne, nf) & plan.mapped).tolist()
            names = plan.names
            return {gpu: dict(zip(compress(names, ok), compress(row, ok)))
                    for gpu, row, ok in zip(entities, scaled, good)}, lost
        return self._read_any_order(v, good, raw), lost

    def _plan(self, entities: tuple[int, ...], field_ids: tuple[int, ...]) -> _Plan:
        plan = self._plans.get((entities, field_ids))
        if plan is None:
            fids = np.array([f if f < len(self.metric) else 0 for f in field_ids])
            plan = _Plan(entities=np.repeat(np.array(entities, dtype=np.uint32), len(field_ids)),
                         fields=np.tile(np.array(field_ids, dtype=np.uint16), len(entities)),
                         scale=self.scale[fids], names=[self.metric[f] for f in fids],
                         mapped=np.array([bool(self.metric[f]) for f in fids]))
            if len(self._plans) > 64:     # the list changes only when profiling or a GPU comes or goes
                self._plans.clear()
            self._plans[(entities, field_ids)] = plan
        return plan

    def _read_any_order(self, v, good, raw) -> dict[int, dict[str, float]]:
        fid = v["field"]
        known = fid < len(self.metric)
        fid = np.where(known, fid, 0)
        idx = np.flatnonzero(good & known)
        out: dict[int, dict[str, float]] = {}
        names = self.metric
        scaled = raw[idx] * self.scale[fid[idx]]
        for gpu, f, x in zip(v["entity"][idx].tolist(), fid[idx].tolist(), scaled.tolist()):
            if names[f]:
                out.setdefault(gpu, {})[names[f]] = x
        return out

    def read_raw(self, array, count: int) -> dict[tuple[int, int], float]:
        """{(gpu, field id): DCGM's own value} for fields outside the catalogue
        (the PCIe link's generation and width, read once at start)."""
        v = np.frombuffer(array, dtype=self.dtype, count=count)
        out = {}
        for gpu, f, st, kind, i, d in zip(v["entity"].tolist(), v["field"].tolist(), v["status"].tolist(),
                                          v["type"].tolist(), v["i64"].tolist(), v["dbl"].tolist()):
            if st == 0 and kind == self.int64 and i < self.int64_blank:
                out[(gpu, f)] = float(i)
            elif st == 0 and kind == self.double and d < self.fp64_blank:
                out[(gpu, f)] = d
        return out
