"""NVML/GPM collector: the only module that imports `pynvml`.

Every NVML call goes through one choke point (`_Device.call`) that remembers
NotSupported per device and call, turns GPU_IS_LOST into a health event, and
counts other errors instead of raising them. The fast path (every tick) holds
only calls measured at a few microseconds on an H200, plus the GPM metric
computation (~1.5 ms, the one costly call we keep because it is the only
source of SM/tensor/DRAM activity). Energy (4.3 ms), the HW thermal and power
brake counters (~0.7 ms each), PCIe replays, ECC and XID events run on the
slow path (`scrape_slow`, every `slow_interval_s`). nvmlDeviceGetPcieThroughput
(21 ms, it sleeps) is never called: the PCIe byte counters and GPM give the
same rates for free.
"""
from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import numpy as np

from . import catalogue as cat
from .attribution import Attributor
from .procstat import ProcStat
from .network import sysfs_bus_id
from .nvlink import NvLinks
from .records import BUSY_UTIL, DeviceInfo, GpuSample, HealthKind, HealthRecord, ProcessRecord, Scrape, with_busy_link


class SourceUnavailable(RuntimeError):
    """The data source cannot start; the message says what to do."""


# (field id, scope) -> metric. Scope 0xFFFFFFFF = all NVLink links.
FAST_FIELDS: tuple[tuple[int, int | None, str], ...] = (
    (186, None, "power_instant_watts"),
    (197, None, "pcie_tx_bytes_total"),
    (198, None, "pcie_rx_bytes_total"),
    (138, 0xFFFFFFFF, "nvlink_tx_bytes_total"),
    (139, 0xFFFFFFFF, "nvlink_rx_bytes_total"),
    (82, None, "mem_temp_celsius"),
    (74, None, "throttle_sw_power_cap_seconds_total"),
    (76, None, "throttle_sync_boost_seconds_total"),
    (269, None, "throttle_sw_thermal_seconds_total"),
)
SLOW_FIELDS: tuple[tuple[int, int | None, str], ...] = (
    (83, None, "energy_joules_total"),
    (270, None, "throttle_hw_thermal_seconds_total"),
    (271, None, "throttle_hw_power_brake_seconds_total"),
    (94, None, "pcie_replay_total"),
)
GPM_METRICS: tuple[tuple[int, str], ...] = (
    (1, "gpm_graphics_util_ratio"), (2, "gpm_sm_util_ratio"), (3, "gpm_sm_occupancy_ratio"),
    (4, "gpm_integer_util_ratio"), (5, "gpm_tensor_util_ratio"), (7, "gpm_hmma_util_ratio"),
    (10, "gpm_dram_bw_util_ratio"), (12, "gpm_fp32_util_ratio"), (13, "gpm_fp16_util_ratio"),
    (20, "gpm_pcie_tx_bytes_per_second"), (21, "gpm_pcie_rx_bytes_per_second"),
    (60, "gpm_nvlink_rx_bytes_per_second"), (61, "gpm_nvlink_tx_bytes_per_second"),
)
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing",
                 7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"}
_NOT_SUPPORTED, _GPU_IS_LOST, _TIMEOUT = 3, 15, 10
_M = cat.BY_NAME


@dataclass(frozen=True)
class NvmlConfig:
    gpm: bool = True                 # GPM metrics on Hopper and newer
    processes: bool = True           # compute processes + their host CPU
    slow_interval_s: float = 10.0


class _Lost(Exception):
    pass


def load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # the package is a dependency; a broken env is the cause
        raise SourceUnavailable(
            "cannot import pynvml (package nvidia-ml-py): reinstall gpuscope, "
            "or run with --source replay:FILE") from exc
    return pynvml


def _struct_dtype(struct: type, fields: dict[str, str]) -> np.dtype:
    """A numpy view of a ctypes structure, so a whole array of NVML results is
    read at once instead of through pynvml's per-attribute __getattribute__."""
    return np.dtype({"names": list(fields), "formats": list(fields.values()),
                     "offsets": [getattr(struct, f).offset for f in fields], "itemsize": ctypes.sizeof(struct)})




_FIELD_ROW: struct.Struct | None = None
_UNION = {0: struct.Struct("<d"), 1: struct.Struct("<I"), 2: struct.Struct("<Q"), 3: struct.Struct("<Q"),
          4: struct.Struct("<q"), 5: struct.Struct("<i"), 6: struct.Struct("<H")}


def _field_rows(out: Any) -> list[tuple[int, float | None]]:
    """(nvmlReturn, value) of every entry of a field-values array, unpacked in
    one pass over its bytes instead of through pynvml's attribute hooks."""
    global _FIELD_ROW
    if _FIELD_ROW is None:
        t = type(out[0])
        vt, ret, val = t.valueType.offset, t.nvmlReturn.offset, t.value.offset
        assert ret == vt + 4 and val == ret + 4, "unexpected nvmlFieldValue_t layout"
        _FIELD_ROW = struct.Struct(f"<{vt}xII8s{ctypes.sizeof(t) - val - 8}x")
    rows = []
    for kind, ret, raw in _FIELD_ROW.iter_unpack(bytes(out)):
        u = _UNION.get(kind)
        rows.append((ret, u.unpack_from(raw)[0] if u is not None else None))
    return rows


def handle_key(handle: Any) -> int:
    """A stable integer for an NVML device handle (ctypes pointers compare by identity)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class _Device:
    """One GPU: its handle, what it does not support, its GPM sample pair."""

    def __init__(self, nvml: ModuleType, index: int, handle: Any):
        self.nvml = nvml
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.lost = False
        self.info = DeviceInfo(gpu=index)
        self.fast_fields = list(FAST_FIELDS)
        self.slow_fields = list(SLOW_FIELDS)
        self.gpm_pair: list[Any] | None = None
        self.gpm_get: Any = None
        self.gpm_primed = False
        self.gpm_names: list[str] = []
        self.gpm_view: np.ndarray | None = None
        self.gpm_scale: np.ndarray | None = None
        self.ecc_uncorrected: float | None = None
        self.busy = False          # utilisation >= BUSY_UTIL at the last fast reading
        self.nvlinks = NvLinks(nvml, handle, _field_rows)

    def call(self, key: str, scrape: Scrape, fn: Callable, *args):
        """Call NVML; None when not available (never 0). Raises _Lost."""
        if key in self.unsupported:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == _NOT_SUPPORTED:
                self.unsupported.add(key)
            elif code == _GPU_IS_LOST:
                raise _Lost(str(exc)) from exc
            else:
                scrape.count_error(f"gpu{self.index}.{key}: {exc}")
            return None

    def fields(self, spec: list, values: dict[str, float], scrape: Scrape) -> None:
        if not spec:
            return
        req = [f if scope is None else (f, scope) for f, scope, _ in spec]
        out = self.call("field_values", scrape, self.nvml.nvmlDeviceGetFieldValues, self.handle, req)
        if out is None:
            return
        dropped = []
        for (fid, scope, name), (ret, raw) in zip(spec, _field_rows(out)):
            if ret == 0:
                if raw is not None:
                    values[name] = raw * _M[name].scale
            elif ret == _NOT_SUPPORTED:
                dropped.append(fid)
            elif ret == _GPU_IS_LOST:
                raise _Lost(f"field {fid}")
            else:
                scrape.count_error(f"gpu{self.index}.field{fid}: return {ret}")
        if dropped:  # remember per device: never ask for them again
            spec[:] = [s for s in spec if s[0] not in dropped]


class NvmlCollector:
    """Samples every GPU of the host through NVML."""

    def __init__(self, config: NvmlConfig = NvmlConfig(), nvml: ModuleType | None = None,
                 procstat: ProcStat | None = None, clock: Callable[[], float] = time.time,
                 attribution: Attributor | None = None):
        """attribution: whose each GPU process is (None: not asked)."""
        self.config = config
        self._nvml = nvml
        self._proc = procstat or ProcStat()
        self._attribution = attribution
        self._clock = clock
        self._devices: list[_Device] = []
        self._events: Any = None
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()   # fast and slow scrapes share device state

    # -- start-up: fail fast with a message that says what to do ----------------
    def start(self) -> None:
        n = self._nvml = self._nvml or load_pynvml()
        try:
            n.nvmlInit()
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            hint = {12: "the NVIDIA driver library libnvidia-ml.so.1 is not installed or not on the library path",
                    9: "the NVIDIA kernel driver is not loaded",
                    4: "no permission to open the GPU device files"}.get(code, "NVML failed to initialise")
            raise SourceUnavailable(f"NVML: {exc} ({hint}); on a machine without a GPU run "
                                    "with --source replay:FILE") from exc
        if count == 0:
            raise SourceUnavailable("NVML found no GPU; run with --source replay:FILE")
        scrape = Scrape()
        for i in range(count):
            dev = _Device(n, i, n.nvmlDeviceGetHandleByIndex(i))
            self._handles[handle_key(dev.handle)] = i
            self._describe(dev, scrape)
            self._devices.append(dev)
        self._start_events()

    def _describe(self, dev: _Device, scrape: Scrape) -> None:
        n, h = self._nvml, dev.handle
        name = dev.call("name", scrape, n.nvmlDeviceGetName, h)
        uuid = dev.call("uuid", scrape, n.nvmlDeviceGetUUID, h)
        arch = dev.call("architecture", scrape, n.nvmlDeviceGetArchitecture, h)
        mem = dev.call("memory_info", scrape, n.nvmlDeviceGetMemoryInfo, h)
        limit = dev.call("power_limit", scrape, n.nvmlDeviceGetEnforcedPowerLimit, h)
        gen = dev.call("pcie_gen", scrape, n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        width = dev.call("pcie_width", scrape, n.nvmlDeviceGetCurrPcieLinkWidth, h)
        max_gen = dev.call("pcie_max_gen", scrape, n.nvmlDeviceGetMaxPcieLinkGeneration, h)
        max_width = dev.call("pcie_max_width", scrape, n.nvmlDeviceGetMaxPcieLinkWidth, h)
        pci = dev.call("pci_info", scrape, n.nvmlDeviceGetPciInfo_v3, h)
        gpm = False
        if self.config.gpm:
            support = dev.call("gpm_support", scrape, n.nvmlGpmQueryDeviceSupport, h)
            gpm = bool(support is not None and support.isSupportedDevice)
            if gpm:
                dev.gpm_pair = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
                mg = n.c_nvmlGpmMetricsGet_t()
                mg.version = n.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = len(GPM_METRICS)
                for i, (mid, _) in enumerate(GPM_METRICS):
                    mg.metrics[i].metricId = mid
                dev.gpm_get = mg
                dev.gpm_names = [name for _, name in GPM_METRICS]
                metric_t = type(mg.metrics[0])
                dt = _struct_dtype(metric_t, {"nvmlReturn": "<u4", "value": "<f8"})
                dev.gpm_view = np.frombuffer(mg.metrics, dtype=dt, count=len(GPM_METRICS))
                dev.gpm_scale = np.array([_M[name].scale for name in dev.gpm_names])
        dev.info = DeviceInfo(
            gpu=dev.index, uuid=uuid or "", name=name or "",
            architecture=ARCHITECTURES.get(arch, "") if arch is not None else "",
            memory_total_bytes=getattr(mem, "total", None),
            power_limit_watts=cat.normalise(_M["power_limit_watts"], limit) if limit is not None else None,
            pcie_generation=gen, pcie_width=width, pcie_max_generation=max_gen, pcie_max_width=max_width,
            driver_version=self.driver_version() or "", gpm_supported=gpm, pci_bus_id=sysfs_bus_id(pci),
            source="nvml (GPM)" if gpm else "nvml (no GPM: utilisation ratios only)")

    def _start_events(self) -> None:
        n = self._nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError:
            self._events = None
            return
        for dev in self._devices:
            try:
                n.nvmlDeviceRegisterEvents(dev.handle, n.nvmlEventTypeXidCriticalError, self._events)
            except n.NVMLError:
                dev.unsupported.add("xid_events")

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devices]

    def driver_version(self) -> str | None:
        """The NVIDIA driver's version (a calibration records it); None where NVML will not say."""
        get = getattr(self._nvml, "nvmlSystemGetDriverVersion", None)
        try:
            v = get() if get is not None else None
        except self._nvml.NVMLError:
            return None
        return v.decode() if isinstance(v, bytes) else v

    # -- the fast path ------------------------------------------------------------
    def scrape(self) -> Scrape:
        scrape = Scrape()
        t = self._clock()
        live_pids: set[int] = set()
        with self._lock:
            for dev in self._devices:
                if dev.lost:
                    continue
                try:
                    scrape.samples.append(self._sample(dev, t, scrape, live_pids))
                except _Lost as exc:
                    self._mark_lost(dev, t, str(exc), scrape)
        if self.config.processes:
            self._proc.forget_except(live_pids)
            if self._attribution is not None:
                self._attribution.forget_except(live_pids)
        return scrape

    def _sample(self, dev: _Device, t: float, scrape: Scrape, live_pids: set[int]) -> GpuSample:
        n, h, call = self._nvml, dev.handle, dev.call
        values: dict[str, float] = {}
        util = call("utilization", scrape, n.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["util_gpu_ratio"] = util.gpu * cat.PERCENT
            values["util_mem_ratio"] = util.memory * cat.PERCENT
            dev.busy = util.gpu * cat.PERCENT >= BUSY_UTIL
        mem = call("memory_info", scrape, n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            values["mem_used_bytes"] = float(mem.used)
            values["mem_total_bytes"] = float(mem.total)
        v = call("power", scrape, n.nvmlDeviceGetPowerUsage, h)
        if v is not None:
            values["power_watts"] = v * cat.MILLI
        v = call("sm_clock", scrape, n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        if v is not None:
            values["sm_clock_hertz"] = v * cat.MEGA
        v = call("mem_clock", scrape, n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)
        if v is not None:
            values["mem_clock_hertz"] = v * cat.MEGA
        v = call("temperature", scrape, n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        if v is not None:
            values["temp_celsius"] = float(v)
        v = call("clock_reasons", scrape, n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if v is not None:
            values["clock_event_reasons"] = float(v)
        dev.fields(dev.fast_fields, values, scrape)
        if dev.gpm_get is not None:
            self._gpm(dev, values, scrape)
        procs: tuple[ProcessRecord, ...] = ()
        if self.config.processes:
            raw = call("processes", scrape, n.nvmlDeviceGetComputeRunningProcesses, h)
            if raw is not None:
                procs = tuple(self._process(p, dev, live_pids) for p in raw)
                values["procs_count"] = float(len(procs))
                cpus = [p.cpu_cores for p in procs if p.cpu_cores is not None]
                if cpus:
                    values["procs_cpu_cores"] = sum(cpus)
        return GpuSample(dev.index, t, values, procs)

    def processes_by_uuid(self, scrape: Scrape) -> dict[str, tuple[ProcessRecord, ...]]:
        """Each GPU's compute processes and their host CPU, keyed by GPU UUID:
        the process path alone, for a collector that takes the devices'
        metrics elsewhere (DCGM numbers GPUs its own way, so UUIDs match
        them). A GPU NVML finds lost is left out without a health event:
        the other source reports its GPUs' health under its own numbers."""
        out: dict[str, tuple[ProcessRecord, ...]] = {}
        live_pids: set[int] = set()
        n = self._nvml
        with self._lock:
            for dev in self._devices:
                if dev.lost or not dev.info.uuid:
                    continue
                try:
                    raw = dev.call("processes", scrape, n.nvmlDeviceGetComputeRunningProcesses, dev.handle)
                except _Lost:
                    dev.lost = True
                    continue
                if raw is not None:
                    out[dev.info.uuid] = tuple(self._process(p, dev, live_pids) for p in raw)
        self._proc.forget_except(live_pids)
        return out

    def _process(self, p: Any, dev: _Device, live_pids: set[int]) -> ProcessRecord:
        pid = p.pid
        live_pids.add(pid)
        cpu = self._proc.cpu_cores(pid)
        attribution = None
        if self._attribution is not None:
            # the start time was read with the CPU: it tells a reused pid from the process it had
            attribution = self._attribution.of(pid, self._proc.started(pid), dev.info.uuid, dev.index)
        return ProcessRecord(pid=pid, used_memory_bytes=p.usedGpuMemory, cpu_cores=cpu,
                             command=self._proc.command(pid), attribution=attribution)

    def _gpm(self, dev: _Device, values: dict[str, float], scrape: Scrape) -> None:
        n, pair, mg = self._nvml, dev.gpm_pair, dev.gpm_get
        if dev.call("gpm_sample", scrape, n.nvmlGpmSampleGet, dev.handle, pair[1]) is None:
            dev.gpm_primed = False
            return
        if dev.gpm_primed:  # a metric is a rate between two samples
            mg.sample1, mg.sample2 = pair[0], pair[1]
            if dev.call("gpm_metrics", scrape, n.nvmlGpmMetricsGet, mg) is not None:
                view = dev.gpm_view   # numpy view on the struct NVML just filled
                ok = view["nvmlReturn"] == 0
                scaled = (view["value"] * dev.gpm_scale).tolist()
                for name, good, v in zip(dev.gpm_names, ok.tolist(), scaled):
                    if good:
                        values[name] = v
        pair.reverse()
        dev.gpm_primed = True

    def _mark_lost(self, dev: _Device, t: float, detail: str, scrape: Scrape) -> None:
        dev.lost = True
        dev.info = dataclasses.replace(dev.info, lost=True)
        scrape.health.append(HealthRecord(dev.index, t, HealthKind.GPU_LOST,
                                          f"NVML: GPU is lost ({detail}); the other GPUs keep being sampled",
                                          _GPU_IS_LOST))

    # -- the slow path: costly counters, ECC and XID ---------------------------------
    def scrape_slow(self) -> Scrape:
        scrape = Scrape()
        t = self._clock()
        n = self._nvml
        with self._lock:
            for dev in self._devices:
                if dev.lost:
                    continue
                values: dict[str, float] = {}
                try:
                    dev.fields(dev.slow_fields, values, scrape)
                    v = dev.call("power_limit", scrape, n.nvmlDeviceGetEnforcedPowerLimit, dev.handle)
                    if v is not None:
                        values["power_limit_watts"] = v * cat.MILLI
                    self._ecc(dev, t, values, scrape)
                    dev.nvlinks.read(t, values, lambda key, fn, *args, d=dev: d.call(key, scrape, fn, *args))
                    if dev.busy:
                        self._busy_link(dev, scrape)
                except _Lost as exc:
                    self._mark_lost(dev, t, str(exc), scrape)
                    continue
                if values:
                    scrape.samples.append(GpuSample(dev.index, t, values))
            self._drain_xid(t, scrape)
        return scrape

    def _busy_link(self, dev: _Device, scrape: Scrape) -> None:
        """The link as it is while the GPU works, the best seen so far: at
        idle a link drops to Gen1 to save power, so the start-up reading
        cannot tell a link that trained down from one that is resting."""
        n = self._nvml
        gen = dev.call("pcie_gen", scrape, n.nvmlDeviceGetCurrPcieLinkGeneration, dev.handle)
        width = dev.call("pcie_width", scrape, n.nvmlDeviceGetCurrPcieLinkWidth, dev.handle)
        dev.info = with_busy_link(dev.info, gen, width)

    def _ecc(self, dev: _Device, t: float, values: dict[str, float], scrape: Scrape) -> None:
        n = self._nvml
        unc = dev.call("ecc_uncorrected", scrape, n.nvmlDeviceGetTotalEccErrors, dev.handle,
                       n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        if unc is None:
            return
        values["ecc_uncorrected_total"] = float(unc)
        if dev.ecc_uncorrected is not None and unc > dev.ecc_uncorrected:
            scrape.health.append(HealthRecord(dev.index, t, HealthKind.ECC_UNCORRECTED,
                                              f"{int(unc - dev.ecc_uncorrected)} new uncorrected ECC errors",
                                              int(unc)))
        dev.ecc_uncorrected = unc
        cor = dev.call("ecc_corrected", scrape, n.nvmlDeviceGetTotalEccErrors, dev.handle,
                       1 - n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        if cor is not None:
            values["ecc_corrected_total"] = float(cor)

    def _drain_xid(self, t: float, scrape: Scrape) -> None:
        n = self._nvml
        if self._events is None:
            return
        for _ in range(1000):   # bounded: an XID storm must not stall the slow path
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) != _TIMEOUT:
                    scrape.count_error(f"xid_events: {exc}")
                return
            gpu = self._handles.get(handle_key(data.device))
            if gpu is None:
                continue
            scrape.health.append(HealthRecord(gpu, t, HealthKind.XID, f"Xid {data.eventData}",
                                              int(data.eventData)))

    def close(self) -> None:
        n = self._nvml
        if n is None:
            return
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except n.NVMLError:
            pass
