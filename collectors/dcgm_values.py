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
from types import ModuleType

import numpy as np

from . import dcgm_fields as df

_NO_METRIC = ""


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

    def read(self, array, count: int) -> tuple[dict[int, dict[str, float]], set[int]]:
        """({gpu: {metric: value}}, GPUs DCGM says are lost) from the first
        `count` values of an array of c_dcgmFieldValue_v2. DCGM may answer
        entities in any order, so each value's own entity id is read."""
        v = np.frombuffer(array, dtype=self.dtype, count=count)
        fid, status, kind = v["field"], v["status"], v["type"]
        known = fid < len(self.metric)
        fid = np.where(known, fid, 0)
        is_dbl, is_int = kind == self.double, kind == self.int64
        dbl, i64 = v["dbl"], v["i64"]
        good = (known & (status == 0) & (v["entity_group"] == self.gpu_group)
                & ((is_dbl & (dbl < self.fp64_blank)) | (is_int & (i64 < self.int64_blank))))
        raw = np.where(is_dbl, dbl, i64.astype(np.float64))
        scaled = raw * self.scale[fid]
        out: dict[int, dict[str, float]] = {}
        names = self.metric
        idx = np.flatnonzero(good)
        for gpu, f, x in zip(v["entity"][idx].tolist(), fid[idx].tolist(), scaled[idx].tolist()):
            name = names[f]
            if name:
                values = out.get(gpu)
                if values is None:
                    values = out[gpu] = {}
                values[name] = x
        lost = set(v["entity"][status == self.gpu_is_lost].tolist()) if (status == self.gpu_is_lost).any() else set()
        return out, lost

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
