"""From a trace to a verdict: timeline arithmetic (busy time, where the idle
time went, copies, collectives and their overlap with compute), the
roofline position of the ops, then one verdict in the counters' vocabulary.

How the verdict is reached (docs/verdicts.md has the reasoning). The span is
the trace minus the profiler's own start/stop while the GPU was idle
(analyzers/idle_time.py), and every fraction is of time, not of a count:
1. no GPU activity at all -> idle;
2. copies and collectives not hidden behind compute take half or more of
   the GPU's active time -> communication-bound;
3. GPU busy half the span or more -> compute- or memory-bound, by where the
   time-weighted ops sit against the ridge point;
4. otherwise the GPU waits, and the largest cause of its idle time decides:
   the launching thread dispatching -> launch-bound; doing other work
   (Python, input pipelines, sampling, synchronisation; or untraced while the
   next launch came late) -> host-bound; waiting for work, or nobody can
   say -> idle; launched work waiting on the device with copies or
   collectives in the trace -> communication-bound.
   Without a host trace, the size of each late gap stands in for what the
   host did (up to 100 µs: the dispatch path), with lower confidence.

A trace's numbers come from a file: the readers keep every time and
duration within [0, MAX_TIME_NS] (so no sum of disjoint intervals, end or
gap overflows int64) and count the events they left out; this module never
divides by a span, a busy time or a total that can be zero, and reports no
inf or NaN.
"""
from __future__ import annotations

import numpy as np

from gpuscope.collectors.human import percent
from gpuscope.collectors.intervals import intersect, length, merge
from gpuscope.collectors.trace_model import (COLLECTIVE, KERNEL, KIND_NAMES, MEMCPY_D2D, MEMCPY_D2H, MEMCPY_H2D,
                                             MEMCPY_P2P, DeviceTimeline, Trace)

from .host_steps import host_steps
from .idle_time import LATE_SLACK_NS, account, next_launch
from .links import describe as describe_link, pcie_link
from .roofline import Peaks, choose_peaks, device_peaks, op_table
from .rules.common import COMMUNICATION, COMPUTE, HOST, IDLE, LAUNCH, MEMORY

GUESS_CONFIDENCE = 0.6          # the verdict rests on gap sizes, not on what the host did
OVER_LINK = 1.1                 # copies this far past an assumed link's peak: not that link
MIN_KERNELS = 20                # fewer kernels than this say little about a waiting GPU
FEW_KERNELS_CONFIDENCE = 0.3
TOP_OPS = 10
COMM_KINDS = (MEMCPY_H2D, MEMCPY_D2H, MEMCPY_P2P, COLLECTIVE)


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def device_summary(trace: Trace, dev: DeviceTimeline, link: dict | None = None,
                   measured: tuple[float | None, float | None, float] | None = None) -> dict:
    """`link`: the GPU's host link (analyzers/links.py) when the caller knows
    it; otherwise the device's name stands in. `measured`: the GPU's
    calibrated peaks (Store.measured_peaks), which the roofline prefers."""
    span = max(trace.span_ns, 1)
    ends = dev.start_ns + dev.dur_ns
    active = merge(dev.start_ns, ends)
    busy_ns = length(active)
    k = dev.kind == KERNEL
    kern = merge(dev.start_ns[k], ends[k])
    comm_mask = np.isin(dev.kind, COMM_KINDS)
    comm = merge(dev.start_ns[comm_mask], ends[comm_mask])
    comm_ns = length(comm)
    exposed_comm_ns = comm_ns - length(intersect(comm, kern))
    coll = dev.kind == COLLECTIVE
    coll_iv = merge(dev.start_ns[coll], ends[coll])
    compute_only = merge(dev.start_ns[k & ~coll], ends[k & ~coll])
    kdur = dev.dur_ns[k]
    timing = account(trace, dev, active)
    out: dict = dict(device=dev.name, name=dev.props.get("name"), span_seconds=timing["span_seconds"],
                     busy_fraction=timing["busy_fraction"], activities=int(len(dev)),
                     host_transfer_fraction=trace.host.transfer_ns / span, timing=timing)
    out["kernels"] = dict(count=int(k.sum()), launch_rate_per_s=float(k.sum()) / timing["span_seconds"],
                          duration_us=dict(p50=_us(_pct(kdur, 50)), p90=_us(_pct(kdur, 90)), p99=_us(_pct(kdur, 99)),
                                           mean=_us(float(kdur.mean()) if len(kdur) else None)))
    out["idle_gaps"] = _gaps(trace, dev, active)
    copies = {}
    for kind in (MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D, MEMCPY_P2P):
        m = dev.kind == kind
        if m.any():
            nbytes = dev.bytes[m]
            t = length(merge(dev.start_ns[m], ends[m]))
            known = float(np.nansum(nbytes)) if not np.isnan(nbytes).all() else None
            copies[KIND_NAMES[kind]] = dict(count=int(m.sum()), time_fraction=t / span, bytes=known,
                                            bytes_per_s=known / (t / 1e9) if known and t else None)
    link = link or pcie_link(device_name=dev.props.get("name"))
    for kind, direction in (("memcpy_h2d", "host to device"), ("memcpy_d2h", "device to host")):
        c = copies.get(kind)
        if c is not None:
            c["direction"] = direction
            if link is not None and c["bytes_per_s"]:
                # each direction has its own lanes: a copy is judged against one direction's peak
                fraction = c["bytes_per_s"] / link["peak_bytes_per_s"]
                if fraction <= OVER_LINK or link["source"] == "device info":
                    c["link_fraction"] = fraction       # past an assumed link's peak: the link is not what we assumed
    out["memcpy"] = copies
    out["pcie_link"] = link
    coll_ns = length(coll_iv)       # zero when every collective lasted 0 ns
    out["communication"] = dict(time_fraction=comm_ns / span, exposed_fraction=exposed_comm_ns / span,
                                collective_fraction=coll_ns / span,
                                collective_overlap_with_compute=(length(intersect(coll_iv, compute_only)) / coll_ns
                                                                 if coll_ns else None))
    peaks, peaks_source = choose_peaks(device_peaks(dev), dev.props.get("name"), measured)
    ops = op_table(trace, dev, peaks)
    out["roofline"] = dict(_roofline(peaks, ops), hlo_available=bool(trace.programs), peaks_source=peaks_source)
    out["top_ops"] = [{k2: (round(v, 9) if isinstance(v, float) else v) for k2, v in r.items() if k2 != "program"}
                      for r in ops[:TOP_OPS]]
    out.update(_verdict(out, exposed_comm_ns, busy_ns, span))
    return out


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 3)


def _gaps(trace: Trace, dev: DeviceTimeline, active) -> dict:
    """Gaps between blocks of device activity, and which of them the host
    caused: the next activity was launched only after the GPU went idle."""
    starts, ends = active
    if len(starts) < 2:
        return dict(count=0, total_seconds=0.0, host_caused_fraction=None, median_us=None, p90_us=None,
                    host_caused_median_us=None)
    gap_start, gap_end = ends[:-1], starts[1:]
    gaps = gap_end - gap_start
    known, launch = next_launch(trace, dev, gap_end)
    caused = known & (launch >= gap_start - LATE_SLACK_NS)      # launched after the GPU ran dry
    total = float(gaps.sum())
    host_gaps = gaps[caused]
    return dict(count=int(len(gaps)), total_seconds=total / 1e9,
                median_us=_us(_pct(gaps, 50)), p90_us=_us(_pct(gaps, 90)),
                attributed_fraction=float(gaps[known].sum() / total) if total else None,
                host_caused_fraction=float(host_gaps.sum() / total) if total and known.any() else None,
                host_caused_median_us=_us(_pct(host_gaps, 50)))


def _roofline(peaks: Peaks, ops: list[dict]) -> dict:
    t = sum(r["time_s"] for r in ops) or 1.0

    def share(bound: str | None = None, source: str | None = None) -> float:
        return sum(r["time_s"] for r in ops if (bound is None or r.get("bound") == bound)
                   and (source is None or r.get("bound_source") == source)) / t
    comp, mem = share("compute"), share("memory")
    return dict(peak_flops_per_s=peaks.flops_per_s, peak_bytes_per_s=peaks.bytes_per_s,
                ridge_flops_per_byte=peaks.ridge, compute_bound_time_fraction=comp,
                memory_bound_time_fraction=mem, unknown_time_fraction=max(0.0, 1 - (comp + mem)),
                hlo_time_fraction=share(source="hlo"), name_time_fraction=share(source="name"))


NAME_ONLY = 0.7       # confidence factor when kernel names, not HLO, placed most of the time


def _verdict(s: dict, exposed_comm_ns: int, busy_ns: int, span: int) -> dict:
    busy = s["busy_fraction"]
    k, gaps, roof = s["kernels"], s["idle_gaps"], s["roofline"]
    if busy_ns == 0:
        return dict(verdict=IDLE, confidence=1.0, summary="no GPU activity in the trace")
    comm_share = exposed_comm_ns / busy_ns
    # Data movement must also matter to the job: copies on the GPU or transfer work
    # on the host (staging, device_put) for a fifth of the trace or more.
    moving = s["communication"]["exposed_fraction"] + s["host_transfer_fraction"]
    if comm_share >= 0.5 and moving >= 0.2:
        return dict(verdict=COMMUNICATION, confidence=round(min(1.0, comm_share), 3),
                    summary=f"copies/collectives not overlapped with compute take {percent(comm_share)} of the GPU's "
                            f"active time; moving data occupies {percent(min(moving, 1))} of the trace (GPU copies "
                            f"{percent(s['communication']['exposed_fraction'])}, host transfers "
                            f"{percent(s['host_transfer_fraction'])})"
                            + _copy_words(s))
    if busy >= 0.5:
        c, m = roof["compute_bound_time_fraction"], roof["memory_bound_time_fraction"]
        known = c + m
        if known == 0:
            return dict(verdict=COMPUTE, confidence=0.3,
                        summary=f"GPU busy {percent(busy)}; no op could be placed on the roofline "
                                "(no HLO in the trace)")
        verdict = COMPUTE if c >= m else MEMORY
        top = next((r for r in s["top_ops"] if r.get("bound")), None)
        detail = ""
        if top is not None and top.get("fraction_of_peak") is not None:
            measured = (roof.get("peaks_source") or "").startswith("measured")
            what = (f"of {'measured ' if measured else ''}peak "
                    + ("FLOP/s" if top["bound"] == "compute" else "HBM bandwidth"))
            name = top["kernel"] if not top["op"] or top["op"].startswith("command_buffer") else top["op"]
            detail = f"; top op {name} at {percent(top['fraction_of_peak'])} {what}"
        share = max(c, m) / known
        by_name = roof["name_time_fraction"] > roof["hlo_time_fraction"]
        basis = ""
        if by_name:
            why = ("no device peaks to place HLO costs against"
                   if roof["hlo_available"] and not (roof["peak_bytes_per_s"] and roof["peak_flops_per_s"])
                   else "no HLO for them")
            basis = (f"; placed by kernel names ({percent(roof['name_time_fraction'])} of kernel time): "
                     f"the trace carries {why}")
        if roof["unknown_time_fraction"] >= 0.005:
            basis += (f"; {percent(roof['unknown_time_fraction'])} of kernel time in kernels the HLO does not explain "
                      f"(not counted)")
        return dict(verdict=verdict,
                    confidence=round(busy * share * min(1.0, known / 0.5) * (NAME_ONLY if by_name else 1.0), 3),
                    summary=f"GPU busy {percent(busy)}; {percent(c)} of kernel time in compute-bound ops, "
                            f"{percent(m)} in memory-bound ops{detail}{basis}")
    return _waiting_verdict(s)


def _copy_words(s: dict) -> str:
    """'; H2D 2.5 GB/s = 4% of a Gen5 ×16 link (assumed from the device name)'."""
    link = s.get("pcie_link")
    parts = []
    for kind, short in (("memcpy_h2d", "H2D"), ("memcpy_d2h", "D2H")):
        c = s["memcpy"].get(kind)
        if c and c.get("bytes_per_s"):
            of = (f" = {percent(c['link_fraction'])} of {describe_link(link)}"
                  if c.get("link_fraction") is not None else "")
            parts.append(f"{short} {c['bytes_per_s'] / 1e9:,.1f} GB/s{of}")
    if not parts:
        return ""
    src = f" ({link['source']})" if link and link["source"] != "device info" and "of a Gen" in " ".join(parts) else ""
    return "; " + ", ".join(parts) + src


DEVICE_WAIT_ON_COMM = 0.25    # device waits are on data movement when copies/collectives take this much of them
_CAUSE_VERDICT = dict(dispatch=LAUNCH, host_work=HOST, host_transfer=HOST, waiting_for_work=IDLE,
                      unattributed=IDLE, device_wait=IDLE)


def _waiting_verdict(s: dict) -> dict:
    """The GPU is idle half the span or more: the largest cause of the idle
    time decides (analyzers/idle_time.py measures them)."""
    t, k = s["timing"], s["kernels"]
    idle = max(t["idle_fraction"], 1e-12)
    by_verdict: dict[str, float] = {}
    for cause, share in t["idle_causes"].items():
        v = _CAUSE_VERDICT[cause]
        if cause == "device_wait" and s["communication"]["time_fraction"] >= DEVICE_WAIT_ON_COMM * share:
            v = COMMUNICATION             # launched work waited on the device, with copies or collectives busy
        by_verdict[v] = by_verdict.get(v, 0.0) + share
    guessed = t["basis"].startswith("gap sizes")
    if guessed and k["launch_rate_per_s"] < 100:
        by_verdict = {IDLE: idle}         # a few launches and no host trace: nothing says the GPU is starved
    verdict = max(by_verdict, key=by_verdict.get)
    share = by_verdict[verdict] / idle
    confidence = round(min(1.0, share * min(1.0, idle / 0.5)) * (GUESS_CONFIDENCE if guessed else 1.0), 3)
    few = k["count"] < MIN_KERNELS
    if few:
        confidence = min(confidence, FEW_KERNELS_CONFIDENCE)
    c = t["idle_causes"]
    excl = t["excluded"]["profiler_seconds"]
    head = f"GPU idle {percent(idle)} of the trace" + (
        f" (the profiler's own start/stop, {excl * 1e3:,.0f} ms, left out)" if excl else "")
    parts = [f"{what} {percent(v / idle)}" for v, what in
             ((c["dispatch"], "dispatching"), (c["host_work"] + c["host_transfer"], "doing other host work"),
              (c["waiting_for_work"], "waiting for work")) if v / idle >= 0.005]
    split = [f"while it waited the launching thread was {', '.join(parts)} of the time"] if parts else []
    if c["device_wait"] / idle >= 0.005:
        split.append(f"launched work waited on the device {percent(c['device_wait'] / idle)} of the time")
    if c["unattributed"] / idle >= 0.005:
        split.append(f"{percent(c['unattributed'] / idle)} unattributed (no launch record or host trace)")
    split = "; ".join(split) or "no cause could be measured"
    if guessed:
        split = (f"{t['basis']}: {percent(c['dispatch'] / idle)} of the idle time in gaps as short as a dispatch, "
                 f"{percent(c['host_work'] / idle)} in longer ones")
        if k["launch_rate_per_s"] < 100:
            split = (f"{k['launch_rate_per_s']:,.0f} launches/s and no launching thread in the trace: nothing "
                     f"says the GPU waits on the host")
    top = ", ".join(f"{a['name']} {percent(a['idle_fraction'])}" for a in t["host_during_idle"][:3])
    tail = f"; the host during GPU-idle time: {top}" if top and verdict in (LAUNCH, HOST) else ""
    rate = f"; {k['launch_rate_per_s']:,.0f} launches/s, median kernel {k['duration_us']['p50'] or 0:,.1f} µs"
    if few:
        rate = f"; only {k['count']} kernel{'s' if k['count'] != 1 else ''} in the trace: too few to judge a rate"
    if verdict == IDLE:
        return dict(verdict=IDLE, confidence=confidence,
                    summary=f"{head}, and not for want of host work: {split}" + (rate if few else ""))
    return dict(verdict=verdict, confidence=confidence, summary=f"{head}; {split}{rate}{tail}")


def summarize(trace: Trace, links: dict[int, dict] | None = None,
              measured: dict[int, tuple[float | None, float | None, float]] | None = None) -> dict:
    """`links`: GPU index -> its host link (analyzers/links.py), from the
    agent's device info; without it the device's name stands in.
    `measured`: GPU index -> its calibrated peaks (Store.measured_peaks)."""
    devices = [device_summary(trace, d, (links or {}).get(_index(d.name)), (measured or {}).get(_index(d.name)))
               for d in trace.devices]
    host = trace.host
    span = max(trace.span_ns, 1)
    out = dict(source=trace.source, format=trace.format, span_seconds=span / 1e9,
               start_unix=trace.start_unix_ns / 1e9 if trace.start_unix_ns else None,
               hostnames=trace.hostnames, decided_by="trace",
               host=dict(dispatch_fraction=host.dispatch_ns / span, busiest_thread_busy_fraction=host.busy_ns / span,
                         transfer_fraction=host.transfer_ns / span, threads=host.threads,
                         launches=int(len(host.launch_correlation))),
               host_steps=host_steps(trace.host.events),
               devices=devices, warnings=list(trace.warnings), skipped_events=trace.skipped_events)
    if not devices:
        out.update(verdict=None, confidence=0.0, missing=["GPU device plane"],
                   summary="no GPU activity recorded: a CPU-only job, or device tracing was off")
        return out
    main = max(devices, key=lambda d: d["busy_fraction"] if d["verdict"] != IDLE else -1)
    out.update({k: main[k] for k in ("verdict", "confidence", "summary", "busy_fraction", "kernels", "idle_gaps",
                                     "memcpy", "communication", "roofline", "top_ops", "timing", "pcie_link")})
    out["device"] = main["device"]
    return out


def _index(device: str) -> int | None:
    """'/device:GPU:3' -> 3."""
    tail = device.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None
