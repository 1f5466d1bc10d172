"""The pictures of `gpuscope report --html/--png`: a timeline of each GPU's
verdict with the counters behind it, findings and captures on it, and a
roofline of the captured ops, drawn with matplotlib (Agg: no display) into
PNGs, and one HTML page that holds them as data: URIs, so that it opens
offline, in a ticket or a mail, years later.

It draws what the analyzer's range report says (analyzers/report.py,
build_range_report, over gRPC); it asks nothing itself.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from datetime import datetime, timedelta, timezone

from gpuscope.collectors import human

# One colour per verdict, fixed everywhere (docs/operations.md): Okabe and
# Ito's palette, which people with any common colour-vision deficiency tell
# apart; idle is grey because it is no bottleneck.
VERDICT_COLOURS = {
    "compute-bound": "#0072B2",        # blue
    "memory-bound": "#D55E00",         # vermillion
    "launch-bound": "#CC79A7",         # reddish purple
    "host-bound": "#E69F00",           # orange
    "communication-bound": "#009E73",  # bluish green
    "idle": "#BBBBBB",                 # grey
}
NO_WINDOW = "#F2F2F2"                  # no judged window: the GPU was silent, or not judged yet
FLAG_COLOURS = {"power-capped": "#F0E442", "thermal-throttled": "#56B4E9"}    # yellow, sky blue
UNKNOWN_BOUND = "#777777"
LINE_ONE_GPU = "#222222"
WIDTH_IN, DPI = 13.0, 100              # 1,300 pixels: fits a laptop's browser at 100 %

# (title, unit, [(metric, label)], fallback for a GPU without the first: NVML's util stands in for GPM's)
PANELS = (
    ("SM active", "ratio", [("gpm_sm_util_ratio", "")], ("util_gpu_ratio", "NVML util")),
    ("tensor active", "ratio", [("gpm_tensor_util_ratio", "")], None),
    ("DRAM active", "ratio", [("gpm_dram_bw_util_ratio", "")], ("util_mem_ratio", "NVML memory util")),
    ("PCIe", "bytes/s", [("gpm_pcie_rx_bytes_per_second", "into GPU"), ("gpm_pcie_tx_bytes_per_second",
                                                                        "out of GPU")], None),
    ("host CPU", "cores", [("procs_cpu_cores", "")], None),     # of the processes holding the GPU
    ("power", "watts", [("power_watts", "")], None),
)


def _plt():
    import matplotlib
    matplotlib.use("Agg")           # before pyplot: never a display, never a GUI toolkit
    import matplotlib.pyplot as plt
    return plt


# -- time axis ---------------------------------------------------------------------------
def _tz(t: float) -> timezone:
    """The local zone as of `t`, fixed over the chart: a range that crosses a
    DST change is drawn in the zone it started in (the axis label names it)."""
    lt = time.localtime(t)
    return timezone(timedelta(seconds=lt.tm_gmtoff), lt.tm_zone)


def _x(t, tz: timezone):
    """matplotlib's date numbers (days since its epoch) of Unix times, as the
    zone's wall clock; arrays stay arrays (a day of 8 GPUs is 10^5 points)."""
    import matplotlib.dates as mdates
    import numpy as np
    base = mdates.date2num(datetime(1970, 1, 1))
    return base + (np.asarray(t, dtype=float) + tz.utcoffset(None).total_seconds()) / 86400.0


def _when(t: float | None, tz: timezone | None = None) -> str:
    if t is None:
        return "open"
    return datetime.fromtimestamp(t, tz or _tz(t)).strftime("%Y-%m-%d %H:%M:%S")


def _lasted(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _gpu_name(host: str, gpu: int) -> str:
    return f"{host}/gpu{gpu}"


# -- timeline ----------------------------------------------------------------------------
def timeline_png(rep: dict, highlight: str | None = None) -> tuple[bytes, dict]:
    """The timeline as a PNG, and where its axes are in the image's pixels
    (x0/x1 the left and right ends of the time axis at rep's start and end,
    each lane's y0/y1 of its verdict band; origin top left): a test, or a
    tool, can read a time's colour off the picture. `highlight`: a finding
    id whose episode is shaded across every panel."""
    plt = _plt()
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    gpus = [(g["host"], g["gpu"]) for g in rep["gpus"]]
    panels = _panels(rep, gpus)
    lane_in = 0.6 if len(gpus) <= 4 else 0.4
    heights = [max(lane_in * len(gpus), 0.8)] + [1.2] * len(panels)
    top_in, bottom_in = 1.0, 0.65                   # the title and the legend above; ticks and the axis' name below
    total = sum(heights) * 1.1 + top_in + bottom_in
    fig = plt.figure(figsize=(WIDTH_IN, total), dpi=DPI)
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=0.1, left=0.12, right=0.86,
                            top=1 - top_in / total, bottom=bottom_in / total)
    tz = _tz(rep["start"])
    x0, x1 = float(_x(rep["start"], tz)), float(_x(rep["end"], tz))
    lanes = fig.add_subplot(grid[0])
    lanes.xaxis_date()
    lane_of = {k: i for i, k in enumerate(gpus)}
    band = (0.08, 0.55)         # a lane's verdict band (of 1); flags above the findings, findings below
    for i in range(len(gpus)):
        lanes.broken_barh([(x0, x1 - x0)], (i + band[0], band[1]), facecolors=NO_WINDOW)
    # one collection per lane and colour: a day of windows is thousands of runs
    _bars(lanes, rep["lanes"]["runs"], lane_of, tz, "verdict", lambda v: VERDICT_COLOURS.get(v, UNKNOWN_BOUND),
          band[0], band[1])
    _bars(lanes, rep["lanes"].get("flag_runs", ()), lane_of, tz, "flag", FLAG_COLOURS.get, band[0] + band[1], 0.07)
    # a degraded GPU's finding spans its bottlenecks: it is named on the GPU's lane, not drawn over them
    findings = [dict(f, start=max(f["start"], rep["start"]),
                     end=min(f["end"] if f["end"] is not None else rep["end"], rep["end"])) for f in rep["findings"]
                if (f.get("kind") or "bottleneck") == "bottleneck"]
    conditions: dict[tuple[str, int], list[str]] = {}
    for f in rep["findings"]:
        if (f.get("kind") or "bottleneck") != "bottleneck":
            conditions.setdefault((f["host"], f["gpu"]), []).extend(f"{f['kind']}: {x}" for x in f.get("flags") or ())
    _bars(lanes, [f for f in findings if f["id"] != highlight], lane_of, tz, "verdict",
          lambda v: VERDICT_COLOURS.get(v, UNKNOWN_BOUND), 0.7, 0.22, edge=0.6)
    _bars(lanes, [f for f in findings if f["id"] == highlight], lane_of, tz, "verdict",
          lambda v: VERDICT_COLOURS.get(v, UNKNOWN_BOUND), 0.7, 0.22, edge=2.0)
    shaded = next(((float(_x(f["start"], tz)), float(_x(f["end"], tz))) for f in findings if f["id"] == highlight),
                  None)
    span_px = (WIDTH_IN * DPI) * 0.70
    labelled = 0
    for f in findings:
        i = lane_of.get((f["host"], f["gpu"]))
        wide = (f["end"] - f["start"]) / (rep["end"] - rep["start"]) * span_px > 60
        if i is not None and wide and labelled < 200:      # the id where it fits
            lanes.text(float(_x(f["start"], tz)), i + 0.81, " " + f["id"][:6], fontsize=7, va="center", ha="left",
                       clip_on=True)
            labelled += 1
    for n, c in enumerate(rep["captures"], 1):
        for g in c["gpus"] or [None]:
            i = lane_of.get((c["host"], g)) if g is not None else next(
                (lane_of[k] for k in gpus if k[0] == c["host"]), None)
            if i is None:
                continue
            lanes.plot([float(_x(c["start"], tz))], [i + 0.04], marker="v", color="#000000", markersize=8,
                       clip_on=False)
            lanes.text(float(_x(c["start"], tz)), i + 0.04, f"  C{n}", fontsize=8, va="center", ha="left",
                       fontweight="bold")
    lanes.set_ylim(len(gpus), 0)
    lanes.set_yticks([i + 0.5 for i in range(len(gpus))],
                     [_gpu_name(h, g) + "".join(f"\n{c}" for c in sorted(set(conditions.get((h, g), ()))))
                      for h, g in gpus], fontsize=9)
    lanes.tick_params(axis="y", length=0)
    fig.text(0.12, 1 - 0.12 / total, f"verdict per GPU, {_when(rep['start'], tz)} to {_when(rep['end'], tz)}",
             fontsize=11, va="top", ha="left")
    handles = [Patch(facecolor=c, edgecolor="none", label=v) for v, c in VERDICT_COLOURS.items()]
    handles += [Patch(facecolor=NO_WINDOW, edgecolor="#999999", label="no window"),
                Patch(facecolor=FLAG_COLOURS["power-capped"], label="power-capped"),
                Patch(facecolor=FLAG_COLOURS["thermal-throttled"], label="thermal-throttled"),
                Patch(facecolor="#FFFFFF", edgecolor="#000000", label="finding (its verdict)"),
                Line2D([], [], marker="v", color="#000000", linestyle="none", label="capture")]
    # above the lanes, not beside them: one GPU's lane is shorter than the legend
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.12, 1 - 0.4 / total), ncol=6, fontsize=8,
               frameon=False, borderaxespad=0, handlelength=1.5, columnspacing=1.2)
    axes = [lanes]
    colours = _gpu_colours(gpus)
    for title, unit, label, draw in panels:
        ax = fig.add_subplot(grid[len(axes)], sharex=lanes)
        legend = draw(ax)
        if len(axes) == 1 and len(gpus) > 1:        # the GPUs' colours, once: the same in every panel
            legend = [Line2D([], [], color=colours[k], label=_gpu_name(*k)) for k in gpus] + legend
        ax.set_ylabel(f"{title}\n({label})", fontsize=8)
        ax.grid(True, color="#E5E5E5", linewidth=0.6)
        ax.tick_params(labelsize=8)
        if legend:
            ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False,
                      borderaxespad=0)
        axes.append(ax)
    if shaded:
        for ax in axes[1:]:           # the counters of the episode, under the finding drawn thick above
            ax.axvspan(*shaded, color="#000000", alpha=0.06, linewidth=0)
    lanes.set_xlim(x0, x1)
    loc = mdates.AutoDateLocator(minticks=5, maxticks=12)
    axes[-1].xaxis.set_major_locator(loc)
    axes[-1].xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel(f"time ({tz.tzname(None)})", fontsize=9)
    if not panels:
        lanes.tick_params(labelbottom=True)
        lanes.set_xlabel(f"time ({tz.tzname(None)})", fontsize=9)
    fig.canvas.draw()
    geometry = _geometry(fig, lanes, band, len(gpus), gpus, rep)
    geometry["panels"] = ["verdict per GPU"] + [f"{title} ({label})" for title, _, label, _ in panels]
    geometry["time_axis"] = f"time ({tz.tzname(None)})"
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    plt.close(fig)
    return out.getvalue(), geometry


def _bars(ax, runs, lane_of: dict, tz, key: str, colour, y: float, h: float, edge: float = 0.0) -> None:
    """Runs (host, gpu, start, end and `key`) as bars of lane height h at y
    in each lane, coloured by colour(run[key])."""
    drawn = [(lane_of[(r["host"], r["gpu"])], r) for r in runs
             if (r["host"], r["gpu"]) in lane_of and r["end"] > r["start"]]
    starts, ends = _x([r["start"] for _, r in drawn], tz), _x([r["end"] for _, r in drawn], tz)
    groups: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for (i, r), a, b in zip(drawn, starts.tolist(), ends.tolist()):
        groups.setdefault((i, r[key]), []).append((a, b - a))
    for (i, value), spans in groups.items():
        ax.broken_barh(spans, (i + y, h), facecolors=colour(value) or UNKNOWN_BOUND,
                       edgecolors="#000000" if edge else "none", linewidths=edge)


def _geometry(fig, lanes, band, n: int, gpus, rep) -> dict:
    height = fig.bbox.height
    box = lanes.get_window_extent()
    per_lane = box.height / max(n, 1)
    return dict(width=int(round(fig.bbox.width)), height=int(round(height)), t0=rep["start"], t1=rep["end"],
                x0=box.x0, x1=box.x1,
                lanes=[dict(gpu=_gpu_name(h, g), y0=height - box.y1 + per_lane * (i + band[0]),
                            y1=height - box.y1 + per_lane * (i + band[0] + band[1])) for i, (h, g) in enumerate(gpus)])


def _panels(rep: dict, gpus: list[tuple[str, int]]) -> list[tuple]:
    """The counter panels that have something to show: (title, unit, the
    axis' unit label, draw(ax)). A GPU's colour is the same in every panel
    (one legend, by the first); a line's style says which counter it is
    where a panel holds two (PCIe in and out, NVML's util standing in)."""
    by = {}
    for s in rep["counters"]["series"]:
        by[(s["host"], s["gpu"], s["metric"])] = s
    colours = _gpu_colours(gpus)
    tz = _tz(rep["start"])
    out = []
    for title, unit, metrics, fallback in PANELS:
        lines, styles = [], {}        # (x, y, colour, style); style -> what it draws
        for h, g in gpus:
            chosen = [(m, lab, "-" if j == 0 else "--") for j, (m, lab) in enumerate(metrics) if (h, g, m) in by]
            if not chosen and fallback and (h, g, fallback[0]) in by:
                chosen = [(fallback[0], fallback[1], ":")]
            for m, lab, style in chosen:
                s = by[(h, g, m)]
                lines.append((_x(s["t"], tz), s["v"], colours[(h, g)], style))
                if lab:
                    styles[style] = lab
        if not lines:
            continue
        top = max((max(v) for _, v, *_ in lines if v), default=0.0)
        scale, label = _axis_unit(unit, top)
        out.append((title, unit, label, _drawer(lines, scale, unit, styles)))
    return out


def _axis_unit(unit: str, top: float) -> tuple[float, str]:
    """(divide by, the axis' unit): ratios as %, bytes/s with the SI prefix
    of the largest value (collectors/human.py's conventions)."""
    if unit == "ratio":
        return 0.01, "%"
    if unit == "bytes/s":
        scale, prefix = human.si_scale(top) if top > 0 else (1.0, "")
        return scale, f"{prefix}B/s"
    return 1.0, {"watts": "W", "cores": "cores"}.get(unit, unit)


def _drawer(lines, scale: float, unit: str, styles: dict[str, str]):
    import numpy as np
    from matplotlib.lines import Line2D

    def draw(ax) -> list:
        for x, y, colour, style in lines:
            ax.plot(x, np.asarray(y, dtype=float) / scale, color=colour, linestyle=style, linewidth=1.0)
        if unit == "ratio":
            ax.set_ylim(0, 105)
        else:
            ax.set_ylim(bottom=0)
        return [Line2D([], [], color="#222222", linestyle=st, label=lab) for st, lab in styles.items()]
    return draw


def _gpu_colours(gpus) -> dict:
    if len(gpus) == 1:
        return {gpus[0]: LINE_ONE_GPU}
    # tab10 without its grey: the lines are told apart by the legend beside them
    cycle = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
             "#000000"]
    return {k: cycle[i % len(cycle)] for i, k in enumerate(gpus)}


# -- roofline ----------------------------------------------------------------------------
def roofline_png(rep: dict) -> tuple[bytes, dict] | None:
    """The captured ops on a log-log roofline (arithmetic intensity against
    achieved FLOP/s) under each device's peaks; None when there are no
    captures in the range. With it, where its axes are (x0..y1 in the
    image's pixels, origin top left; xlim/ylim as FLOP/byte and FLOP/s)."""
    points = [(n, c, op) for n, c in enumerate(rep["captures"], 1) for op in c["top_ops"]
              if op.get("intensity_flops_per_byte") and op.get("achieved_flops_per_s")]
    if not points:              # no captured op with FLOPs and bytes: an empty chart says nothing
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 5.6), dpi=DPI)
    fig.subplots_adjust(left=0.13, right=0.74, top=0.9, bottom=0.12)
    xs = [op["intensity_flops_per_byte"] for _, _, op in points]
    ys = [op["achieved_flops_per_s"] for _, _, op in points]
    peaks = rep["peaks"]
    ridges = [p["ridge"] for p in peaks]
    lo_x = min(xs + ridges + [1.0]) / 10
    hi_x = max(xs + ridges + [1.0]) * 10
    hi_y = max(ys + [p["flops_per_s"] for p in peaks] + [1e9]) * 3
    lo_y = min(ys + [p["bytes_per_s"] * lo_x for p in peaks] + [hi_y / 1e4]) / 3
    import numpy as np
    grid_x = np.logspace(math.log10(lo_x), math.log10(hi_x), 200)
    for k, p in enumerate(peaks):
        style = ["-", "--", ":"][k % 3]
        ax.plot(grid_x, np.minimum(p["flops_per_s"], p["bytes_per_s"] * grid_x), color="#000000", linestyle=style,
                linewidth=1.4, label=f"{p['device'] or 'device'} roof ({p['source']})")
        ax.axvline(p["ridge"], color="#777777", linestyle=":", linewidth=1)
        ax.annotate(f"ridge point {p['ridge']:.0f} FLOP/byte", (p["ridge"], lo_y), textcoords="offset points",
                    xytext=(4, 6), fontsize=8, color="#444444")
        ax.annotate(f"peak {human.si(p['flops_per_s'], 'FLOP/s')}", (hi_x, p["flops_per_s"]),
                    textcoords="offset points", xytext=(-4, 4), ha="right", fontsize=8)
        ax.annotate(f"HBM {human.si(p['bytes_per_s'], 'B/s')}", (lo_x * 1.3, p["bytes_per_s"] * lo_x * 1.3),
                    textcoords="offset points", xytext=(-2, 10), fontsize=8)
    markers = "osD^vP*X"
    from matplotlib.lines import Line2D
    captured = []
    for n, c in enumerate(rep["captures"], 1):
        mine = [op for m, _, op in points if m == n]
        if not mine:
            continue
        ax.scatter([op["intensity_flops_per_byte"] for op in mine], [op["achieved_flops_per_s"] for op in mine],
                   s=[30 + 400 * (op.get("time_fraction") or 0) for op in mine], marker=markers[(n - 1) % 8],
                   c=[VERDICT_COLOURS.get(f"{op.get('bound')}-bound", UNKNOWN_BOUND) for op in mine],
                   edgecolors="#000000", linewidths=0.6, zorder=3)
        captured.append(Line2D([], [], marker=markers[(n - 1) % 8], color="#FFFFFF", markeredgecolor="#000000",
                               markersize=7, linestyle="none", label=f"C{n}'s ops"))
        top = mine[0]
        ax.annotate(f"C{n} {top.get('op') or top.get('kernel', '')[:24]}",
                    (top["intensity_flops_per_byte"], top["achieved_flops_per_s"]), textcoords="offset points",
                    xytext=(12, -3), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(lo_y, hi_y)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)", fontsize=9)
    ax.set_ylabel("achieved compute (FLOP/s)", fontsize=9)
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _decade(v, "FLOP/s")))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(True, which="major", color="#E5E5E5", linewidth=0.6)
    source = " and ".join(sorted({p["source"] for p in peaks})) or "none known"
    ax.set_title(f"roofline of the captured ops (peaks: {source}); marker size: share of the capture's kernel "
                 "time", fontsize=9, loc="left")
    from matplotlib.patches import Patch
    handles, _ = ax.get_legend_handles_labels()
    handles += captured + [Patch(facecolor=VERDICT_COLOURS["compute-bound"], label="op above the ridge (compute)"),
                Patch(facecolor=VERDICT_COLOURS["memory-bound"], label="op below the ridge (memory)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.canvas.draw()
    box, height = ax.get_window_extent(), fig.bbox.height
    geometry = dict(width=int(round(fig.bbox.width)), height=int(round(height)), x0=box.x0, x1=box.x1,
                    y0=height - box.y1, y1=height - box.y0, xlim=[lo_x, hi_x], ylim=[lo_y, hi_y])
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    plt.close(fig)
    return out.getvalue(), geometry


def _decade(v: float, unit: str) -> str:
    if v <= 0:
        return ""
    scale, prefix = human.si_scale(v)
    return f"{v / scale:g} {prefix}{unit}"


# -- the page ----------------------------------------------------------------------------
CSS = """
body { font-family: sans-serif; margin: 16px; color: #111; max-width: 1340px; }
h1 { font-size: 20px; margin: 0 0 4px 0; } h2 { font-size: 16px; margin: 22px 0 6px 0; }
.meta, .note { color: #444; font-size: 13px; margin: 2px 0; }
.note { color: #7a4b00; }
img.chart { display: block; border: 0; max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 10px 0; }
th, td { border: 1px solid #CCC; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #F4F4F4; } td.num, td.when { text-align: right; white-space: nowrap; }
tr.this td { background: #FFF8DC; font-weight: bold; }
.sw { display: inline-block; width: 11px; height: 11px; margin-right: 5px; vertical-align: -1px;
      border: 1px solid #0003; }
ul.try { margin: 0; padding-left: 16px; } pre { font-size: 12px; background: #F8F8F8; padding: 8px; }
.legend span.item { margin-right: 14px; font-size: 12px; white-space: nowrap; }
"""


def page(rep: dict, *, title: str, story: str | None = None, generated: float | None = None,
         timeline: tuple[bytes, dict] | None = None, roofline: tuple[bytes, dict] | None = None,
         command: str = "", highlight: str | None = None) -> str:
    """One self-contained HTML document: no script, and nothing fetched (the
    charts are data: URIs, the style inline)."""
    esc = html.escape
    tz = _tz(rep["start"])
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    where = (f"host {rep['host']}" if rep.get("host") else "the fleet") + \
        (f", GPU {rep['gpu']}" if rep.get("gpu") is not None else "")
    parts.append(f"<p class=\"meta\">{esc(where)}: {esc(_when(rep['start'], tz))} to {esc(_when(rep['end'], tz))} "
                 f"({esc(tz.tzname(None))}, {esc(_lasted(rep['end'] - rep['start']))}); "
                 f"{human.many(len(rep['gpus']), 'GPU')} drawn of {rep.get('gpus_in_range', len(rep['gpus']))} "
                 f"with samples; {human.many(len(rep['findings']), 'finding')}, "
                 f"{human.many(len(rep['captures']), 'capture')}. Made {esc(_when(generated or time.time()))}"
                 + (f" by <code>{esc(command)}</code>" if command else "") + ".</p>")
    for n in rep["notes"]:
        parts.append(f"<p class=\"note\">{esc(n)}</p>")
    parts.append("<h2>Verdicts and counters</h2>")
    parts.append("<p class=\"legend\">" + "".join(
        f"<span class=\"item\"><span class=\"sw\" style=\"background:{c}\"></span>{esc(v)}</span>"
        for v, c in list(VERDICT_COLOURS.items()) + [("no window judged", NO_WINDOW)]
        + list(FLAG_COLOURS.items())) + "</p>")
    if timeline:
        parts.append(_img(timeline, "timeline", "Each GPU's verdict window by window (lanes), findings as outlined "
                                                "spans under them, captures as triangles, and the counters behind "
                                                "the verdicts on the same time axis"))
        g = timeline[1]
        parts.append(f"<p class=\"meta\">Top to bottom: {esc('; '.join(g['panels']))}; across: "
                     f"{esc(g['time_axis'])}. Each lane is a GPU: its verdict window by window (a power cap or "
                     "thermal throttle as a strip under it), its findings as outlined spans below, captures as "
                     "triangles labelled as in the tables. Host CPU is that of the processes holding the GPU "
                     "(1 = one core).</p>")
    if story:                   # the charts first: they say at a glance what the story then tells in numbers
        parts.append(f"<h2>The finding</h2><pre>{esc(story)}</pre>")
    parts.append("<h2>Roofline of the captured ops</h2>")
    if roofline:
        parts.append(_img(roofline, "roofline", "The captured ops by arithmetic intensity and achieved FLOP/s, "
                                                "under the device's compute and bandwidth roofs"))
    else:
        parts.append(f"<p class=\"meta\">{'No captured op with FLOPs and bytes' if rep['captures'] else 'No captures'}"
                     " in this range: nothing to place on a roofline "
                     "(<code>gpuscope capture</code> takes one, and the detector takes them when a GPU "
                     "changes).</p>")
    parts += _peaks_html(rep)
    parts += _ops_html(rep)
    parts += _findings_html(rep, tz, highlight)
    parts += _captures_html(rep, tz)
    parts.append("<p class=\"meta\">Colours: one per verdict, the same in every gpuscope report (Okabe–Ito, "
                 "legible with colour-vision deficiencies). Ratios are drawn as %, rates with SI prefixes. Charts by "
                 f"matplotlib {esc(_mpl_version())}.</p></body></html>")
    return "\n".join(parts)


def _img(png: tuple[bytes, dict], name: str, alt: str) -> str:
    data, geometry = png
    width = geometry["width"]
    return (f"<img class=\"chart\" id=\"{name}\" width=\"{width}\" alt=\"{html.escape(alt)}\" "
            f"data-axes='{html.escape(json.dumps(geometry), quote=True)}' "
            f"src=\"data:image/png;base64,{base64.b64encode(data).decode('ascii')}\">")


def _swatch(verdict: str | None) -> str:
    colour = VERDICT_COLOURS.get(verdict or "", UNKNOWN_BOUND)
    return f"<span class=\"sw\" style=\"background:{colour}\"></span>{html.escape(verdict or '—')}"


def _peaks_html(rep: dict) -> list[str]:
    if not rep["captures"]:
        return []
    if not rep["peaks"]:
        return ["<p class=\"meta\">Peaks: none known (no GPU is calibrated, no trace gave them and no GPU's name "
                "is in the datasheet table).</p>"]
    return ["<p class=\"meta\">Peaks of " + html.escape(p["device"] or "the device") + ": "
            + html.escape(f"{human.si(p['flops_per_s'], 'FLOP/s')} compute, {human.si(p['bytes_per_s'], 'B/s')} "
                          f"memory bandwidth, ridge point {p['ridge']:.0f} FLOP/byte") + " — "
            + {"trace": "<b>from the trace</b>", "measured": "<b>measured</b>"}.get(p["source"], "<b>datasheet</b>")
            + " (" + html.escape(p["how"]) + ").</p>" for p in rep["peaks"]]


def _ops_html(rep: dict) -> list[str]:
    rows = []
    for n, c in enumerate(rep["captures"], 1):
        for op in c["top_ops"]:
            rows.append(
                f"<tr><td>C{n}</td><td>{html.escape(op.get('op') or '—')}</td>"
                f"<td>{html.escape((op.get('kernel') or '')[:60])}</td>"
                f"<td class=\"num\">{human.percent(op.get('time_fraction'))}</td>"
                f"<td class=\"num\">{_num(op.get('intensity_flops_per_byte'))}</td>"
                f"<td class=\"num\">{human.si(op.get('achieved_flops_per_s'), 'FLOP/s')}</td>"
                f"<td class=\"num\">{human.si(op.get('achieved_bytes_per_s'), 'B/s')}</td>"
                f"<td>{_swatch(op['bound'] + '-bound') if op.get('bound') else '—'}"
                f" <small>({html.escape(op.get('bound_source') or '')})</small></td>"
                f"<td class=\"num\">{human.percent(op.get('fraction_of_peak'))}</td></tr>")
    if not rows:
        return []
    return ["<table><tr><th>capture</th><th>op</th><th>kernel</th><th>kernel time</th><th>FLOP/byte</th>"
            "<th>achieved FLOP/s</th><th>achieved bytes/s</th><th>bound (how known)</th><th>of peak</th></tr>"]\
        + rows + ["</table>"]


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def _findings_html(rep: dict, tz, highlight: str | None = None) -> list[str]:
    out = ["<h2>Findings</h2>"]
    if not rep["findings"]:
        return out + ["<p class=\"meta\">No findings in this range (idle is no finding).</p>"]
    out.append("<table><tr><th>finding</th><th>GPU</th><th>verdict</th><th>from</th><th>to</th><th>lasted</th>"
               "<th>confidence</th><th>summary</th><th>what to try</th></tr>")
    for f in rep["findings"]:
        lasted = (f["end"] if f["end"] is not None else rep["end"]) - f["start"]
        flags = ", ".join(x.replace("_", "-") for x in f.get("flags") or ())
        tries = "".join(f"<li>{html.escape(t)}</li>" for t in f.get("what_to_try") or ())
        mark = " class=\"this\"" if f["id"] == highlight else ""
        out.append(f"<tr{mark}><td><code>{html.escape(f['id'])}</code></td>"
                   f"<td>{html.escape(_gpu_name(f['host'], f['gpu']))}</td>"
                   f"<td>{_swatch(f['verdict'])}{'<br><small>' + html.escape(flags) + '</small>' if flags else ''}"
                   f"</td><td class=\"when\">{html.escape(_when(f['start'], tz))}</td>"
                   f"<td class=\"when\">{html.escape(_when(f['end'], tz))}</td>"
                   f"<td class=\"num\">{html.escape(_lasted(lasted))}</td>"
                   f"<td class=\"num\">{f['confidence']:.2f}</td><td>{html.escape(f.get('summary') or '')}</td>"
                   f"<td><ul class=\"try\">{tries}</ul></td></tr>")
    return out + ["</table>"]


def _captures_html(rep: dict, tz) -> list[str]:
    if not rep["captures"]:
        return []
    out = ["<h2>Captures</h2><table><tr><th></th><th>capture</th><th>GPU</th><th>at</th><th>kind</th>"
           "<th>status</th><th>trace verdict</th><th>what the trace said</th></tr>"]
    for n, c in enumerate(rep["captures"], 1):
        gpus = ",".join(str(g) for g in c["gpus"]) or "—"
        out.append(f"<tr><td><b>C{n}</b></td><td><code>{html.escape(c['id'])}</code></td>"
                   f"<td>{html.escape(c['host'])}/gpu{html.escape(gpus)}</td>"
                   f"<td>{html.escape(_when(c['start'], tz))}</td><td>{html.escape(c.get('kind') or '')}</td>"
                   f"<td>{html.escape(c.get('status') or '')}</td><td>{_swatch(c.get('verdict'))}</td>"
                   f"<td>{html.escape(c.get('trace_summary') or c.get('error') or '')}</td></tr>")
    return out + ["</table>"]


def _mpl_version() -> str:
    import matplotlib
    return matplotlib.__version__
