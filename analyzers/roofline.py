"""Device peaks and the roofline position of each op in a trace.

Peak dense BF16 tensor throughput per SM per clock by compute capability
(NVIDIA's published dense figures divided by SMs x boost clock: V100 125 TF,
A100 312 TF, A10/RTX 30 ~0.5x A100 per SM, L40S 362 TF, H100/H200 989 TF,
B200 2.25 PF). Peak bandwidth comes from the trace's own plane stats.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from gpuscope.collectors.human import percent
from gpuscope.collectors.trace_model import KERNEL, DeviceTimeline, Trace

from .hlo_cost import load_program

BF16_FLOP_PER_CLK_PER_SM = {(7, 0): 1024, (7, 5): 512, (8, 0): 2048, (8, 6): 512, (8, 7): 512, (8, 9): 1024,
                            (9, 0): 4096, (10, 0): 8192, (12, 0): 1024}
GEMM_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul|conv|dot", re.I)


@dataclass
class Peaks:
    flops_per_s: float | None
    bytes_per_s: float | None

    @property
    def ridge(self) -> float | None:
        if self.flops_per_s and self.bytes_per_s:
            return self.flops_per_s / self.bytes_per_s
        return None


# Where no trace gives a device's peaks: NVIDIA's published dense BF16 tensor
# throughput and HBM bandwidth, by a fragment of the name NVML gives; first
# match wins, so the PCIe and NVL parts (lower clocks and power) come before
# the SXM part of the same name.
DATASHEET = (("H100 PCIe", 756e12, 2.0e12), ("H100 NVL", 835e12, 3.9e12), ("H200 NVL", 835e12, 4.8e12),
             ("A100 80GB PCIe", 312e12, 1.935e12), ("A100-PCIE-40GB", 312e12, 1.555e12),
             ("GH200", 989e12, 4.0e12), ("H200", 989e12, 4.8e12), ("H100", 989e12, 3.35e12),
             ("B200", 2.25e15, 8.0e12), ("A100", 312e12, 2.039e12), ("L40S", 362e12, 0.864e12),
             ("V100", 125e12, 0.9e12))


def datasheet_peaks(name: str | None) -> tuple[str, Peaks] | None:
    """(the datasheet part matched, its peaks) for a device name; None when unknown."""
    for part, flops, nbytes in DATASHEET:
        if name and part.lower() in name.lower():
            return part, Peaks(flops, nbytes)
    return None


def measured_source(when: float) -> str:
    return f"measured (calibrated {datetime.fromtimestamp(when, timezone.utc):%Y-%m-%d})"


def choose_peaks(trace: Peaks | None, name: str | None,
                 measured: tuple[float | None, float | None, float] | None) -> tuple[Peaks, str | None]:
    """The peaks a roofline is drawn against, and where they came from: the
    GPU's own calibration (Store.measured_peaks: HBM bytes/s, BF16 FLOP/s,
    when) where it measured them, since a real part runs below its datasheet
    and the ridge point moves with it; else the trace's device properties;
    else the datasheet for the device's name. A peak the calibration lacks
    comes from the next source, and the label names both."""
    fallback, source = trace or Peaks(None, None), "trace"
    if not (fallback.flops_per_s and fallback.bytes_per_s):
        sheet = datasheet_peaks(name if isinstance(name, str) else None)     # a trace file's name can be anything
        if sheet is not None:
            fallback, source = sheet[1], "datasheet"
        elif not (fallback.flops_per_s or fallback.bytes_per_s):
            source = None
    if not measured:
        return fallback, source
    hbm, flops, when = measured
    peaks = Peaks(flops or fallback.flops_per_s, hbm or fallback.bytes_per_s)
    label = measured_source(when)
    if not (hbm and flops) and source:
        label += f"; {'FLOP/s' if hbm else 'HBM bandwidth'} from the {source}"
    return peaks, label


def device_peaks(dev: DeviceTimeline) -> Peaks:
    p = dev.props
    major, minor = _positive(p.get("cc_major")), _positive(p.get("cc_minor"), zero_ok=True)
    per_sm = BF16_FLOP_PER_CLK_PER_SM.get((int(major), int(minor))) if major is not None and minor is not None else None
    sms, clock = _positive(p.get("core_count")), _positive(p.get("clock_rate_hz"))
    flops = per_sm * sms * clock if per_sm and sms and clock else None
    return Peaks(flops, _positive(p.get("memory_bandwidth")))


def _positive(v, zero_ok: bool = False) -> float | None:
    """A device property the roofline can use: a finite number of at least 1
    (or zero, for a compute capability's minor version), else unknown; a
    denormal bandwidth would put the ridge point at infinity."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, int) and not -1e30 < v < 1e30:
        return None
    v = float(v)
    return v if math.isfinite(v) and (1 <= v < 1e30 or zero_ok and v == 0) else None


def op_table(trace: Trace, dev: DeviceTimeline, peaks: Peaks) -> list[dict]:
    """One row per (op, kernel) group of kernels: time, count and, where the
    trace's HLO allows, FLOPs, bytes, intensity and the bound it sits under."""
    m = dev.kind == KERNEL
    if not m.any():
        return []
    keys = dev.op_idx[m].astype(np.int64) * (len(dev.names) + 1) + dev.name_idx[m]
    uniq, inv = np.unique(keys, return_inverse=True)
    time = np.bincount(inv, weights=dev.dur_ns[m]).astype(float)
    count = np.bincount(inv)
    total = float(dev.dur_ns[m].sum(dtype=np.float64)) or 1.0     # float: int64 sums of overlapping kernels can wrap
    rows = []
    for k, t, n in zip(uniq.tolist(), time.tolist(), count.tolist()):
        op_i, name_i = divmod(k, len(dev.names) + 1)
        program, op = dev.ops[op_i] if op_i >= 0 and op_i < len(dev.ops) else ("", "")
        kernel = dev.names[name_i]
        rows.append(dict(op=op, kernel=kernel, program=program, count=n, time_s=t / 1e9, time_fraction=t / total))
    _costs(trace, rows, peaks)
    rows.sort(key=lambda r: r["time_s"], reverse=True)
    return rows


def _costs(trace: Trace, rows: list[dict], peaks: Peaks) -> None:
    """FLOPs, bytes and the bound of each row, and where the bound came from
    (`bound_source`): `hlo` when the program's HLO explains the op or the
    kernel (a fusion inside a command buffer is found by its kernel's name);
    `name` when the trace carries no HLO for the program, so the kernel's
    name is all there is (GEMM-like names compute, others memory); `unknown`
    when the HLO is there and does not explain the kernel (a library GEMM
    launched inside a command buffer): its time is reported, not guessed."""
    # An op's cost covers all its kernels: spread it over the op's groups by time.
    by_op: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by_op.setdefault((r["program"], r["op"]), []).append(r)
    for (program, op), group in by_op.items():
        prog = load_program(trace.programs.get(program, b""))
        op_cost = prog.cost(op) if prog and op else None
        op_time = sum(r["time_s"] for r in group)
        executions = max(r["count"] for r in group)
        for r in group:
            # the kernel's own instruction first: XLA names a fusion's kernel after it, and
            # inside a command buffer the op is the buffer, not the kernel's instruction
            cost = prog.cost(r["kernel"]) if prog else None
            if cost is not None and cost.flops is not None:
                flops, nbytes = cost.flops * r["count"], cost.bytes * r["count"]
            elif op_cost is not None and op_cost.flops is not None and op_time > 0:
                share = r["time_s"] / op_time
                flops, nbytes = op_cost.flops * executions * share, op_cost.bytes * executions * share
            else:
                _without_hlo(r, has_hlo=prog is not None)
                continue
            r.update(flops=flops, bytes=nbytes)
            if r["time_s"] > 0:
                r["achieved_flops_per_s"] = flops / r["time_s"]
                r["achieved_bytes_per_s"] = nbytes / r["time_s"]
            if nbytes:
                r["intensity_flops_per_byte"] = flops / nbytes
            ridge = peaks.ridge
            if ridge and nbytes:
                r["bound"], r["bound_source"] = ("compute" if flops / nbytes >= ridge else "memory"), "hlo"
                if r["time_s"] > 0:
                    r["fraction_of_peak"] = (r["achieved_flops_per_s"] / peaks.flops_per_s if r["bound"] == "compute"
                                             else r["achieved_bytes_per_s"] / peaks.bytes_per_s)
                    if r["fraction_of_peak"] > OVER_PEAK:
                        # faster than the hardware can go: the HLO's count is not what ran (an operand
                        # read in part, a fusion the kernel does not cover); say so rather than place it
                        what = "FLOPs" if r["bound"] == "compute" else "bytes"
                        r["note"] = f"the HLO's {what} imply {percent(r['fraction_of_peak'])} of peak: not what ran"
                        r["bound"], r["bound_source"] = None, "unknown"
            else:          # HLO costs, but no device peaks to place them against
                _without_hlo(r, has_hlo=False)


OVER_PEAK = 1.1      # an achieved rate this far past the device's peak is a miscount, not a measurement


def _without_hlo(r: dict, has_hlo: bool) -> None:
    if has_hlo:
        r["bound"], r["bound_source"] = None, "unknown"
    else:
        r["bound"], r["bound_source"] = _by_name(r["kernel"]), "name"


def _by_name(kernel: str) -> str:
    """Without FLOPs and bytes: GEMM/convolution kernels sit above the ridge at
    any size worth profiling; elementwise, reduction and copy kernels
    (XLA's loop_/input_ fusions) do a few FLOPs per byte and sit below it.
    GEMV-shaped dots (LLM decode) are the known miss: only the HLO tells."""
    return "compute" if GEMM_KERNEL.search(kernel) else "memory"
