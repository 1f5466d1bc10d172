"""A fake of the pynvml module for machines without a GPU.

Devices are declared as data (`FakeGpu`). Every function has pynvml's name
and signature, returns pynvml's own ctypes structures, and fails the way the
real library does: by raising the real `pynvml.NVMLError` subclasses
(NotSupported, GpuIsLost, LibraryNotFound, Timeout). Calls cost nothing, so
benchmarks that use it measure only our code.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as real

NOT_SUPPORTED, GPU_IS_LOST, LIB_NOT_FOUND, TIMEOUT, UNKNOWN = (
    real.NVML_ERROR_NOT_SUPPORTED, real.NVML_ERROR_GPU_IS_LOST, real.NVML_ERROR_LIBRARY_NOT_FOUND,
    real.NVML_ERROR_TIMEOUT, real.NVML_ERROR_UNKNOWN)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    arch: int = real.NVML_DEVICE_ARCH_HOPPER
    memory_total: int = 150_754_820_096
    memory_used: int = 2_000_000_000
    util_gpu: int = 0                  # percent, as NVML reports
    util_mem: int = 0
    power_mw: int = 120_000
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 3201
    temp_c: int = 40
    clock_reasons: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pci_bus_id: str = ""               # NVML's form, "00000000:3B:00.0"; "" = by index
    # NVLink per link: None = no NVLink (every link's state NotSupported, as the bundled H200's);
    # else link -> {"up": bool, "tx_kib": int, "rx_kib": int, "errors": [replay, recovery, crc_flit, crc_data]}
    nvlinks: dict[int, dict] | None = None
    nvlink_version: int = 4
    # field id -> raw value (NVML units); ids absent here answer NOT_SUPPORTED
    fields: dict[int, float] = field(default_factory=lambda: {
        186: 120_000, 197: 0, 198: 0, 82: 35, 74: 0, 76: 0, 269: 0, 83: 1_000_000, 270: 0, 271: 0, 94: 0})
    gpm: bool = True
    # GPM metric id -> value (percent or MiB/s); ids absent answer NOT_SUPPORTED per metric
    gpm_values: dict[int, float] = field(default_factory=lambda: {
        1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 0.0, 7: 0.0, 10: 0.0, 12: 0.0, 13: 0.0, 20: 1.0, 21: 1.0, 60: 0.0, 61: 0.0})
    processes: list[tuple[int, int | None]] = field(default_factory=list)   # (pid, used bytes)
    unsupported: set[str] = field(default_factory=set)    # pynvml function names
    failing: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    xids: list[int] = field(default_factory=list)         # pending XID events


class FakeNvml:
    """Module-like: pass it where pynvml is expected."""
    NVMLError = real.NVMLError
    c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = real.NVML_GPM_METRICS_GET_VERSION
    NVML_CLOCK_SM, NVML_CLOCK_MEM = real.NVML_CLOCK_SM, real.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = real.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = real.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = real.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[FakeGpu], library_missing: bool = False, frozen: bool = False):
        """frozen=True: the specs will not change, so results are built once and
        replayed; calls then cost (almost) nothing, for overhead benchmarks."""
        self.gpus = gpus
        self.frozen = frozen
        self._cache: dict = {}
        self.library_missing = library_missing
        self.initialised = False
        self.calls = 0
        self._handles = [ctypes.c_void_p(0x1000 + i) for i in range(len(gpus))]
        self._gpm_owner: dict[int, int] = {}
        self._registered: set[int] = set()

    # -- plumbing ------------------------------------------------------------------------
    def _gpu(self, handle, fn: str) -> FakeGpu:
        self.calls += 1
        if not self.initialised:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        g = self.gpus[handle.value - 0x1000]
        if g.lost:
            raise real.NVMLError(GPU_IS_LOST)
        if fn in g.unsupported:
            raise real.NVMLError(NOT_SUPPORTED)
        if fn in g.failing:
            raise real.NVMLError(g.failing[fn])
        return g

    # -- library -----------------------------------------------------------------------
    def nvmlInit(self):
        if self.library_missing:
            raise real.NVMLError(LIB_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetCount(self):
        if not self.initialised:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[i]

    # -- static facts ----------------------------------------------------------------------
    def nvmlDeviceGetName(self, h):
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h):
        i = ctypes.cast(h, ctypes.c_void_p).value - 0x1000
        self._gpu(h, "nvmlDeviceGetUUID")
        return f"GPU-fake-{i:04d}"

    def nvmlDeviceGetArchitecture(self, h):
        return self._gpu(h, "nvmlDeviceGetArchitecture").arch

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_max_width

    def nvmlDeviceGetNvLinkState(self, h, link):
        return 1 if self._link(h, "nvmlDeviceGetNvLinkState", link)["up"] else 0

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        self._link(h, "nvmlDeviceGetNvLinkVersion", link)
        return self._gpu(h, "nvmlDeviceGetNvLinkVersion").nvlink_version

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        errors = self._link(h, "nvmlDeviceGetNvLinkErrorCounter", link)["errors"]
        if not 0 <= counter < len(errors):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return errors[counter]

    def _link(self, h, fn, link):
        g = self._gpu(h, fn)
        if g.nvlinks is None:
            raise real.NVMLError(NOT_SUPPORTED)
        if link not in g.nvlinks:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlinks[link]

    def nvmlDeviceGetPciInfo_v3(self, h):
        g = self._gpu(h, "nvmlDeviceGetPciInfo_v3")
        i = ctypes.cast(h, ctypes.c_void_p).value - 0x1000
        info = real.nvmlPciInfo_t()
        info.busId = (g.pci_bus_id or f"00000000:{0x18 + i:02X}:00.0").encode()
        return info

    # -- fast path ---------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return real.c_nvmlUtilization_t(g.util_gpu, g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        m = real.c_nvmlMemory_t()
        m.total, m.used, m.free = g.memory_total, g.memory_used, g.memory_total - g.memory_used
        return m

    def nvmlDeviceGetPowerUsage(self, h):
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, h, kind):
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return g.sm_clock_mhz if kind == real.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._gpu(h, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for pid, used in g.processes]

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        if self.frozen:
            key = (h.value, tuple(field_ids))
            if key not in self._cache:
                self._cache[key] = bytes(self._field_values(g, field_ids))
            values = (real.c_nvmlFieldValue_t * len(field_ids))()
            ctypes.memmove(values, self._cache[key], len(self._cache[key]))
            return values
        return self._field_values(g, field_ids)

    def _field_values(self, g, field_ids):
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = values[i]
            v.fieldId, v.scopeId = fid, scope
            if fid in (138, 139) and scope != 0xFFFFFFFF and isinstance(field_ids[i], tuple):
                link = (g.nvlinks or {}).get(scope)       # one link's data, KiB
                if link is None:
                    v.nvmlReturn = NOT_SUPPORTED
                    continue
                v.nvmlReturn, v.valueType = 0, real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(link["tx_kib" if fid == 138 else "rx_kib"])
                continue
            if fid not in g.fields:
                v.nvmlReturn = NOT_SUPPORTED
                continue
            v.nvmlReturn = 0
            raw = g.fields[fid]
            if isinstance(raw, float) and not raw.is_integer():
                v.valueType, v.value.dVal = real.NVML_VALUE_TYPE_DOUBLE, raw
            else:
                v.valueType, v.value.ullVal = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(raw)
        return values

    # -- GPM ------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        g = self._gpu(h, "nvmlGpmQueryDeviceSupport")
        s = real.c_nvmlGpmSupport_t()
        s.isSupportedDevice = 1 if g.gpm else 0
        return s

    def nvmlGpmSampleAlloc(self):
        return ctypes.pointer(real.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleGet(self, h, sample):
        self._gpu(h, "nvmlGpmSampleGet")
        self._gpm_owner[ctypes.addressof(sample.contents)] = ctypes.cast(h, ctypes.c_void_p).value - 0x1000
        return sample

    def nvmlGpmMetricsGet(self, mg):
        self.calls += 1
        gi = self._gpm_owner.get(ctypes.addressof(mg.sample2.contents))
        if gi is None or self._gpm_owner.get(ctypes.addressof(mg.sample1.contents)) != gi:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[gi]
        if g.lost:
            raise real.NVMLError(GPU_IS_LOST)
        if self.frozen and gi in self._cache:
            ctypes.memmove(mg.metrics, self._cache[gi], len(self._cache[gi]))
            return mg
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in g.gpm_values:
                m.nvmlReturn, m.value = 0, g.gpm_values[m.metricId]
            else:
                m.nvmlReturn = NOT_SUPPORTED
        if self.frozen:
            self._cache[gi] = bytes(mg.metrics)[: ctypes.sizeof(real.c_nvmlGpmMetric_t) * mg.numMetrics]
        return mg

    # -- slow path ----------------------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        return g.ecc_uncorrected if error_type == real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else g.ecc_corrected

    def nvmlEventSetCreate(self):
        return ctypes.c_void_p(0xE7E47)

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        self._gpu(h, "nvmlDeviceRegisterEvents")
        self._registered.add(ctypes.cast(h, ctypes.c_void_p).value - 0x1000)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        for i, g in enumerate(self.gpus):
            if i in self._registered and g.xids:
                data = real.c_nvmlEventData_t()
                data.device = ctypes.cast(self._handles[i], real.c_nvmlDevice_t)
                data.eventType = real.nvmlEventTypeXidCriticalError
                data.eventData = g.xids.pop(0)
                return data
        raise real.NVMLError(TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        pass


def h200(**overrides) -> FakeGpu:
    return FakeGpu(**overrides)


def older_gpu(**overrides) -> FakeGpu:
    """An Ampere-class GPU: no GPM, no HBM temperature, no power-instant field."""
    base = dict(name="NVIDIA A100-SXM4-80GB", arch=7, gpm=False,
                fields={197: 0, 198: 0, 74: 0, 76: 0, 83: 1_000, 94: 0})
    base.update(overrides)
    return FakeGpu(**base)
