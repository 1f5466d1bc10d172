"""DCGM fields, by name and by numeric id, mapped onto the metric catalogue.

One table for every reader of DCGM: dcgm-exporter scrapes saved to a file
(collectors/dcgm_exporter_saved.py), the live DCGM collector
(collectors/dcgm.py, by field id), and a live dcgm-exporter scraper (field
names). Ids and units
are DCGM's own (dcgm_fields.h / dcgm_fields.py of NVIDIA/DCGM); dcgm-exporter
names each metric after its field and keeps the field's unit.

A field with no catalogue metric is not read: readers list it as ignored,
as the nvidia-smi reader does with its columns. `NOT_READ` names the
fields people commonly export that look as if they should map but do not,
and why, so that the docs can say so.

On the profiling (DCP, `DCGM_FI_PROF_*`) fields and GPM: both read the same
performance monitors of the GPU, and the catalogue's `gpm_*` metrics are
what the rules read, so a DCGM ratio lands on its GPM twin. They are not
sampled alike: GPM's ratio is the mean over gpuscope's own sampling tick,
DCGM's the mean over DCGM's watch interval (dcgm-exporter's `-c`, 30 s by
default), so a scrape of dcgm-exporter every second repeats one 30 s
mean 30 times unless the exporter runs with `-c 1000`. The differences in
definition are noted field by field below.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import catalogue as cat

PERCENT, MEGA, MILLI, NANO, MIB = 0.01, 1e6, 1e-3, 1e-9, 1048576.0


@dataclass(frozen=True)
class Field:
    name: str           # DCGM's, e.g. DCGM_FI_DEV_GPU_UTIL: dcgm-exporter's metric name too
    id: int             # DCGM's numeric field id
    metric: str         # catalogue metric (collectors/catalogue.py)
    unit: str           # what DCGM reports
    scale: float = 1.0  # DCGM value * scale = the catalogue metric's unit


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", 100, "sm_clock_hertz", "MHz", MEGA),
    Field("DCGM_FI_DEV_MEM_CLOCK", 101, "mem_clock_hertz", "MHz", MEGA),
    # the bits are NVML's nvmlClocksEventReason bits, one for one (DCGM_CLOCKS_EVENT_REASON_*)
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 112, "clock_event_reasons", "bitmask"),
    Field("DCGM_FI_DEV_MEMORY_TEMP", 140, "mem_temp_celsius", "C"),
    Field("DCGM_FI_DEV_GPU_TEMP", 150, "temp_celsius", "C"),
    Field("DCGM_FI_DEV_POWER_USAGE", 155, "power_watts", "W"),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "energy_joules_total", "mJ", MILLI),
    Field("DCGM_FI_DEV_POWER_USAGE_INSTANT", 157, "power_instant_watts", "W"),
    # the limit the driver enforces after every limiter, as NVML's nvmlDeviceGetEnforcedPowerLimit
    Field("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 164, "power_limit_watts", "W"),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "pcie_replay_total", "count"),
    Field("DCGM_FI_DEV_GPU_UTIL", 203, "util_gpu_ratio", "%", PERCENT),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "util_mem_ratio", "%", PERCENT),
    Field("DCGM_FI_DEV_FB_TOTAL", 250, "mem_total_bytes", "MiB", MIB),
    Field("DCGM_FI_DEV_FB_USED", 252, "mem_used_bytes", "MiB", MIB),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 310, "ecc_corrected_total", "count"),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 311, "ecc_uncorrected_total", "count"),
    # Time in each clock-event reason, in ns (recent DCGM releases): NVML's counters of the same names, which
    # the catalogue's throttle_* metrics read.
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", 1420,
          "throttle_sw_power_cap_seconds_total", "ns", NANO),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_COUNT_NS", 1421,
          "throttle_sync_boost_seconds_total", "ns", NANO),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", 1422,
          "throttle_sw_thermal_seconds_total", "ns", NANO),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", 1423,
          "throttle_hw_thermal_seconds_total", "ns", NANO),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", 1424,
          "throttle_hw_power_brake_seconds_total", "ns", NANO),
    # Profiling fields: ratios 0-1 already (GPM reports percent; the catalogue keeps 0-1).
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gpm_graphics_util_ratio", "ratio"),
    # DCGM: cycles an SM has at least one warp assigned, averaged over the SMs; GPM: SMs busy
    # over all SMs, over its sampling period. The same quantity, told two ways.
    Field("DCGM_FI_PROF_SM_ACTIVE", 1002, "gpm_sm_util_ratio", "ratio"),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", 1003, "gpm_sm_occupancy_ratio", "ratio"),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gpm_tensor_util_ratio", "ratio"),
    # DCGM: cycles the memory interface is busy sending or receiving; GPM: bandwidth used over
    # peak. Not the same definition: they agree at idle and at a saturated HBM, and may differ
    # between, so a window near the compute/memory balance can tip the other way.
    Field("DCGM_FI_PROF_DRAM_ACTIVE", 1005, "gpm_dram_bw_util_ratio", "ratio"),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 1007, "gpm_fp32_util_ratio", "ratio"),
    # DCGM's FP16 pipe leaves HMMA (tensor) work out: that is in DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 1008, "gpm_fp16_util_ratio", "ratio"),
    # bytes/s, protocol headers included (DCGM's definition); GPM's are MiB/s, normalised to bytes/s
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, "gpm_pcie_tx_bytes_per_second", "B/s"),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, "gpm_pcie_rx_bytes_per_second", "B/s"),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", 1011, "gpm_nvlink_tx_bytes_per_second", "B/s"),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", 1012, "gpm_nvlink_rx_bytes_per_second", "B/s"),
    Field("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 1014, "gpm_hmma_util_ratio", "ratio"),
    Field("DCGM_FI_PROF_PIPE_INT_ACTIVE", 1016, "gpm_integer_util_ratio", "ratio"),
)

# Older names of the same fields (DCGM renamed "clock throttle reasons" to "clocks event reasons").
ALIASES: dict[str, str] = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}

# Fields that look as if they should map onto the catalogue and do not; readers list them as ignored.
NOT_READ: dict[str, str] = {
    "DCGM_FI_DEV_FB_FREE": "free framebuffer: the catalogue has used and total, and total is not used + free "
                           "(DCGM_FI_DEV_FB_RESERVED is the rest)",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "the limit set, not the one enforced (DCGM_FI_DEV_ENFORCED_POWER_LIMIT is read)",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": "deprecated; a 20 ms sample in KB/s that dcgm-exporter labels a counter: "
                                      "not a rate over the scrape (DCGM_FI_PROF_PCIE_TX_BYTES is read)",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": "as DCGM_FI_DEV_PCIE_TX_THROUGHPUT (DCGM_FI_PROF_PCIE_RX_BYTES is read)",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "transmitted and received together, in a unit DCGM does not state: "
                                          "DCGM_FI_PROF_NVLINK_TX_BYTES and _RX_BYTES are read",
    "DCGM_FI_DEV_POWER_VIOLATION": "documented in us by older DCGM and ns by newer, so a rate from it could be "
                                   "off by 1000; DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS is read",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "as DCGM_FI_DEV_POWER_VIOLATION; "
                                     "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS and "
                                     "_HW_THERM_SLOWDOWN_NS are read",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "the catalogue has no FP64 pipe metric (GPM's FP64 is not collected)",
    "DCGM_FI_DEV_XID_ERRORS": "the last XID seen, an event rather than a level (gpuscope's NVML collector "
                              "records XIDs as health events)",
}

# Fields a host engine older than DCGM 4.2.3 does not know (dcgm_fields.py of NVIDIA/DCGM gained them
# there): it refuses a field group that names one (DCGM_ST_BADPARAM), so a live reader watches the rest.
SINCE_4_2: frozenset[int] = frozenset({1420, 1421, 1422, 1423, 1424})

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS} | {old: {f.name: f for f in FIELDS}[new]
                                                           for old, new in ALIASES.items()}
BY_ID: dict[int, Field] = {f.id: f for f in FIELDS}


# DCGM's "no value" sentinels (dcgm_structs.h): DCGM_INT64_BLANK (0x7ffffffffffffff0) and the codes just
# above it (NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED), DCGM_FP64_BLANK (2^47) and those above it. Older
# dcgm-exporters write them as numbers (its README shows DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794,
# NOT_SUPPORTED); newer ones leave the sample out. Which one applies is the field's DCGM type: double for
# the watts and the profiling ratios read here, int64 for the rest (where 2^47 is a real value: a
# throttle counter in ns passes it after 39 hours).
INT64_BLANK, FP64_BLANK = float(0x7FFFFFFFFFFFFFF0), 2.0 ** 47
_DOUBLE_UNITS = ("W", "ratio")


def blank_at(field: Field) -> float:
    """The least raw value of this field that is DCGM's "no value", not a reading."""
    return FP64_BLANK if field.unit in _DOUBLE_UNITS else INT64_BLANK


def catalogue_metric(field: Field) -> cat.Metric:
    return cat.BY_NAME[field.metric]


def normalise(field: Field, raw: float) -> float:
    """A DCGM value -> the catalogue metric's unit."""
    return raw * field.scale if field.scale != 1.0 else float(raw)
