"""Window features: the numbers rules reason about, from one GPU's samples.

Input is columnar (metric -> float64, NaN = missing), the same whether it
comes from the live store or from an offline recording. Every feature is
None when its inputs are missing: a rule must never read "unknown" as 0.

Features are computed for many windows at once (`compute_windows`: the
windows' samples stacked, one numpy pass per feature): a fleet closes
thousands of GPU-windows at each window boundary, and per-window numpy
calls cost ~100 us a window where the stacked pass costs a few.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.counters import increments

from .links import PCIE_LANE_BYTES_PER_S

SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
POWER_REASONS = SW_POWER_CAP | HW_POWER_BRAKE
THERMAL_REASONS = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN
_LANE = np.zeros(max(PCIE_LANE_BYTES_PER_S) + 1)
_LANE[list(PCIE_LANE_BYTES_PER_S)] = list(PCIE_LANE_BYTES_PER_S.values())
EVIDENCE_DECIMALS = 6
MIN_SIDE = 0.2             # a regime inside a window: at least this share of its samples on each side


@dataclass
class Window:
    gpu: int
    start: float
    end: float
    samples: int
    features: dict[str, float]          # only the ones that could be computed
    evidence: dict[str, float] | None = None   # as shown; compute_windows' features are already rounded

    def get(self, name: str) -> float | None:
        return self.features.get(name)

    def rounded(self) -> dict[str, float]:
        if self.evidence is None:
            self.evidence = {k: round(v, EVIDENCE_DECIMALS) for k, v in self.features.items()}
        return self.evidence


class Columns:
    """One window's samples metric by metric (NaN = missing), as one matrix."""

    def __init__(self, names: tuple[str, ...], matrix: np.ndarray):
        self.names = tuple(names)
        self.matrix = matrix

    @classmethod
    def from_dict(cls, cols: dict[str, np.ndarray], n: int) -> "Columns":
        names = tuple(cols)
        matrix = np.column_stack([cols[k] for k in names]) if names else np.empty((n, 0))
        return cls(names, matrix)


def stack_columns(parts: Sequence[tuple[tuple[str, ...], np.ndarray]],
                  names: tuple[str, ...] | None = None) -> Columns:
    """The rows of matrices whose metric sets may differ (fast and slow
    rows, agents of other versions), as one Columns over `names` (default:
    their union, in the order first seen); NaN where a part lacks a metric."""
    if names is None and len(parts) == 1:      # most live windows: one batch's rows (no union to take)
        return Columns(parts[0][0], parts[0][1])
    every = [n for n, _ in parts]
    if names is None:
        # a fleet's parts mostly carry one metric set: no union to take (it cost ~10% of live analysis);
        # list.count compares in C, a generator per part did not
        names = every[0] if every.count(every[0]) == len(every) else tuple(
            dict.fromkeys(n for part_names in every for n in part_names))
    if every.count(names) == len(every):
        return Columns(names, parts[0][1] if len(parts) == 1 else np.concatenate([m for _, m in parts]))
    pos = {n: i for i, n in enumerate(names)}
    out = np.full((sum(len(m) for _, m in parts), len(names)), np.nan)
    r = 0
    for part_names, m in parts:
        out[r:r + len(m), [pos[n] for n in part_names]] = m
        r += len(m)
    return Columns(names, out)


@dataclass
class Stack:
    """K windows' samples stacked: window k holds rows offsets[k] to
    offsets[k+1] (or the end), in time order; per-window device facts
    (NaN when unknown)."""
    gpu: np.ndarray
    start: np.ndarray
    end: np.ndarray
    t: np.ndarray
    names: tuple[str, ...]
    matrix: np.ndarray
    offsets: np.ndarray
    pcie_generation: np.ndarray
    pcie_width: np.ndarray
    power_limit_watts: np.ndarray
    # the GPU's measured HBM ceiling (its calibration) and its part's datasheet figure: NVML's and
    # DCGM's DRAM ratio is of the datasheet's, and a real GPU reaches less
    hbm_measured_bytes_per_s: np.ndarray | None = None
    hbm_datasheet_bytes_per_s: np.ndarray | None = None


FEATURES = ("util_gpu_ratio", "util_mem_ratio", "sm_util_ratio", "sm_occupancy_ratio", "tensor_util_ratio",
            "dram_bw_util_ratio", "fp16_util_ratio", "fp32_util_ratio", "host_cpu_cores", "processes",
            "pcie_bytes_per_second", "nvlink_bytes_per_second", "interconnect_bytes_per_second",
            "pcie_link_util_ratio", "power_watts", "power_limit_ratio", "sm_clock_hertz",
            "power_capped_time_ratio", "thermal_throttled_time_ratio", "power_reason_sample_ratio",
            "thermal_reason_sample_ratio", "activity_shift_ratio",
            # DRAM bandwidth as a fraction of this GPU's measured ceiling, and that ceiling (calibrated GPUs)
            "dram_measured_util_ratio", "hbm_measured_bytes_per_second",
            # the network port nearest the GPU (collectors/network.py): both directions, the busier one's share
            # of its line rate, congestion notifications and retransmissions
            "nic_bytes_per_second", "nic_link_util_ratio", "nic_congestion_per_second", "nic_retransmits_per_second",
            # NVLink per link: the busiest link's share of its peak, and the links up
            "nvlink_link_max_util_ratio", "nvlink_links_active",
            # the serving engine on the GPU, when there is one: window means of what its /metrics gave
            *cat.SERVING)
FEATURE_INDEX = {n: i for i, n in enumerate(FEATURES)}
assert len(FEATURES) <= 64, "compute_windows numbers each window's set of known features in 64 bits"
_BITS = np.left_shift(np.uint64(1), np.arange(len(FEATURES), dtype=np.uint64))


class _Stacked:
    """Per-window reductions over a Stack; every result is a length-K array, NaN = unknown."""

    def __init__(self, s: Stack):
        self.s = s
        self.k = len(s.offsets)
        self.n = len(s.t)
        self.seg = np.repeat(np.arange(self.k), np.diff(np.append(s.offsets, self.n)))
        self.index = {n: i for i, n in enumerate(s.names)}
        present = ~np.isnan(s.matrix)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.n:
                self.means = (np.add.reduceat(np.where(present, s.matrix, 0.0), s.offsets, axis=0)
                              / np.add.reduceat(present, s.offsets, axis=0))
            else:
                self.means = np.empty((0, len(s.names)))
        self.none = np.full(self.k, np.nan)

    def column(self, name: str) -> np.ndarray | None:
        i = self.index.get(name)
        return None if i is None else self.s.matrix[:, i]

    def mean(self, name: str) -> np.ndarray:
        i = self.index.get(name)
        return self.none if i is None else self.means[:, i]

    def rate(self, name: str) -> np.ndarray:
        """Mean rate of a cumulative counter over each window's valid
        readings (wraps and resets as collectors.counters.increments)."""
        v = self.column(name)
        if v is None:
            return self.none
        ok = np.flatnonzero(~np.isnan(v))
        if len(ok) < 2:
            return self.none
        inc = increments(v[ok], cat.BY_NAME[name].wrap_bits)
        dt = np.diff(self.s.t[ok])
        seg = self.seg[ok]
        good = (seg[1:] == seg[:-1]) & ~np.isnan(inc) & (dt > 0)
        pair_seg = seg[1:][good]
        total = np.bincount(pair_seg, weights=inc[good], minlength=self.k)
        span = np.bincount(pair_seg, weights=dt[good], minlength=self.k)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(span > 0, total / span, np.nan)

    def activity_shift(self) -> np.ndarray:
        """How far the GPU's activity moved inside each window: the two
        means of the best split of its samples into a before and an after
        (the split that explains most of their variance, each side at least
        MIN_SIDE of the samples and 2 of them), as |after - before|; NaN
        with too few samples. A job that steps from idle to busy mid-window
        shifts by ~0.9; a bursty job whose busy and idle samples interleave
        does not shift, whatever its spread."""
        sm, util = self.column("gpm_sm_util_ratio"), self.column("util_gpu_ratio")
        a = sm if sm is not None else util
        if a is None:
            return self.none
        if sm is not None and util is not None:
            a = np.where(np.isnan(sm), util, sm)
        ok = np.flatnonzero(~np.isnan(a))
        if not len(ok):
            return self.none
        v, seg = a[ok], self.seg[ok]
        n = np.bincount(seg, minlength=self.k)
        first = np.concatenate(([0], np.cumsum(n)[:-1]))          # each window's first valid row
        csum = np.cumsum(v)
        before_seg = np.concatenate(([0.0], csum))[first][seg]     # sum of earlier windows' rows
        left_sum = csum - before_seg
        left_n = np.arange(len(v)) - first[seg] + 1
        n_row = n[seg]
        right_n = n_row - left_n
        side = np.maximum(2, np.ceil(MIN_SIDE * n_row))
        total = (np.bincount(seg, weights=v, minlength=self.k))[seg]
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = (total - left_sum) / right_n - left_sum / left_n
            explained = np.where((left_n >= side) & (right_n >= side), left_n * right_n / n_row * diff * diff, -1.0)
        best = np.full(self.k, -1.0)
        np.maximum.at(best, seg, explained)
        pick = (explained == best[seg]) & (explained >= 0)
        out = np.full(self.k, np.nan)
        out[seg[pick]] = np.abs(diff[pick])
        return out

    def bits_fraction(self, mask: int) -> np.ndarray:
        v = self.column("clock_event_reasons")
        if v is None:
            return self.none
        ok = ~np.isnan(v)
        hit = np.zeros(self.n)
        hit[ok] = (v[ok].astype(np.int64) & mask) != 0
        counts = np.bincount(self.seg[ok], minlength=self.k)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, np.bincount(self.seg, weights=hit, minlength=self.k) / counts, np.nan)


def _sum_opt(*xs: np.ndarray) -> np.ndarray:
    """Sum of what is known; NaN where nothing is."""
    stacked = np.vstack(xs)
    known = ~np.isnan(stacked)
    return np.where(known.any(axis=0), np.where(known, stacked, 0.0).sum(axis=0), np.nan)


def _first_known(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(a), b, a)


# The catalogue metrics feature_matrix reads: a caller that builds windows
# from samples one by one (an agent's /metrics) need gather no others
INPUTS = ("util_gpu_ratio", "util_mem_ratio", "gpm_sm_util_ratio", "gpm_sm_occupancy_ratio", "gpm_tensor_util_ratio",
          "gpm_dram_bw_util_ratio", "gpm_fp16_util_ratio", "gpm_fp32_util_ratio", "procs_cpu_cores", "procs_count",
          "gpm_pcie_tx_bytes_per_second", "gpm_pcie_rx_bytes_per_second", "pcie_tx_bytes_total",
          "pcie_rx_bytes_total", "gpm_nvlink_tx_bytes_per_second", "gpm_nvlink_rx_bytes_per_second",
          "nvlink_tx_bytes_total", "nvlink_rx_bytes_total", "power_watts", "power_limit_watts", "sm_clock_hertz",
          "throttle_sw_power_cap_seconds_total", "throttle_hw_power_brake_seconds_total",
          "throttle_sw_thermal_seconds_total", "throttle_hw_thermal_seconds_total", "clock_event_reasons",
          "nvlink_link_max_util_ratio", "nvlink_links_active", *cat.SERVING, *cat.NETWORK)


def feature_matrix(s: Stack) -> np.ndarray:
    """(K windows x FEATURES), NaN = not computable, rounded to
    EVIDENCE_DECIMALS: rules judge exactly the numbers the evidence shows,
    and a mean's last bit, which depends on the order of the additions
    (per window or stacked, samples in or out of order), can never move a
    window across a rule's threshold (a whole-percent util of 0.40 is 0.40)."""
    x = _Stacked(s)
    f: dict[str, np.ndarray] = {}
    f["util_gpu_ratio"] = x.mean("util_gpu_ratio")
    f["util_mem_ratio"] = x.mean("util_mem_ratio")
    for short in ("sm_util", "sm_occupancy", "tensor_util", "dram_bw_util", "fp16_util", "fp32_util"):
        f[f"{short}_ratio"] = x.mean(f"gpm_{short}_ratio")
    f["host_cpu_cores"] = x.mean("procs_cpu_cores")
    f["processes"] = x.mean("procs_count")
    pcie = _first_known(_sum_opt(x.mean("gpm_pcie_tx_bytes_per_second"), x.mean("gpm_pcie_rx_bytes_per_second")),
                        _sum_opt(x.rate("pcie_tx_bytes_total"), x.rate("pcie_rx_bytes_total")))
    f["pcie_bytes_per_second"] = pcie
    nvl = _first_known(_sum_opt(x.mean("gpm_nvlink_tx_bytes_per_second"), x.mean("gpm_nvlink_rx_bytes_per_second")),
                       _sum_opt(x.rate("nvlink_tx_bytes_total"), x.rate("nvlink_rx_bytes_total")))
    f["nvlink_bytes_per_second"] = nvl
    f["interconnect_bytes_per_second"] = _sum_opt(pcie, nvl)
    gen = np.nan_to_num(s.pcie_generation, nan=0).astype(np.int64)
    lane = np.where((gen > 0) & (gen < len(_LANE)), _LANE[np.clip(gen, 0, len(_LANE) - 1)], 0.0)
    link = lane * np.nan_to_num(s.pcie_width, nan=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # tx and rx are separate lanes: the busier direction is what saturates.
        f["pcie_link_util_ratio"] = np.where(link > 0, pcie / 2 / link, np.nan)
        f["power_watts"] = x.mean("power_watts")
        limit = np.where(np.nan_to_num(s.power_limit_watts, nan=0.0) != 0, s.power_limit_watts,
                         x.mean("power_limit_watts"))
        f["power_limit_ratio"] = np.where(np.nan_to_num(limit, nan=0.0) != 0, f["power_watts"] / limit, np.nan)
    f["sm_clock_hertz"] = x.mean("sm_clock_hertz")
    if s.hbm_measured_bytes_per_s is not None:
        measured, sheet = s.hbm_measured_bytes_per_s, s.hbm_datasheet_bytes_per_s
        with np.errstate(invalid="ignore", divide="ignore"):
            known = ~np.isnan(f["dram_bw_util_ratio"]) & (measured > 0) & (sheet > 0)
            f["dram_measured_util_ratio"] = np.where(known, f["dram_bw_util_ratio"] * sheet / measured, np.nan)
        f["hbm_measured_bytes_per_second"] = np.where(known, measured, np.nan)
    else:
        f["dram_measured_util_ratio"] = f["hbm_measured_bytes_per_second"] = x.none
    cap = _sum_opt(x.rate("throttle_sw_power_cap_seconds_total"), x.rate("throttle_hw_power_brake_seconds_total"))
    therm = _sum_opt(x.rate("throttle_sw_thermal_seconds_total"), x.rate("throttle_hw_thermal_seconds_total"))
    f["power_capped_time_ratio"] = np.minimum(cap, 1.0)
    f["thermal_throttled_time_ratio"] = np.minimum(therm, 1.0)
    f["power_reason_sample_ratio"] = x.bits_fraction(POWER_REASONS)
    f["thermal_reason_sample_ratio"] = x.bits_fraction(THERMAL_REASONS)
    f["activity_shift_ratio"] = x.activity_shift()
    for name in cat.SERVING:
        f[name] = x.mean(name)
    f["nic_bytes_per_second"] = _sum_opt(x.mean("nic_tx_bytes_per_second"), x.mean("nic_rx_bytes_per_second"))
    for name in ("nic_link_util_ratio", "nic_congestion_per_second", "nic_retransmits_per_second",
                 "nvlink_link_max_util_ratio", "nvlink_links_active"):
        f[name] = x.mean(name)
    m = np.column_stack([f[n] for n in FEATURES]) if x.k else np.empty((0, len(FEATURES)))
    return np.round(m, EVIDENCE_DECIMALS)


def compute_windows(s: Stack, matrix: np.ndarray | None = None) -> list[Window | None]:
    """Features of each stacked window (`matrix`: feature_matrix(s) when the
    caller has it); None for one without an activity reading (neither
    util_gpu nor GPM SM activity)."""
    m = feature_matrix(s) if matrix is None else matrix
    counts = gpu_sample_counts(s).tolist()
    known = ~np.isnan(m)
    judged = known[:, FEATURE_INDEX["util_gpu_ratio"]] | known[:, FEATURE_INDEX["sm_util_ratio"]]
    out: list[Window | None] = [None] * len(m)
    # a fleet's windows share a few sets of known features: each set's rows become dicts by
    # dict(zip()) at once (a comprehension testing every feature of every row was a tenth of the analysis)
    rows = np.flatnonzero(judged)
    codes = known[rows].astype(np.uint64) @ _BITS      # each row's set of known features, as one number
    _, first, which = np.unique(codes, return_index=True, return_inverse=True)
    def window(k: int, features: dict[str, float]) -> Window:
        return Window(int(s.gpu[k]), float(s.start[k]), float(s.end[k]), counts[k], features, features)

    if len(first) * 8 > len(rows):          # mostly unlike windows (offline odds and ends): row by row
        for k, row in zip(rows.tolist(), m[rows].tolist()):
            out[k] = window(k, {n: v for n, v in zip(FEATURES, row) if v == v})
        return out
    which = which.reshape(-1)
    by_set = rows[np.argsort(which, kind="stable")]      # the rows of each set together, one sort for all
    ends = np.cumsum(np.bincount(which, minlength=len(first))).tolist()
    for f, lo, hi in zip(first.tolist(), [0, *ends[:-1]], ends):
        ks = by_set[lo:hi]
        cols = np.flatnonzero(known[rows[f]])
        names = [FEATURES[i] for i in cols]
        for k, vals in zip(ks.tolist(), m[np.ix_(ks, cols)].tolist()):
            out[k] = window(k, dict(zip(names, vals)))
    return out


_SIDE = frozenset(cat.SIDE)


def gpu_sample_counts(s: Stack) -> np.ndarray:
    """Each window's samples of the GPU itself: the serving and network
    samplers' rows, stored beside the GPU's with their own metrics only, are
    not its samples (a window of 10 NVML readings and 3 scrapes holds 10)."""
    counts = np.diff(np.append(s.offsets, len(s.t)))
    serving = [i for i, n in enumerate(s.names) if n in _SIDE]
    if not serving or not len(s.t):
        return counts
    others = [i for i, n in enumerate(s.names) if n not in _SIDE]
    only_serving = ~np.isnan(s.matrix[:, serving]).all(axis=1)
    if others:
        only_serving &= np.isnan(s.matrix[:, others]).all(axis=1)
    seg = np.repeat(np.arange(len(counts)), counts)
    return counts - np.bincount(seg[only_serving], minlength=len(counts))


def _nan(x: float | None) -> float:
    return np.nan if x is None else float(x)


def stack(windows: Sequence[tuple[int, float, float, np.ndarray | list[np.ndarray],
                                  Columns | list[tuple[tuple[str, ...], np.ndarray]], dict | tuple]]) -> Stack:
    """Stacks (gpu, start, end, t, columns, device facts) of many windows;
    windows whose metric sets differ get NaN for the metrics they lack, and
    a window whose samples arrived out of order (a resent batch after a
    newer one) is put in time order. A window's samples may also come as
    the parts they arrived in: t as a list of arrays, the columns as a list
    of (metric names, matrix) of the same rows, stacked once with all the
    others instead of per window first. The device facts are a dict, or
    what device_facts() made of one."""
    ts, rows, lengths = [], [], []
    for w in windows:
        t_parts = w[3] if isinstance(w[3], list) else [w[3]]
        ts.extend(t_parts)
        lengths.append(sum(len(x) for x in t_parts))
        rows.extend(w[4] if isinstance(w[4], list) else [(w[4].names, w[4].matrix)])
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if lengths else np.empty(0, np.int64)
    if rows:
        both = stack_columns(rows)
        names, matrix = both.names, both.matrix
    else:
        names, matrix = (), np.empty((0, 0))
    facts = np.array([w[5] if type(w[5]) is tuple else device_facts(w[5]) for w in windows], float)
    busy, generation, max_generation, width, power_limit, measured, sheet = facts.reshape(-1, 7).T.copy()
    t = np.concatenate(ts) if ts else np.empty(0)
    seg = np.repeat(np.arange(len(windows)), lengths)
    if len(t) > 1 and np.any((np.diff(t) < 0) & (seg[1:] == seg[:-1])):   # a window's samples out of order
        o = np.lexsort((t, seg))
        t, matrix = t[o], matrix[o]
    return Stack(gpu=np.array([w[0] for w in windows], np.int64), start=np.array([w[1] for w in windows], float),
                 end=np.array([w[2] for w in windows], float),
                 t=t, names=names, matrix=matrix,
                 offsets=np.array(offsets, np.int64),
                 # The line rate is the link as its agent saw it while the GPU was busy; before
                 # that, its best generation: an idle GPU's link rests at Gen1 to save power, which
                 # would make later traffic look like a saturated link.
                 pcie_generation=np.where(~np.isnan(busy), busy, np.fmax(generation, max_generation)),
                 pcie_width=width, power_limit_watts=power_limit,
                 hbm_measured_bytes_per_s=measured, hbm_datasheet_bytes_per_s=sheet)


def device_facts(d: dict) -> tuple[float, ...]:
    """A window's device facts (a dict of DeviceFacts' names and the HBM
    ceilings) as stack() reads them, NaN when unknown: the busy link's
    generation, the current and best generations, the lanes (the busy
    link's when known), the power limit, the measured and datasheet HBM
    bandwidth. A caller judging many windows of one device makes this once."""
    return (_nan(d.get("pcie_busy_generation")), _nan(d.get("pcie_generation")), _nan(d.get("pcie_max_generation")),
            _nan(d.get("pcie_busy_width") or d.get("pcie_width")), _nan(d.get("power_limit_watts")),
            _nan(d.get("hbm_measured_bytes_per_s")), _nan(d.get("hbm_datasheet_bytes_per_s")))


def compute_window(gpu: int, start: float, end: float, t: np.ndarray,
                   cols: Columns, pcie_generation: int | None = None,
                   pcie_width: int | None = None, power_limit_watts: float | None = None) -> Window | None:
    """Features of one window, or None when it holds no activity reading."""
    return compute_windows(stack([(gpu, start, end, t, cols, dict(
        pcie_generation=pcie_generation, pcie_width=pcie_width, power_limit_watts=power_limit_watts))]))[0]
