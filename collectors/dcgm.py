"""DCGM collector: every GPU of the host through NVIDIA's DCGM host engine,
the device fields gpuscope samples plus DCGM's profiling (DCP) fields,
mapped through collectors/dcgm_fields.py onto the catalogue so that every
rule reads them as it reads NVML's.

Where it runs: in a standalone nv-hostengine (`--source dcgm:HOST[:PORT]`,
or $DCGM_HOSTENGINE), which other tools such as dcgm-exporter may share, or
embedded in the agent's process (`--source dcgm` without an address).

What it asks of DCGM, in the shape of DCGM's own DcgmReader: one group of
the host's GPUs, one field group of the fast device fields watched at
`interval_s`, one of the slow ones (energy, ECC, ...) at `slow_interval_s`,
and the profiling fields watched GPU by GPU, so that one GPU's refusal (MIG,
another profiler holding the counters) is that GPU's alone. Each tick reads
the latest cached values of every GPU in one dcgmEntitiesGetLatestValues
call; nothing is asked of the driver on our tick.

Profiling fields are tried whole (with the tensor HMMA and integer pipes),
then as the core set (1001-1012, FP64 left out: no metric reads it) that
fits one pass on every GPU DCGM profiles; a GPU that refuses both is sampled without them, and
`source_status()` says why. One refused because another profiler holds the
counters (DCGM_ST_IN_USE) is asked again every `profiling_retry_s`.

Processes and their host CPU come from NVML with GPM off (DCGM lists them
only through its costly job statistics), matched to DCGM's GPUs by UUID;
without NVML there are none. NVML's GPM is never turned on here: DCGM's
profiling on Hopper reads the same GPM monitors.

Faults: a call that finds the host engine gone (DCGM_ST_CONNECTION_NOT_VALID)
marks the source down with a `source_error` health event per GPU; the ticks
go on with what NVML still gives (processes), reconnect with backoff, and
on success re-create the groups, re-watch every field, and say so with a
`recovered` event. A GPU DCGM reports lost becomes `gpu_lost`. No error
after start-up raises: each is counted in the scrape's errors.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import structlog

from . import catalogue as cat
from . import dcgm_fields as df
from .dcgm_bindings import DcgmBindings, load_dcgm, profiling_refusal, status_name
from .dcgm_values import FieldValueReader
from .network import sysfs_bus_id
from .nvml import ARCHITECTURES, NvmlCollector, NvmlConfig, SourceUnavailable
from .records import BUSY_UTIL, DeviceInfo, GpuSample, HealthKind, HealthRecord, ProcessRecord, Scrape, with_busy_link

log = structlog.get_logger("gpuscope.dcgm")
ENV_HOSTENGINE = "DCGM_HOSTENGINE"
DEFAULT_PORT = 5555                       # nv-hostengine's
PROFILING = tuple(f.id for f in df.FIELDS if 1000 < f.id < 1100)
# dcgm-exporter's default profiling set: one pass on every GPU DCGM profiles (Volta to Blackwell)
PROFILING_CORE = tuple(i for i in PROFILING if i <= 1012)
_DEVICE = [f for f in df.FIELDS if f.id not in PROFILING]
FAST = tuple(f.id for f in _DEVICE if not cat.BY_NAME[f.metric].slow)
SLOW = tuple(f.id for f in _DEVICE if cat.BY_NAME[f.metric].slow)
# DCGM_FI_DEV_PCIE_LINK_GEN, _WIDTH, then _MAX_LINK_GEN, _MAX_LINK_WIDTH: for DeviceInfo, read at start-up
# and, while the GPU is busy, at each slow scrape
PCIE_LINK = (237, 238, 235, 236)
_ECC_UNCORRECTED = "ecc_uncorrected_total"
MIB = 1048576


@dataclass(frozen=True)
class DcgmConfig:
    address: str | None = None          # HOST:PORT of a standalone nv-hostengine; None: embedded in this process
    interval_s: float = 1.0             # DCGM's sampling of fast and profiling fields
    slow_interval_s: float = 10.0
    profiling: bool = True
    processes: bool = True              # from NVML, GPM off, when it loads
    reconnect_initial_s: float = 1.0
    reconnect_max_s: float = 30.0
    profiling_retry_s: float = 60.0     # a GPU whose counters another profiler held is asked again
    keep_age_s: float = 60.0            # how long DCGM keeps our fields' samples (we read the latest)
    connect_timeout_ms: int = 5000


@dataclass
class _Session:
    """One connection and what was made on it; rebuilt whole after the host engine restarts."""
    handle: Any
    token: str
    group: Any = None
    field_groups: dict[str, Any] = field(default_factory=dict)      # "fast", "slow", "profiling", "core"
    refused_fields: frozenset[int] = frozenset()                      # ids this host engine does not know
    profiling_groups: dict[int, Any] = field(default_factory=dict)   # gpu -> its own group
    profiling: dict[int, str | None] = field(default_factory=dict)   # gpu -> None (watched) or why not
    profiling_fields: dict[int, tuple[int, ...]] = field(default_factory=dict)
    retry_at: dict[int, float] = field(default_factory=dict)         # gpu -> when to ask again


class DcgmCollector:
    """Samples every GPU DCGM supports; the same interface as NvmlCollector."""

    def __init__(self, config: DcgmConfig = DcgmConfig(), bindings: DcgmBindings | None = None,
                 processes: NvmlCollector | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self._b = bindings
        self._nvml = processes
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.RLock()    # fast and slow scrapes and captures' pauses share the session
        self._session: _Session | None = None
        self._reader: FieldValueReader | None = None
        self._gpus: list[int] = []
        self._info: dict[int, DeviceInfo] = {}
        self._lost: set[int] = set()
        self._uuid_gpu: dict[str, int] = {}
        self._entities: list[Any] = []
        self._entity_ids: list[int] = []
        self._fast: list[int] = []
        self._slow: list[int] = []
        self._pauses = 0                  # captures running that asked for a pause
        self._paused = False
        self._pause_note = ""
        self._down_since: float | None = None
        self._down_reason = ""
        self._backoff = config.reconnect_initial_s
        self._next_attempt = 0.0
        self._pending = Scrape()          # health and errors met outside a scrape (a pause), handed on next
        self._ecc: dict[int, float] = {}
        self._busy: set[int] = set()      # GPUs at or over BUSY_UTIL at the last fast scrape
        self.processes_note = ""

    @property
    def where(self) -> str:
        return f"nv-hostengine at {self.config.address}" if self.config.address else "DCGM embedded in the agent"

    # -- start-up: fail fast with a message that says what to do ------------------------------
    def start(self) -> None:
        b = self._b = self._b or load_dcgm()
        try:
            b.structs._dcgmInit()         # loads libdcgm.so.4
            b.agent.dcgmInit()
        except b.structs.DCGMError as exc:
            hint = ("libdcgm.so.4 is not installed: install datacenter-gpu-manager-4-core"
                    if exc.value == b.structs.DCGM_ST_LIBRARY_NOT_FOUND else "DCGM failed to initialise")
            raise SourceUnavailable(f"DCGM: {exc} ({hint}); or sample through NVML with --source nvml") from exc
        self._reader = FieldValueReader(b.structs, b.fields, b.value)
        try:
            self._session = self._open(first=True)
        except b.structs.DCGMError as exc:
            raise SourceUnavailable(self._start_hint(exc)) from exc
        if not self._gpus:
            raise SourceUnavailable(f"DCGM ({self.where}) supports no GPU on this host; run with --source nvml, "
                                    "or --source replay:FILE on a machine without one")
        if self.config.processes:
            self._start_processes()
        log.info("DCGM source started", where=self.where, gpus=len(self._gpus), status=self.source_status(),
                 processes=self.processes_note or "from NVML, GPM off")

    def _start_hint(self, exc) -> str:
        s = self._b.structs
        if exc.value == s.DCGM_ST_CONNECTION_NOT_VALID:
            return (f"DCGM: no nv-hostengine answers at {self.config.address} ({exc}): start it "
                    f"(systemctl start nvidia-dcgm), give its address (--source dcgm:HOST[:PORT] or "
                    f"{ENV_HOSTENGINE}), or run DCGM inside the agent with --source dcgm and {ENV_HOSTENGINE} unset")
        if exc.value == s.DCGM_ST_INIT_ERROR:
            return (f"DCGM could not start its host engine in the agent ({exc}): is the NVIDIA driver loaded? "
                    "Or connect to a running nv-hostengine with --source dcgm:HOST[:PORT]")
        return f"DCGM ({self.where}) failed at start: {exc} ({status_name(s, exc.value)})"

    def _start_processes(self) -> None:
        nvml = self._nvml or NvmlCollector(NvmlConfig(gpm=False, processes=True))
        try:
            nvml.start()
        except SourceUnavailable as exc:
            self.processes_note = f"no processes: NVML did not load ({exc})"
            log.warning("DCGM source without processes: NVML did not load", error=str(exc))
            self._nvml = None            # no process list to read, and none to promise in what we say
            return
        self._nvml = nvml

    def _connect(self):
        b = self._b
        if self.config.address is None:
            return b.agent.dcgmStartEmbedded(b.structs.DCGM_OPERATION_MODE_AUTO)
        params = b.structs.c_dcgmConnectV2Params_v2()
        params.persistAfterDisconnect = 0          # the host engine drops our watches when we go
        params.timeoutMs = self.config.connect_timeout_ms
        params.addressIsUnixSocket = 0
        return b.agent.dcgmConnect_v2(self.config.address, params)

    def _open(self, first: bool = False) -> _Session:
        """Connect, (first time) describe the GPUs, make the groups and watch
        every field. Raises DCGMError; a half-made session is disconnected."""
        agent = self._b.agent
        sess = _Session(handle=self._connect(), token=uuid.uuid4().hex[:8])
        try:
            present = set(agent.dcgmGetAllSupportedDevices(sess.handle))
            if first:
                self._gpus = sorted(present)
                for gpu in self._gpus:
                    self._info[gpu] = self._describe(sess, gpu)
                self._uuid_gpu = {i.uuid: g for g, i in self._info.items() if i.uuid}
            self._lost |= set(self._gpus) - present
            live = [g for g in self._gpus if g not in self._lost]
            self._watch(sess, live)
        except self._b.structs.DCGMError:
            self._disconnect(sess)
            raise
        return sess

    def _describe(self, sess: _Session, gpu: int) -> DeviceInfo:
        b, s = self._b, self._b.structs
        a = b.agent.dcgmGetDeviceAttributes(sess.handle, gpu)
        blank32 = b.value.DCGM_INT32_BLANK
        fb, limit = a.memoryUsage.fbTotal, a.powerLimits.enforcedPowerLimit
        try:
            arch = ARCHITECTURES.get(b.agent.dcgmGetGpuChipArchitecture(sess.handle, gpu), "")
        except (AttributeError, s.DCGMError):         # bindings older than the call
            arch = ""
        link = self._pcie_link(sess, gpu)
        return DeviceInfo(gpu=gpu, uuid=a.identifiers.uuid, name=a.identifiers.deviceName, architecture=arch,
                          memory_total_bytes=fb * MIB if 0 < fb < blank32 else None,
                          power_limit_watts=float(limit) if 0 < limit < blank32 else None,
                          pcie_generation=link.get(PCIE_LINK[0]), pcie_width=link.get(PCIE_LINK[1]),
                          pcie_max_generation=link.get(PCIE_LINK[2]), pcie_max_width=link.get(PCIE_LINK[3]),
                          driver_version=_text(getattr(a.identifiers, "driverVersion", "")),
                          pci_bus_id=sysfs_bus_id(SimpleNamespace(busId=getattr(a.identifiers, "pciBusId", ""))),
                          source="dcgm")

    def _pcie_link(self, sess: _Session, gpu: int) -> dict[int, int]:
        b = self._b
        entity = [b.structs.c_dcgmGroupEntityPair_t(b.fields.DCGM_FE_GPU, gpu)]
        try:
            arr = b.agent.dcgmEntitiesGetLatestValues(sess.handle, entity, list(PCIE_LINK),
                                                      b.structs.DCGM_FV_FLAG_LIVE_DATA)
        except b.structs.DCGMError as exc:
            if exc.value == b.structs.DCGM_ST_CONNECTION_NOT_VALID:
                raise
            return {}
        return {f: int(v) for (_, f), v in self._reader.read_raw(arr, len(PCIE_LINK)).items()}

    def _watch(self, sess: _Session, live: list[int]) -> None:
        b, c = self._b, self.config
        agent, s = b.agent, b.structs
        sess.group = agent.dcgmGroupCreate(sess.handle, s.DCGM_GROUP_EMPTY, f"gpuscope-{sess.token}")
        for gpu in live:
            agent.dcgmGroupAddDevice(sess.handle, sess.group, gpu)
        fast = self._field_group(sess, "fast", FAST)
        slow = self._field_group(sess, "slow", SLOW)
        agent.dcgmWatchFields(sess.handle, sess.group, fast, _usec(c.interval_s), c.keep_age_s, 0)
        agent.dcgmWatchFields(sess.handle, sess.group, slow, _usec(c.slow_interval_s), c.keep_age_s, 0)
        self._slow = [i for i in SLOW if i not in sess.refused_fields]
        for gpu in live:
            self._watch_profiling(sess, gpu)
        agent.dcgmUpdateAllFields(sess.handle, 1)     # the first read finds values
        self._read_list(sess, live)

    def _field_group(self, sess: _Session, name: str, ids: tuple[int, ...]):
        """A field group of `ids`; a host engine older than the newest fields
        refuses them (BADPARAM), and gets the group without them."""
        b = self._b
        try:
            fg = b.agent.dcgmFieldGroupCreate(sess.handle, list(ids), f"gpuscope-{sess.token}-{name}")
        except b.structs.DCGMError as exc:
            older = [i for i in ids if i not in df.SINCE_4_2]
            if exc.value != b.structs.DCGM_ST_BADPARAM or len(older) == len(ids):
                raise
            sess.refused_fields |= df.SINCE_4_2
            fg = b.agent.dcgmFieldGroupCreate(sess.handle, older, f"gpuscope-{sess.token}-{name}")
        sess.field_groups[name] = fg
        return fg

    def _watch_profiling(self, sess: _Session, gpu: int) -> None:
        """Watch the profiling fields on one GPU, whole or as the core set;
        record why not. Raises only when the connection is gone."""
        b, c = self._b, self.config
        s = b.structs
        if not c.profiling:
            sess.profiling[gpu] = "turned off in the agent's configuration"
            return
        if gpu not in sess.profiling_groups:
            grp = b.agent.dcgmGroupCreate(sess.handle, s.DCGM_GROUP_EMPTY, f"gpuscope-{sess.token}-gpu{gpu}")
            b.agent.dcgmGroupAddDevice(sess.handle, grp, gpu)
            sess.profiling_groups[gpu] = grp
        refusal = None
        for name, ids in (("profiling", PROFILING), ("core", PROFILING_CORE)):
            try:
                fg = sess.field_groups.get(name) or b.agent.dcgmFieldGroupCreate(
                    sess.handle, list(ids), f"gpuscope-{sess.token}-{name}")
                sess.field_groups[name] = fg
                b.agent.dcgmWatchFields(sess.handle, sess.profiling_groups[gpu], fg, _usec(c.interval_s),
                                        c.keep_age_s, 0)
            except s.DCGMError as exc:
                if exc.value == s.DCGM_ST_CONNECTION_NOT_VALID:
                    raise
                refusal = exc.value
                # a field this GPU or host engine lacks, or more than one pass: the core set may still do
                if exc.value in (s.DCGM_ST_PROFILING_MULTI_PASS, s.DCGM_ST_NOT_SUPPORTED, s.DCGM_ST_BADPARAM):
                    continue
                break
            sess.profiling[gpu], sess.profiling_fields[gpu] = None, ids
            sess.retry_at.pop(gpu, None)
            return
        why = profiling_refusal(s, refusal)
        if refusal == s.DCGM_ST_PROFILING_NOT_SUPPORTED and self._mig(sess, gpu):
            why = "DCGM does not profile a GPU in MIG mode as a whole"
        if refusal == s.DCGM_ST_IN_USE:
            sess.retry_at[gpu] = self._monotonic() + c.profiling_retry_s
            why += f"; asked again every {c.profiling_retry_s:g} s"
        sess.profiling[gpu] = why

    def _mig(self, sess: _Session, gpu: int) -> bool:
        try:
            return bool(self._b.agent.dcgmGetDeviceAttributes(sess.handle, gpu).settings.migModeEnabled)
        except self._b.structs.DCGMError:
            return False

    def _read_list(self, sess: _Session, live: list[int]) -> None:
        """What each tick asks for: every live GPU, the fast device fields and
        the profiling fields watched on any of them."""
        b = self._b
        self._entities = [b.structs.c_dcgmGroupEntityPair_t(b.fields.DCGM_FE_GPU, g) for g in live]
        self._entity_ids = list(live)
        prof = {i for g in live for i in sess.profiling_fields.get(g, ())}
        self._fast = [i for i in FAST if i not in sess.refused_fields] + [i for i in PROFILING if i in prof]

    def devices(self) -> list[DeviceInfo]:
        status = self.source_status()
        with self._lock:
            profiled = self._session.profiling if self._session else {}
            return [dataclasses.replace(info, source=status[g], lost=g in self._lost,
                                        gpm_supported=profiled.get(g, "") is None)
                    for g, info in self._info.items()]

    def source_status(self) -> dict[int, str]:
        """Per GPU, what DCGM gives of it: 'dcgm (profiling)', 'dcgm (no
        profiling: <why>)', or why nothing comes."""
        with self._lock:
            out = {}
            for gpu in self._gpus:
                if gpu in self._lost:
                    out[gpu] = "dcgm (GPU lost)"
                elif self._session is None:
                    out[gpu] = f"dcgm (host engine down: {self._down_reason})"
                else:
                    why = self._session.profiling.get(gpu, "not watched")
                    if why is not None:
                        out[gpu] = f"dcgm (no profiling: {why})"
                    elif self._paused:
                        out[gpu] = "dcgm (profiling paused while a capture runs)"
                    elif self._session.profiling_fields.get(gpu) == PROFILING_CORE:
                        out[gpu] = ("dcgm (profiling; core fields only: the tensor HMMA and integer pipes "
                                    "need a second pass on this GPU)")
                    else:
                        out[gpu] = "dcgm (profiling)"
            return out

    # -- the fast path ---------------------------------------------------------------------------
    def scrape(self) -> Scrape:
        scrape = Scrape()
        t = self._clock()
        with self._lock:
            self._hand_on(scrape)
            if self._session is None:
                self._reconnect(t, scrape)
            if self._session is not None:
                self._retry_profiling(scrape)
            values = self._latest(self._fast, t, scrape) if self._session is not None else {}
            gpus = [g for g in self._gpus if g not in self._lost]
        procs = self._processes(scrape)
        self._busy = {g for g in gpus if values.get(g, {}).get("util_gpu_ratio", 0.0) >= BUSY_UTIL}
        for gpu in gpus:
            v = values.get(gpu, {})
            mine = procs.get(gpu)
            if mine is not None:
                v["procs_count"] = float(len(mine))
                cpus = [p.cpu_cores for p in mine if p.cpu_cores is not None]
                if cpus:
                    v["procs_cpu_cores"] = sum(cpus)
            if v:
                scrape.samples.append(GpuSample(gpu, t, v, mine or ()))
        return scrape

    def _latest(self, ids: list[int], t: float, scrape: Scrape) -> dict[int, dict[str, float]]:
        """{gpu: {metric: value}} of the latest cached values, or {} when the call failed."""
        b, sess = self._b, self._session
        if not ids or not self._entities:
            return {}
        try:
            arr = b.agent.dcgmEntitiesGetLatestValues(sess.handle, self._entities, ids, 0)
        except b.structs.DCGMError as exc:
            if exc.value == b.structs.DCGM_ST_CONNECTION_NOT_VALID:
                self._lose(t, exc, scrape)
            else:
                scrape.count_error(f"dcgm.latest_values: {exc}")
            return {}
        values, lost = self._reader.read(arr, self._entity_ids, ids)
        for gpu in lost - self._lost:
            self._mark_lost(gpu, t, scrape)
        return values

    def _processes(self, scrape: Scrape) -> dict[int, tuple[ProcessRecord, ...]]:
        if self._nvml is None:
            return {}
        by_uuid = self._nvml.processes_by_uuid(scrape)
        return {self._uuid_gpu[u]: procs for u, procs in by_uuid.items() if u in self._uuid_gpu}

    # Health events carry no code: DCGM's statuses are negative and the wire's code is unsigned; the
    # detail names the status instead.
    def _mark_lost(self, gpu: int, t: float, scrape: Scrape) -> None:
        self._lost.add(gpu)
        scrape.health.append(HealthRecord(gpu, t, HealthKind.GPU_LOST,
                                          "DCGM: GPU is lost (DCGM_ST_GPU_IS_LOST); the other GPUs keep being "
                                          "sampled"))
        self._read_list(self._session, [g for g in self._gpus if g not in self._lost])

    # -- the host engine going and coming back ----------------------------------------------------
    def _lose(self, t: float, exc, scrape: Scrape) -> None:
        sess, self._session = self._session, None
        self._disconnect(sess)
        self._down_since, self._down_reason = t, f"{exc} ({status_name(self._b.structs, exc.value)})"
        self._backoff = self.config.reconnect_initial_s
        self._next_attempt = self._monotonic() + self._backoff
        self._paused = False              # a restarted host engine is not paused; the reconnect pauses again
        log.warning("DCGM host engine lost; reconnecting", where=self.where, error=self._down_reason)
        nvml = "processes still come from NVML" if self._nvml is not None else "nothing else comes meanwhile"
        for gpu in self._gpus:
            if gpu not in self._lost:
                scrape.health.append(HealthRecord(
                    gpu, t, HealthKind.SOURCE_ERROR,
                    f"DCGM: lost the {self.where} ({self._down_reason}): device and profiling metrics stop "
                    f"until it is back, {nvml}; reconnecting every {self.config.reconnect_initial_s:g}-"
                    f"{self.config.reconnect_max_s:g} s"))

    def _reconnect(self, t: float, scrape: Scrape) -> None:
        if self._monotonic() < self._next_attempt:
            return
        s = self._b.structs
        lost_before = set(self._lost)
        try:
            sess = self._open()
        except s.DCGMError as exc:
            scrape.count_error(f"dcgm.reconnect: {exc}")
            self._backoff = min(self._backoff * 2, self.config.reconnect_max_s)
            self._next_attempt = self._monotonic() + self._backoff
            return
        self._session = sess
        for gpu in sorted(self._lost - lost_before):
            scrape.health.append(HealthRecord(gpu, t, HealthKind.GPU_LOST, f"DCGM: the {self.where} came back "
                                              "without this GPU; the other GPUs keep being sampled"))
        if self._pauses:
            self._apply_pause(True, t)
        down = t - (self._down_since or t)
        watched = sorted(g for g, why in sess.profiling.items() if why is None)
        refused = sorted(g for g, why in sess.profiling.items() if why is not None)
        prof = (f"profiling watched on GPU {', '.join(map(str, watched))}" if watched else "no profiling") + \
            (f", not on GPU {', '.join(map(str, refused))}" if watched and refused else "")
        for gpu in self._gpus:
            if gpu not in self._lost:
                scrape.health.append(HealthRecord(gpu, t, HealthKind.RECOVERED,
                                                  f"DCGM: {self.where} back after {down:.0f} s; every field "
                                                  f"watched again ({prof})"))
        self._down_since, self._down_reason = None, ""
        log.info("DCGM host engine back; fields watched again", where=self.where, down_s=round(down, 1),
                 profiling=prof)

    def _retry_profiling(self, scrape: Scrape) -> None:
        sess = self._session
        due = [g for g, at in sess.retry_at.items() if at <= self._monotonic() and g not in self._lost]
        if not due:
            return
        try:
            for gpu in due:
                self._watch_profiling(sess, gpu)
        except self._b.structs.DCGMError as exc:        # only a lost connection comes out
            self._lose(self._clock(), exc, scrape)
            return
        self._read_list(sess, [g for g in self._gpus if g not in self._lost])

    def _disconnect(self, sess: _Session | None) -> None:
        if sess is None:
            return
        b = self._b
        try:
            if self.config.address is None:
                b.agent.dcgmStopEmbedded(sess.handle)
            else:
                b.agent.dcgmDisconnect(sess.handle)
        except b.structs.DCGMError:
            pass                          # a connection already gone has nothing to close

    def _hand_on(self, scrape: Scrape) -> None:
        pending, self._pending = self._pending, Scrape()
        scrape.health.extend(pending.health)
        for key, n in pending.errors.items():
            scrape.errors[key] = scrape.errors.get(key, 0) + n

    # -- the slow path ---------------------------------------------------------------------------
    def scrape_slow(self) -> Scrape:
        """Energy, power limit, PCIe replays, ECC; the host engine's reconnect is the fast path's."""
        scrape = Scrape()
        t = self._clock()
        with self._lock:
            if self._session is None:
                return scrape
            values = self._latest(self._slow, t, scrape)
            try:
                for gpu in sorted(self._busy - self._lost):
                    # the link while the GPU works: an idle link rests at Gen1
                    link = self._pcie_link(self._session, gpu)
                    self._info[gpu] = with_busy_link(self._info[gpu], link.get(PCIE_LINK[0]),
                                                     link.get(PCIE_LINK[1]))
            except self._b.structs.DCGMError as exc:      # the connection: the fast path reconnects
                scrape.count_error(f"dcgm.pcie_link: {exc}")
        for gpu, v in sorted(values.items()):
            self._ecc_health(gpu, t, v, scrape)
            scrape.samples.append(GpuSample(gpu, t, v))
        return scrape

    def _ecc_health(self, gpu: int, t: float, values: dict[str, float], scrape: Scrape) -> None:
        unc = values.get(_ECC_UNCORRECTED)
        if unc is None:
            return
        before = self._ecc.get(gpu)
        if before is not None and unc > before:
            scrape.health.append(HealthRecord(gpu, t, HealthKind.ECC_UNCORRECTED,
                                              f"{int(unc - before)} new uncorrected ECC errors", int(unc)))
        self._ecc[gpu] = unc

    # -- deep captures ------------------------------------------------------------------------------
    def pause_profiling(self) -> None:
        """Before a deep capture: DCGM's profiling lets go of the counters the
        capture's profiler needs. Captures may overlap: the last resume
        resumes. A no-op when no GPU's profiling is watched."""
        with self._lock:
            self._pauses += 1
            if self._pauses == 1:
                self._apply_pause(True, self._clock())

    def resume_profiling(self) -> None:
        with self._lock:
            if self._pauses == 0:
                return
            self._pauses -= 1
            if self._pauses == 0 and self._paused:
                self._apply_pause(False, self._clock())

    def _apply_pause(self, pause: bool, t: float) -> None:
        b, sess = self._b, self._session
        s = b.structs
        if sess is None or not any(why is None for why in sess.profiling.values()):
            return
        try:
            (b.agent.dcgmProfPause if pause else b.agent.dcgmProfResume)(sess.handle)
        except s.DCGMError as exc:
            if exc.value == s.DCGM_ST_NOT_SUPPORTED:
                # Hopper and newer: DCGM reads profiling through GPM and refuses to pause it
                self._pause_note = ("DCGM does not pause profiling it reads through GPM (Hopper and newer); "
                                    "captures run beside its watches")
            elif exc.value == s.DCGM_ST_CONNECTION_NOT_VALID:
                self._lose(t, exc, self._pending)
            else:
                self._pending.count_error(f"dcgm.{'pause' if pause else 'resume'}: {exc}")
            return
        self._paused = pause

    @property
    def pause_note(self) -> str:
        """Why a pause asked for did not happen, when DCGM said so."""
        return self._pause_note

    def close(self) -> None:
        with self._lock:
            if self._paused:              # the pause is the host engine's, not our connection's
                self._pauses = 1
                self.resume_profiling()
            sess, self._session = self._session, None
            if self._b is not None:
                self._disconnect(sess)
        if self._nvml is not None:
            self._nvml.close()


def _usec(seconds: float) -> int:
    return max(1, int(seconds * 1e6))


def parse_source(spec: str, environ: dict | None = None) -> str | None:
    """--source dcgm -> $DCGM_HOSTENGINE or None (embedded); dcgm:HOST[:PORT] -> HOST:PORT."""
    env = os.environ if environ is None else environ
    given = spec.removeprefix("dcgm:") if spec.startswith("dcgm:") else (env.get(ENV_HOSTENGINE) or "")
    if not given:
        return None
    what = f"--source {spec}" if spec.startswith("dcgm:") else f"{ENV_HOSTENGINE}={given}"
    host, sep, port = given.rpartition(":")
    if not sep or host.endswith(":"):               # no port, or a bare IPv6 address
        host, port = given, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SourceUnavailable(f"{what}: expected HOST or HOST:PORT (nv-hostengine listens on {DEFAULT_PORT} "
                                f"unless told otherwise), e.g. dcgm:127.0.0.1:{DEFAULT_PORT}")
    return f"{host}:{int(port)}"


def start_dcgm(spec: str, environ: dict | None = None, processes: NvmlCollector | None = None) -> DcgmCollector:
    """The collector `--source dcgm[:HOST[:PORT]]` asks for, started: raises
    SourceUnavailable with what to do when it cannot start. `processes`: the
    NVML collector (GPM off) its processes come from."""
    collector = DcgmCollector(DcgmConfig(address=parse_source(spec, environ)), processes=processes)
    collector.start()
    return collector


def _text(v) -> str:
    """A fixed-size char field of DCGM's structs as text (bindings give bytes or str)."""
    return (v.decode(errors="replace") if isinstance(v, bytes) else str(v or "")).rstrip("\x00")
