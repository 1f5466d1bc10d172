"""The story of one incident: what the counters showed before, during and
after a finding, what decided its verdict, the captures and their traces,
the anomalies and capture decisions around it, and what changed against the
job's own baseline (the `before` window).

And the picture of a time range (`build_range_report`): each GPU's verdict
window by window, the counters behind it, the findings and captures in it
and the ops of those captures against the device's peaks, bounded in size
whatever the range (`gpuscope report --html` draws it)."""
from __future__ import annotations

import json
import time
from typing import Callable

from gpuscope.collectors import catalogue as cat

from .degraded import what_to_try as degraded_advice
from .programs import what_to_try as regression_advice
from .stragglers import what_to_try as straggler_advice
from .roofline import choose_peaks, datasheet_peaks
from .rules import what_to_try
from .store import DRAWN_FLAGS, Store

KEY_METRICS = ("util_gpu_ratio", "util_mem_ratio", "gpm_sm_util_ratio", "gpm_sm_occupancy_ratio",
               "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio", "gpm_pcie_tx_bytes_per_second",
               "gpm_pcie_rx_bytes_per_second", "procs_cpu_cores", "power_watts", "sm_clock_hertz", "temp_celsius")
MIN_CONTEXT_S, MAX_CONTEXT_S = 60.0, 1800.0
ALWAYS_NAMED = ("sm_clock_hertz", "power_watts", "temp_celsius")   # a clock or power change is news at 5 %
MIN_PREFIX = 4


class AmbiguousId(LookupError):
    """A finding id prefix that matches more than one finding."""


def full_id(store: Store, given: str) -> str | None:
    """The finding `given` names, whole or by its first characters (at least
    MIN_PREFIX); None when none matches. Raises AmbiguousId."""
    if len(given) < MIN_PREFIX:
        return given if store.finding_ids(given, 1) == [given] else None
    ids = store.finding_ids(given)
    if given in ids or len(ids) == 1:
        return given if given in ids else ids[0]
    if ids:
        more = "" if len(ids) < 6 else ", …"
        raise AmbiguousId(f"finding_id {given!r} is the start of {'5 or more' if more else len(ids)} findings "
                          f"({', '.join(ids[:5])}{more}): give more of it")
    return None


def build_report(store: Store, finding_id: str, context_s: float = 0.0, now: float | None = None,
                 lookup: Callable[[str], dict | None] | None = None) -> dict | None:
    """`lookup` finds the finding (default: as stored; the analyzer's own
    lookup adds an open finding's running numbers)."""
    f = (lookup or store.finding)(finding_id)
    if f is None:
        return None
    now = time.time() if now is None else now
    end = f["end"] if f["end"] is not None else now
    span = max(end - f["start"], 1.0)
    ctx = context_s or min(max(span, MIN_CONTEXT_S), MAX_CONTEXT_S)
    host, gpu = f["host"], f["gpu"]
    before = store.means(host, gpu, f["start"] - ctx, f["start"], KEY_METRICS)
    during = store.means(host, gpu, f["start"], end, KEY_METRICS)
    after = store.means(host, gpu, end, end + ctx, KEY_METRICS) if f["end"] is not None else None
    captures = []
    for c in store.captures(host, limit=1000):
        if c["finding_id"] == finding_id:
            s = json.loads(c["summary"]) if c["summary"] else None
            captures.append(dict({k: v for k, v in c.items() if k != "summary"},
                                 trace_summary=s and {k: s.get(k) for k in ("verdict", "confidence", "summary",
                                                                          "busy_fraction", "kernels", "idle_gaps",
                                                                          "timing", "memcpy", "pcie_link",
                                                                          "top_ops", "host_steps")}))
    return dict(finding=f, counters=dict(context_seconds=ctx, before=before, during=during, after=after),
                changes=_changes(before, during), verdict=dict(decided=f["verdict"], by=f["decided_by"],
                                                               counters=f.get("counters_verdict"),
                                                               trace=f.get("trace_verdict")),
                what_to_try=_advice(f),
                captures=captures, anomalies=store.records("anomalies", host, 0, 100, finding_id=finding_id),
                decisions=store.records("decisions", host, 0, 100, finding_id=finding_id))


def _advice(f: dict) -> list[str]:
    """A bottleneck's advice is its verdict's and flags'; a degraded GPU's, its weak dimensions';
    a regression's, its departures'; a straggler's, what holds it."""
    kind = f.get("kind") or "bottleneck"
    if kind == "degraded":
        return [t for dim in f.get("flags") or () for t in degraded_advice(dim)]
    if kind == "regression":
        return [t for flag in f.get("flags") or () for t in regression_advice(flag)]
    if kind == "straggler":
        return straggler_advice((f.get("flags") or [""])[0], (f.get("attribution") or {}).get("dist_job", ""))
    return what_to_try(f["verdict"], f.get("flags") or ())


def _changes(before: dict, during: dict) -> list[dict]:
    """Metrics that moved most between the baseline and the incident, and
    clocks, power and temperature whenever they moved by 5 % or more: each
    with `relative` ((during - before) / |before|, None from 0) and `factor`
    (during / before)."""
    out = []
    for m in KEY_METRICS:
        b, d = before.get(m), during.get(m)
        if b is None or d is None:
            continue
        # `relative` and `factor` as people read them (+15.3 is 16.3x the before); the ranking uses the
        # change over the larger of the two, so that a rise and a fall of the same size rank alike
        out.append(dict(metric=m, before=b, during=d, change=d - b, relative=(d - b) / abs(b) if b else None,
                        factor=d / b if b else None, _rank=abs(d - b) / max(abs(b), abs(d), 1e-9)))
    out.sort(key=lambda r: r["_rank"], reverse=True)
    top = [r for r in out if r["_rank"] >= 0.1][:6]
    named = top + [r for r in out if r not in top and r["metric"] in ALWAYS_NAMED and r["_rank"] >= 0.05]
    return [{k: v for k, v in r.items() if k != "_rank"} for r in named]


# The counters a range report draws: SM, tensor and DRAM activity tell compute from memory; PCIe and the
# host CPU of the GPU's processes tell communication and host starvation; NVML's util stands in for GPM.
RANGE_METRICS = ("gpm_sm_util_ratio", "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio", "util_gpu_ratio",
                 "util_mem_ratio", "gpm_pcie_rx_bytes_per_second", "gpm_pcie_tx_bytes_per_second",
                 "procs_cpu_cores", "power_watts")
MAX_POINTS, MAX_GPUS = 1000, 16          # a chart about 1,200 pixels wide; 16 lanes still read as lanes
LIMITS = dict(points=(50, 10_000), gpus=(1, 64))
MAX_FINDINGS, FINDINGS_LOOKED_AT, MAX_CAPTURES = 500, 5000, 100


def _held(store: Store, start: float, end: float, host: str, gpu: int | None, out: dict) -> tuple[float, float]:
    """The range narrowed to the samples it holds when they fill less than
    80 % of it (found in a trial: 30 minutes asked, 2.5 held, 90 % of every
    chart empty); `out` gets the new range and a note."""
    extent = store.sample_extent(host, gpu)
    if extent is None:
        return start, end
    first, last = max(start, extent[0]), min(end, extent[1])
    if last <= first or last - first >= 0.8 * (end - start):
        return start, end
    pad = 0.02 * (last - first) + 1.0
    s, e = max(start, first - pad), min(end, last + pad)
    out["start"], out["end"] = s, e
    out["notes"].append(f"drawn over the {_span_words(e - s)} that hold samples, of the "
                        f"{_span_words(end - start)} asked for")
    return s, e


def _span_words(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.1f} min" if seconds >= 90 \
        else f"{seconds:.0f} s"


def build_range_report(store: Store, start: float, end: float, host: str = "", gpu: int | None = None,
                       max_points: int = MAX_POINTS, max_gpus: int = MAX_GPUS) -> dict:
    """What happened on the GPUs of [start, end]: `lanes` (runs of one
    verdict, and of the flags drawn beside it), `counters` (bucketed means
    of RANGE_METRICS), `findings` (with what to try), `captures` (with their
    traces' roofline and top ops) and `peaks` (from the traces, else the
    datasheet). Never more than `max_points` per GPU and series, nor more
    than `max_gpus` GPUs (the most bottlenecked first); `notes` says where
    it left anything out or merged it."""
    out: dict = dict(start=start, end=end, host=host, gpu=gpu, notes=[], gpus=[], lanes=dict(step=None, runs=[],
                     flag_runs=[]), counters=dict(step=None, samples_per_point=0, series=[]), findings=[],
                     findings_total=0, captures=[], peaks=[])
    found = store.gpus_in_range(start, end, host, gpu)
    out["gpus_in_range"] = len(found)
    if not found:
        extent = store.sample_extent(host, gpu)
        out["extent"] = dict(first=extent[0], last=extent[1]) if extent else None
        return out
    if len(found) > max_gpus:
        found = sorted(found, key=lambda g: (-g["bottleneck_seconds"], g["host"], g["gpu"]))[:max_gpus]
        found.sort(key=lambda g: (g["host"], g["gpu"]))
        out["notes"].append(f"{max_gpus} of {out['gpus_in_range']} GPUs drawn: those bottlenecked "
                            "longest in the range (--host or --gpu for others)")
    out["gpus"] = found
    keys = [(g["host"], g["gpu"]) for g in found]
    start, end = _held(store, start, end, host, gpu, out)
    span = max(end - start, 1e-3)
    out["lanes"] = _lanes(store, start, end, keys, max_points, out["notes"])
    out["counters"] = _counters(store, start, end, keys, span / max_points, out["notes"])
    drawn = set(keys)
    # of the GPUs drawn only: the fleet's newest findings could all be of others
    rows = store.findings(start=start, end=end, limit=FINDINGS_LOOKED_AT, gpus=keys)
    if len(rows) > MAX_FINDINGS:
        # the longest: a cut by time would draw the newest part of the range only
        looked = f"the newest {len(rows):,}" if len(rows) >= FINDINGS_LOOKED_AT else f"{len(rows):,}"
        out["notes"].append(f"findings: the {MAX_FINDINGS} longest of {looked} in the range drawn and listed")
        rows = sorted(rows, key=lambda f: (f["end"] if f["end"] is not None else end) - f["start"],
                      reverse=True)[:MAX_FINDINGS]
    out["findings_total"] = len(rows)
    out["findings"] = [dict(f, what_to_try=_advice(f))
                       for f in sorted(rows, key=lambda f: (f["start"], f["host"], f["gpu"]))]
    out["captures"] = _captures(store, start, end, host, drawn)
    measured = {(h, g): p for h in {f["host"] for f in found} for g, p in store.host_measured_peaks(h).items()}
    out["peaks"] = _peaks(out["captures"], found, measured)
    return out


def _lanes(store: Store, start: float, end: float, keys: list[tuple[str, int]], max_points: int,
           notes: list[str]) -> dict:
    """Runs of one verdict per GPU (windows that follow each other merged);
    past `max_points` windows a GPU, one bucket of the range each instead."""
    most = store.window_counts(start, end, keys)
    step = None
    if most > max_points:
        step = (end - start) / max_points
        notes.append(f"verdict lanes: the verdict that held most of each {_span(step)} (up to {most:,} windows "
                     f"a GPU in the range, {max_points:,} buckets drawn)")
    runs: list[dict] = []
    flag_runs: list[dict] = []
    for w in store.verdict_windows(start, end, keys, step):
        w_start, w_end = max(w["start"], start), min(w["end"], end)
        if w_end <= w_start:        # a window that only touches the range's end
            continue
        _extend(runs, dict(host=w["host"], gpu=w["gpu"], start=w_start, end=w_end, verdict=w["verdict"]))
        for flag in json.loads(w["flags"] or "[]"):
            if flag in DRAWN_FLAGS:
                _extend(flag_runs, dict(host=w["host"], gpu=w["gpu"], start=w_start, end=w_end, flag=flag),
                        key="flag")
    return dict(step=step, windows=most, runs=runs, flag_runs=flag_runs)


def _extend(runs: list[dict], r: dict, key: str = "verdict") -> None:
    """Appends `r`, or lengthens the run it continues (same GPU and value,
    starting where that run ends: a silent GPU's gap stays a gap)."""
    for last in reversed(runs[-4:]):         # flags of a window interleave: look a few back
        if (last["host"], last["gpu"], last[key]) == (r["host"], r["gpu"], r[key]) and \
                r["start"] <= last["end"] + 1e-6:
            last["end"] = max(last["end"], r["end"])
            return
    runs.append(r)


def _counters(store: Store, start: float, end: float, keys: list[tuple[str, int]], step: float,
              notes: list[str]) -> dict:
    rows = store.series(RANGE_METRICS, start, end, step, keys)
    by_gpu: dict[tuple[str, int], dict[str, tuple[list, list]]] = {}
    most = 0
    for r in rows:
        most = max(most, r["n"])
        metrics = by_gpu.setdefault((r["host"], r["gpu"]), {})
        for m in RANGE_METRICS:
            v = r.get(m)
            if v is not None:
                t, vs = metrics.setdefault(m, ([], []))
                t.append(r["bucket"] + step / 2)         # drawn at the middle of what it averages
                vs.append(v)
    if most > 2:           # two samples in a bucket is the sampling's jitter, not a summary
        notes.append(f"counters: means over {_span(step)} (up to {most:,} samples each)")
    series = [dict(host=h, gpu=g, metric=m, t=t, v=v) for (h, g), ms in by_gpu.items() for m, (t, v) in ms.items()]
    return dict(step=step, samples_per_point=most, series=series,
                units={m: cat.BY_NAME[m].unit for m in RANGE_METRICS})


def _captures(store: Store, start: float, end: float, host: str, keys: set[tuple[str, int]]) -> list[dict]:
    out = []
    for c in store.captures_between(start, end, host, MAX_CAPTURES):
        gpus = json.loads(c["gpus"]) if c.get("gpus") else []
        if gpus and not any((c["host"], g) in keys for g in gpus):
            continue
        s = json.loads(c["summary"]) if c.get("summary") else {}
        devices = s.get("devices") or []
        out.append(dict({k: v for k, v in c.items() if k not in ("summary", "gpus")}, gpus=gpus,
                        trace_summary=s.get("summary"), roofline=s.get("roofline"), top_ops=s.get("top_ops") or [],
                        device=devices[0].get("name") if devices else None))
    return out


def _peaks(captures: list[dict], gpus: list[dict],
           measured: dict[tuple[str, int], tuple[float | None, float | None, float]] | None = None) -> list[dict]:
    """The rooflines to draw: each calibrated GPU's measured peaks and each
    distinct pair of peaks the traces give (a trace of a calibrated GPU was
    already placed against its measured ones), else the datasheet's for the
    GPUs' names."""
    seen: dict[tuple, dict] = {}
    for g in gpus:
        m = (measured or {}).get((g["host"], g["gpu"]))
        if m:
            p, label = choose_peaks(None, g.get("name"), m)
            if p.flops_per_s and p.bytes_per_s:
                seen.setdefault((round(p.flops_per_s, -9), round(p.bytes_per_s, -9)), dict(
                    device=g.get("name") or "", flops_per_s=p.flops_per_s, bytes_per_s=p.bytes_per_s, ridge=p.ridge,
                    source="measured", how=f"{label}: this GPU's own `gpuscope calibrate` (HBM triad/copy median, "
                                           "BF16 matmul median)"))
    for c in captures:
        r = c.get("roofline") or {}
        flops, nbytes = r.get("peak_flops_per_s"), r.get("peak_bytes_per_s")
        source = r.get("peaks_source") or "trace"
        if flops and nbytes:
            measured_here = source.startswith("measured")
            seen.setdefault((round(flops, -9), round(nbytes, -9)), dict(
                device=c.get("device") or "", flops_per_s=flops, bytes_per_s=nbytes, ridge=flops / nbytes,
                source="measured" if measured_here else source,
                how=source if source != "trace" else (
                    "from the trace's device properties: SMs x clock x the dense BF16 rate per SM "
                    "of its compute capability; HBM bandwidth as the trace states it")))
    if seen:
        return list(seen.values())
    for g in gpus:
        found = datasheet_peaks(g.get("name"))
        if found:
            part, p = found
            seen.setdefault((part,), dict(device=g["name"], flops_per_s=p.flops_per_s, bytes_per_s=p.bytes_per_s,
                                          ridge=p.ridge, source="datasheet",
                                          how=f"NVIDIA's datasheet for the {part}: dense BF16 tensor "
                                              "throughput and HBM bandwidth"))
    return list(seen.values())


def _span(seconds: float) -> str:
    for n, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= n:
            return f"{seconds / n:.3g} {unit}"
    return f"{seconds:.3g} s"
