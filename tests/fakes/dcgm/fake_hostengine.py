"""The host engine behind the fake DCGM bindings: GPUs declared as data, and
the switches tests turn (kill and restart a standalone nv-hostengine, refuse
profiling, lose a GPU, leave the DCGM library out). Not a module of NVIDIA's
bindings: `dcgm_agent` and `dcgm_structs` here consult it where the real
ones call libdcgm.so.4.

What it does is what DCGM 4.x does, as read in NVIDIA/DCGM:
- values are DCGM's own units (W, MHz, MiB, %, ratios 0-1, B/s) and types
  (dcgmlib/src/dcgm_fields.cpp: power and profiling ratios are doubles, the
  rest int64);
- dcgmEntitiesGetLatestValues answers DCGM_ST_OK for the call and a status
  per value (DcgmCacheManager::GetLatestSample): NOT_WATCHED for a field
  nobody watches, NO_DATA for one watched but not sampled yet, the driver's
  error (NOT_SUPPORTED, GPU_IS_LOST) converted otherwise;
- while profiling is paused, profiling fields hold BLANK values with status
  OK (testing/python3/tests/test_prof.py, pause_resume_values); GPUs whose
  profiling comes from GPM (Hopper and newer) do not pause: dcgmProfPause
  answers NOT_SUPPORTED (test_dcgm_prof_multi_pause_resume);
- a watch of profiling fields is refused with the GPU's refusal
  (PROFILING_NOT_SUPPORTED, IN_USE, REQUIRES_ROOT, ...), or MULTI_PASS when
  the fields do not fit one pass, or NOT_SUPPORTED for a field the GPU
  lacks; a group watches if any of its GPUs can (test_prof.py);
- an unknown field id in a field group is BADPARAM, a field group name
  already used is DUPLICATE_KEY (dcgmlib/src/DcgmFieldGroup.cpp);
- a standalone host engine that dies invalidates every connection to it:
  each call on one answers CONNECTION_NOT_VALID, and so does a connect
  while it is down; a restarted one has no groups or watches. A client's
  groups and watches go when it disconnects (persistAfterDisconnect=0).

`frozen=True` builds each answer once and hands the same array back, so
that benchmarks measure the collector and not the fake.

For a process that cannot be driven from a test (`gpuscope agent` run as a
command), GPUSCOPE_FAKE_DCGM_SPEC names a JSON file of GPUs
({"gpus": [{"preset": "h200", "values": {"203": 95}, "prof": {"1002": 0.9}}]});
the values are read again whenever the file changes.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

ST_OK = 0
ST_NOT_SUPPORTED, ST_NO_DATA, ST_NOT_WATCHED, ST_GPU_IS_LOST = -6, -14, -16, -18
ST_PROFILING_MULTI_PASS = -38

MIB = 1048576
INT64 = {100, 101, 112, 140, 150, 156, 202, 203, 204, 235, 236, 237, 238, 250, 252, 310, 311,
         1009, 1010, 1011, 1012, 1420, 1421, 1422, 1423, 1424}
DOUBLE = {155, 157, 164, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1013, 1014, 1015, 1016}
KNOWN_FIELDS = frozenset(INT64 | DOUBLE)
PROFILING = frozenset(range(1001, 1100))
ADDED_IN_4_2 = frozenset(range(1420, 1425))   # clock-event reasons in ns: older host engines refuse them


def _device_values() -> dict[int, float]:
    return {100: 1980, 101: 3201, 112: 0, 140: 35, 150: 40, 155: 120.0, 156: 1_000_000, 157: 120.0,
            164: 700.0, 202: 0, 203: 0, 204: 0, 235: 5, 236: 16, 237: 5, 238: 16, 250: 143_771, 252: 1_907, 310: 0, 311: 0,
            1420: 0, 1421: 0, 1422: 0, 1423: 0, 1424: 0}


def _profiling_values() -> dict[int, float]:
    return {1001: 0.0, 1002: 0.0, 1003: 0.0, 1004: 0.0, 1005: 0.0, 1006: 0.0, 1007: 0.0, 1008: 0.0,
            1009: 1 * MIB, 1010: 1 * MIB, 1011: 0, 1012: 0, 1013: 0.0, 1014: 0.0, 1015: 0.0, 1016: 0.0}


@dataclass
class FakeDcgmGpu:
    name: str = "NVIDIA H200"
    uuid: str = ""                       # "" -> GPU-fake-NNNN, as tests/fakes/nvml.py names its GPUs
    arch: int = 9                        # DCGM_CHIP_ARCH_HOPPER
    pci_bus_id: str = ""
    fb_total_mib: int = 143_771
    power_limit_w: int = 700
    mig: bool = False
    values: dict[int, float] = field(default_factory=_device_values)      # device fields, DCGM units
    prof: dict[int, float] = field(default_factory=_profiling_values)    # profiling fields; absent: unsupported
    gpm: bool = True                     # profiling through GPM (Hopper+): no pause, no conflict with tools
    profiling_refusal: int | None = None  # the DCGM_ST_* a profiling watch on this GPU raises
    single_pass: frozenset[int] | None = None   # profiling fields that fit one pass (None: all of them)
    no_data: set[int] = field(default_factory=set)   # watched, not sampled yet
    lost: bool = False


def _preset(base: dict, overrides: dict) -> FakeDcgmGpu:
    """`values` and `prof` given are merged into the preset's (delete from
    gpu.values to make a field unsupported); other settings replace it."""
    gpu = FakeDcgmGpu(**{**base, **{k: v for k, v in overrides.items() if k not in ("values", "prof")}})
    gpu.values.update(overrides.get("values", {}))
    gpu.prof.update(overrides.get("prof", {}))
    return gpu


def h200(**overrides) -> FakeDcgmGpu:
    return _preset({}, overrides)


def a100(**overrides) -> FakeDcgmGpu:
    """Ampere: profiling through DCGM's profiling module (pausable, one pass
    for fields 1001-1012, the tensor sub-pipes and integer pipe in another);
    no instantaneous power, no clock-event nanoseconds."""
    values = _device_values()
    for fid in (157, 1420, 1421, 1422, 1423, 1424):
        values.pop(fid)
    values.update({250: 81_920, 164: 400.0})
    return _preset(dict(name="NVIDIA A100-SXM4-80GB", arch=7, fb_total_mib=81_920, power_limit_w=400, gpm=False,
                        values=values, single_pass=frozenset(range(1001, 1013))), overrides)


PRESETS = {"h200": h200, "a100": a100}


class HostEngine:
    def __init__(self, gpus: list[FakeDcgmGpu], *, running: bool = True, address: str | None = None,
                 library_missing: bool = False, driver_missing: bool = False,
                 known_fields: frozenset[int] = KNOWN_FIELDS, frozen: bool = False):
        self.gpus = gpus
        for i, g in enumerate(gpus):
            g.uuid = g.uuid or f"GPU-fake-{i:04d}"
            g.pci_bus_id = g.pci_bus_id or f"00000000:{0x18 + i:02X}:00.0"
        self.running = running               # the standalone nv-hostengine
        self.address = address               # where it listens; None: wherever it is asked
        self.library_missing = library_missing
        self.driver_missing = driver_missing
        self.known_fields = known_fields
        self.frozen = frozen
        self.library_loaded = self.initialised = False
        self.generation = 0                  # bumped by each restart
        self.connections: dict[int, tuple[int, bool]] = {}     # handle -> (generation, embedded)
        self.groups: dict[int, tuple[int, list[int]]] = {}      # id -> (owner handle, gpu ids)
        self.field_groups: dict[int, tuple[int, str, list[int]]] = {}   # id -> (owner, name, field ids)
        self.watches: dict[tuple[int, int], set[int]] = {}      # (gpu, field) -> handles watching
        self.paused = False
        self.reorder = False                 # answer entities last first (DCGM promises no order)
        self.calls = self.connects = self.pauses = self.resumes = 0
        self._ids = 100
        self._cache: dict = {}
        self._spec_mtime: float | None = None

    # -- what tests turn ------------------------------------------------------------------
    def kill(self) -> None:
        """The standalone host engine dies: its connections, groups and watches with it."""
        self.running = False
        self._forget(lambda h: not self.connections[h][1])

    def restart(self) -> None:
        self.running = True
        self.generation += 1
        self.paused = False

    def watched(self, gpu: int) -> set[int]:
        return {f for (g, f), owners in self.watches.items() if g == gpu and owners}

    # -- for the fake modules -------------------------------------------------------------
    def new_id(self) -> int:
        self._ids += 1
        return self._ids

    def valid(self, handle: int) -> bool:
        conn = self.connections.get(handle)
        return conn is not None and (conn[1] or (self.running and conn[0] == self.generation))

    def drop(self, handle: int) -> None:
        self._forget(lambda h: h == handle)

    def _forget(self, which) -> None:
        gone = {h for h in self.connections if which(h)}
        for h in gone:
            del self.connections[h]
        self.groups = {k: v for k, v in self.groups.items() if v[0] not in gone}
        self.field_groups = {k: v for k, v in self.field_groups.items() if v[0] not in gone}
        for owners in self.watches.values():
            owners -= gone
        self._cache.clear()

    def reload_if_changed(self) -> None:
        path = os.environ.get("GPUSCOPE_FAKE_DCGM_SPEC")
        if not path:
            return
        mtime = os.stat(path).st_mtime
        if mtime != self._spec_mtime:
            self._spec_mtime = mtime
            for gpu, spec in zip(self.gpus, _read_spec(path)["gpus"]):
                fresh = _gpu_from(spec)
                gpu.values, gpu.prof = fresh.values, fresh.prof
            self._cache.clear()

    def cached(self, key, build):
        if not self.frozen:
            return build()
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def now_us(self) -> int:
        return int(time.time() * 1e6)


def _read_spec(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _gpu_from(spec: dict) -> FakeDcgmGpu:
    gpu = PRESETS[spec.get("preset", "h200")]()
    gpu.values.update({int(k): v for k, v in spec.get("values", {}).items()})
    gpu.prof.update({int(k): v for k, v in spec.get("prof", {}).items()})
    return gpu


def write_spec(path, gpus: list[dict]) -> None:
    """For tests that run gpuscope as a command: GPUs as {"preset", "values", "prof"}."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"gpus": gpus}, f)
    os.replace(tmp, path)


def _initial() -> HostEngine:
    path = os.environ.get("GPUSCOPE_FAKE_DCGM_SPEC")
    if not path:
        return HostEngine([h200()])
    engine = HostEngine([_gpu_from(g) for g in _read_spec(path)["gpus"]])
    engine.reload_if_changed()
    return engine


ENGINE = _initial()


def reset(gpus: list[FakeDcgmGpu], **kw) -> HostEngine:
    """A fresh host engine of these GPUs, as the one the bindings talk to."""
    global ENGINE
    ENGINE = HostEngine(gpus, **kw)
    return ENGINE
