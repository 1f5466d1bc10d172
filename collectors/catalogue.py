"""The metric catalogue: every metric is declared once, with its unit and kind.

Units are normalised here and nowhere else: collectors hand raw vendor values
to `normalise`, which applies the declared scale. Internally ratios are 0-1,
sizes are bytes, rates bytes/s, times seconds, power watts, clocks hertz.
Names follow Prometheus conventions (unit suffix, `_total` for counters).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"   # cumulative; may wrap (wrap_bits) or reset
    RATIO = "ratio"       # gauge bounded to 0-1


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    kind: Kind
    help: str
    raw_unit: str          # what NVML and recordings report
    scale: float = 1.0     # raw * scale = value in `unit`
    csv: str | None = None  # column in samples.csv-style recordings
    wrap_bits: int | None = None
    slow: bool = False      # too costly for every tick (see collectors/nvml.py)


def _m(name, unit, kind, help, raw_unit, scale=1.0, csv=None, wrap_bits=None, slow=False):
    return Metric(name, unit, kind, help, raw_unit, scale, csv, wrap_bits, slow)


PERCENT, MILLI, MEGA, NANO, KIB, MIB = 0.01, 1e-3, 1e6, 1e-9, 1024.0, 1048576.0
G, C, R = Kind.GAUGE, Kind.COUNTER, Kind.RATIO

METRICS: tuple[Metric, ...] = (
    _m("util_gpu_ratio", "ratio", R, "fraction of the sample period a kernel ran", "%", PERCENT, "util_gpu"),
    _m("util_mem_ratio", "ratio", R, "fraction of the sample period device memory was read or written", "%", PERCENT, "util_mem"),
    _m("mem_used_bytes", "bytes", G, "device memory in use", "B", 1.0, "mem_used"),
    _m("mem_total_bytes", "bytes", G, "device memory in total", "B", 1.0, "mem_total"),
    _m("power_watts", "watts", G, "board power, averaged by the driver", "mW", MILLI, "power_mw"),
    _m("power_instant_watts", "watts", G, "board power, instantaneous", "mW", MILLI, "power_instant_mw"),
    _m("power_limit_watts", "watts", G, "enforced power limit", "mW", MILLI, "power_limit_mw", slow=True),
    _m("energy_joules_total", "joules", C, "energy since driver load", "mJ", MILLI, "energy_mj", slow=True),
    _m("sm_clock_hertz", "hertz", G, "SM clock", "MHz", MEGA, "sm_clock"),
    _m("mem_clock_hertz", "hertz", G, "memory clock", "MHz", MEGA, "mem_clock"),
    _m("temp_celsius", "celsius", G, "GPU temperature", "C", 1.0, "temp_c"),
    _m("mem_temp_celsius", "celsius", G, "HBM temperature", "C", 1.0, "mem_temp_c"),
    _m("clock_event_reasons", "bitmask", G, "active clock-event (throttle) reasons, nvmlClocksEventReason bits", "bitmask", 1.0, "clk_reasons"),
    _m("throttle_sw_power_cap_seconds_total", "seconds", C, "time clocks were held down by the software power cap", "ns", NANO, "clk_sw_power_cap_ns"),
    _m("throttle_sync_boost_seconds_total", "seconds", C, "time in sync boost", "ns", NANO, "clk_sync_boost_ns"),
    _m("throttle_sw_thermal_seconds_total", "seconds", C, "time clocks were held down by software thermal slowdown", "ns", NANO, "clk_sw_thermal_ns"),
    _m("throttle_hw_thermal_seconds_total", "seconds", C, "time in hardware thermal slowdown", "ns", NANO, "clk_hw_thermal_ns", slow=True),
    _m("throttle_hw_power_brake_seconds_total", "seconds", C, "time in hardware power-brake slowdown", "ns", NANO, "clk_hw_power_brake_ns", slow=True),
    _m("pcie_tx_bytes_total", "bytes", C, "PCIe bytes sent by the GPU", "B", 1.0, "pcie_tx_bytes", wrap_bits=32),
    _m("pcie_rx_bytes_total", "bytes", C, "PCIe bytes received by the GPU", "B", 1.0, "pcie_rx_bytes", wrap_bits=32),
    _m("pcie_replay_total", "count", C, "PCIe replays", "count", 1.0, "pcie_replay", slow=True),
    _m("nvlink_tx_bytes_total", "bytes", C, "NVLink data bytes sent, all links", "KiB", KIB, "nvlink_data_tx_kib"),
    _m("nvlink_rx_bytes_total", "bytes", C, "NVLink data bytes received, all links", "KiB", KIB, "nvlink_data_rx_kib"),
    # NVLink per link, at the slow cadence (collectors/nvlink.py); absent on a GPU without NVLink
    _m("nvlink_links_active", "count", G, "NVLink links up", "count", 1.0, slow=True),
    _m("nvlink_link_max_util_ratio", "ratio", R, "NVLink: the busiest link's busier direction / its peak", "ratio",
       1.0, slow=True),
    _m("nvlink_errors_total", "count", C, "NVLink replay, recovery and CRC errors, all links", "count", 1.0, slow=True),
    _m("ecc_uncorrected_total", "count", C, "uncorrected ECC errors since driver load (volatile)", "count", 1.0, "ecc_uncorrected", slow=True),
    _m("ecc_corrected_total", "count", C, "corrected ECC errors since driver load (volatile)", "count", 1.0, "ecc_corrected", slow=True),
    _m("procs_count", "count", G, "compute processes on the GPU", "count", 1.0),
    _m("procs_cpu_cores", "cores", G, "host CPU of the GPU's compute processes, summed (1 = one core)", "%", PERCENT, "proc_cpu_pct"),
    _m("gpm_graphics_util_ratio", "ratio", R, "GPM: graphics engine activity", "%", PERCENT, "gpm_graphics_util"),
    _m("gpm_sm_util_ratio", "ratio", R, "GPM: fraction of SMs busy", "%", PERCENT, "gpm_sm_util"),
    _m("gpm_sm_occupancy_ratio", "ratio", R, "GPM: warps resident / maximum", "%", PERCENT, "gpm_sm_occupancy"),
    _m("gpm_tensor_util_ratio", "ratio", R, "GPM: any tensor pipe active", "%", PERCENT, "gpm_any_tensor_util"),
    _m("gpm_hmma_util_ratio", "ratio", R, "GPM: HMMA tensor pipe active", "%", PERCENT, "gpm_hmma_tensor_util"),
    _m("gpm_dram_bw_util_ratio", "ratio", R, "GPM: DRAM bandwidth used / peak", "%", PERCENT, "gpm_dram_bw_util"),
    _m("gpm_fp32_util_ratio", "ratio", R, "GPM: FP32 pipe active", "%", PERCENT, "gpm_fp32_util"),
    _m("gpm_fp16_util_ratio", "ratio", R, "GPM: FP16 pipe active", "%", PERCENT, "gpm_fp16_util"),
    _m("gpm_integer_util_ratio", "ratio", R, "GPM: integer pipe active", "%", PERCENT, "gpm_integer_util"),
    _m("gpm_pcie_tx_bytes_per_second", "bytes/s", G, "GPM: PCIe bytes/s out of the GPU", "MiB/s", MIB, "gpm_pcie_tx_per_sec"),
    _m("gpm_pcie_rx_bytes_per_second", "bytes/s", G, "GPM: PCIe bytes/s into the GPU", "MiB/s", MIB, "gpm_pcie_rx_per_sec"),
    _m("gpm_nvlink_tx_bytes_per_second", "bytes/s", G, "GPM: NVLink bytes/s out of the GPU", "MiB/s", MIB, "gpm_nvlink_tx_per_sec"),
    _m("gpm_nvlink_rx_bytes_per_second", "bytes/s", G, "GPM: NVLink bytes/s into the GPU", "MiB/s", MIB, "gpm_nvlink_rx_per_sec"),
    # The serving engine (vLLM, SGLang, TensorRT-LLM) that runs on the GPU, from its /metrics
    # (collectors/serving_metrics.py): every GPU of an engine carries the engine's numbers.
    _m("serving_requests_running", "count", G, "serving engine: requests running (all its engines)", "count"),
    _m("serving_requests_waiting", "count", G, "serving engine: requests waiting in its queue", "count"),
    _m("serving_kv_cache_usage_ratio", "ratio", R, "serving engine: KV-cache blocks in use / total (fullest engine)", "ratio"),
    _m("serving_requests_per_second", "1/s", G, "serving engine: requests finished per second", "1/s"),
    _m("serving_prompt_tokens_per_second", "1/s", G, "serving engine: prompt tokens processed per second", "1/s"),
    _m("serving_generation_tokens_per_second", "1/s", G, "serving engine: tokens generated per second", "1/s"),
    _m("serving_preemptions_per_second", "1/s", G, "serving engine: preemptions (SGLang: retractions) per second", "1/s"),
    _m("serving_ttft_p50_seconds", "seconds", G, "serving engine: time to first token, median of the interval", "s"),
    _m("serving_ttft_p99_seconds", "seconds", G, "serving engine: time to first token, 99th percentile of the interval", "s"),
    _m("serving_itl_p50_seconds", "seconds", G, "serving engine: inter-token latency, median of the interval", "s"),
    _m("serving_itl_p99_seconds", "seconds", G, "serving engine: inter-token latency, 99th percentile of the interval", "s"),
    _m("serving_queue_time_p99_seconds", "seconds", G, "serving engine: time requests waited in the queue, 99th percentile", "s"),
    _m("serving_e2e_p99_seconds", "seconds", G, "serving engine: request latency end to end, 99th percentile", "s"),
    # The network port nearest the GPU in the PCIe tree (collectors/network.py): an RDMA port (InfiniBand,
    # RoCE) or a NIC; every GPU that port serves carries the port's numbers.
    _m("nic_tx_bytes_per_second", "bytes/s", G, "nearest network port: bytes/s sent (all its traffic)", "B/s"),
    _m("nic_rx_bytes_per_second", "bytes/s", G, "nearest network port: bytes/s received (all its traffic)", "B/s"),
    _m("nic_link_util_ratio", "ratio", R, "nearest network port: the busier direction / its line rate", "ratio"),
    _m("nic_congestion_per_second", "1/s", G, "nearest RDMA port: congestion notifications handled and ECN-marked "
       "packets received per second (mlx5 hardware counters)", "1/s"),
    _m("nic_retransmits_per_second", "1/s", G, "nearest RDMA port: out-of-sequence packets, sequence errors and "
       "ack timeouts per second (mlx5 hardware counters)", "1/s"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

# Prometheus names (daemon/exporter.py): `gpuscope_gpu_<name>`, the profiling metrics
# named for what they measure (DCGM's DCGM_FI_PROF_* names), not by the NVML GPM
# call that reads them on one source
EXPORTED = {
    "gpm_graphics_util_ratio": "gr_engine_active_ratio",
    "gpm_sm_util_ratio": "sm_active_ratio",
    "gpm_sm_occupancy_ratio": "sm_occupancy_ratio",
    "gpm_tensor_util_ratio": "tensor_active_ratio",
    "gpm_hmma_util_ratio": "tensor_hmma_active_ratio",
    "gpm_dram_bw_util_ratio": "dram_active_ratio",
    "gpm_fp32_util_ratio": "fp32_active_ratio",
    "gpm_fp16_util_ratio": "fp16_active_ratio",
    "gpm_integer_util_ratio": "integer_active_ratio",
    "gpm_pcie_tx_bytes_per_second": "pcie_tx_bytes_per_second",
    "gpm_pcie_rx_bytes_per_second": "pcie_rx_bytes_per_second",
    "gpm_nvlink_tx_bytes_per_second": "nvlink_tx_bytes_per_second",
    "gpm_nvlink_rx_bytes_per_second": "nvlink_rx_bytes_per_second",
}
PROMETHEUS_PREFIX = "gpuscope_gpu_"


def prometheus_name(m: Metric) -> str:
    """The metric's family name on /metrics (a counter's samples add `_total`)."""
    return PROMETHEUS_PREFIX + EXPORTED.get(m.name, m.name).removesuffix("_total")


_BY_EXPORTED = {EXPORTED.get(m.name, m.name): m for m in METRICS}


def find(name: str) -> Metric | None:
    """A metric by its catalogue name or by the name a dashboard shows
    (`sm_active_ratio`, `gpuscope_gpu_sm_active_ratio`, a counter's family
    without `_total`), so what people see in Grafana works in `gpuscope query`."""
    short = name.removeprefix(PROMETHEUS_PREFIX)
    return BY_NAME.get(name) or _BY_EXPORTED.get(short) or _BY_EXPORTED.get(short + "_total")
SERVING: tuple[str, ...] = tuple(m.name for m in METRICS if m.name.startswith("serving_"))
NETWORK: tuple[str, ...] = tuple(m.name for m in METRICS if m.name.startswith("nic_"))
# what samplers beside the GPU's own source add to its samples, in rows of their own
SIDE: tuple[str, ...] = SERVING + NETWORK
BY_CSV: dict[str, Metric] = {m.csv: m for m in METRICS if m.csv}
NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)


RATIO_CEILING = 1.5              # GPM ratios may overshoot 1 a little; 1.5 is garbage
# The most a gauge of each unit can be on any GPU there is, with room to
# spare: a value past it is a unit or encoding bug (1e308 W), and it would
# poison every mean it enters. Counters only must fit SQL's BIGINT. The
# analyzer refuses a batch holding a value past these; collectors that
# derive values (serving engines' rates) drop such a value rather than send it.
PLAUSIBLE_MAX = {"watts": 1e5, "hertz": 1e11, "celsius": 1e3, "bytes": 1e15, "bytes/s": 1e14,
                 "cores": 1e5, "count": 1e9, "bitmask": 2.0 ** 64, "1/s": 1e12, "seconds": 1e7}
COUNTER_MAX = 2.0 ** 63


def ceiling(m: Metric) -> float:
    if m.kind is Kind.RATIO:
        return RATIO_CEILING
    if m.kind is Kind.COUNTER:
        return COUNTER_MAX
    return PLAUSIBLE_MAX.get(m.unit, COUNTER_MAX)


def normalise(metric: Metric, raw: float) -> float:
    """Raw vendor value -> catalogue unit. The only place units change."""
    return raw * metric.scale if metric.scale != 1.0 else float(raw)


def unit_of(name: str) -> str:
    return BY_NAME[name].unit
