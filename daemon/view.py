"""The live view of `gpuscope up`: each GPU's verdict, a minute of its
activity, the open findings, and on exit what was seen.

On a terminal it is a full screen drawn with rich (the alternate screen, as
top uses: it fits the terminal's width and follows a resize, and the shell's
screen is back on exit); the process's logs go to a file meanwhile, so no
log line lands in the view. Otherwise it prints a line whenever a GPU's
verdict changes or it goes stale (no samples for the analyzer's staleness
horizon) or comes back, so a log keeps the story.
"""
from __future__ import annotations

import io
import sys
import time
from collections import Counter
from typing import Callable, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .cliutil import age, seen, whose
from gpuscope.collectors.human import many

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None], width: int = 12) -> str:
    """Ratios 0-1 as block characters, the newest last; a gap is a space."""
    out = []
    for v in values[-width:]:
        out.append(" " if v is None or v != v else SPARK[min(int(max(v, 0.0) * len(SPARK)), len(SPARK) - 1)])
    return "".join(out).rjust(width)


def _seen(g: dict) -> str:
    return seen(g.get("stale", False), g.get("last_seen_age_s"))


def screen(status: dict, open_findings: list[dict], header: str, now: float | None = None,
           trust: Callable[[str], str] = lambda verdict: "", activity: dict | None = None,
           warmup: tuple[int, int] | None = None, width: int = 160) -> Group:
    """What the view shows. `trust(verdict)`: words on a counters verdict's
    measured precision against traces; `activity`: (host, gpu) -> the last
    minute of its GPU activity (0-1), one value per 5 s; `warmup`: (windows seen, needed) of the
    detector."""
    now = time.time() if now is None else now
    activity = activity or {}
    gpus = Table(box=None, pad_edge=False, expand=False, header_style="bold")
    # the verdict, its confidence and when it was seen never shrink; on a narrow terminal the GPU's
    # name goes first, then the activity, and a long host name gives way
    columns = [("HOST", dict(overflow="ellipsis", no_wrap=True, min_width=6, max_width=24)),
               ("GPU", dict(justify="right", min_width=3, no_wrap=True)),
               ("NAME", dict(overflow="ellipsis", no_wrap=True, min_width=8, max_width=28)),
               ("VERDICT", dict(no_wrap=True, min_width=19)), ("CONF", dict(justify="right", min_width=4)),
               ("SEEN", dict(no_wrap=True, min_width=5)), ("ACTIVITY", dict(no_wrap=True, min_width=12)),
               ("FLAGS", dict(overflow="fold", min_width=5))]
    dropped = {"NAME"} if width < 100 else set()
    if width < 80:
        dropped.add("ACTIVITY")
    # rich crops, not shrinks, a row of unbreakable cells: the host name gets what the others leave
    fixed = sum(kw["min_width"] + 2 for name, kw in columns if name not in dropped | {"HOST", "FLAGS"}) + 14
    columns[0][1]["max_width"] = max(6, min(24, width - fixed))
    for name, kw in columns:
        if name not in dropped:
            gpus.add_column(name, **kw)
    for g in status["gpus"]:
        verdict = (g["verdict"] or "warming up") + (" (LOST)" if g["lost"] else "")
        cells = dict(HOST=g["host"], GPU=str(g["gpu"]), NAME=g["name"] or "", VERDICT=verdict,
                     CONF=f"{g['confidence']:.2f}", SEEN=_seen(g),
                     ACTIVITY=sparkline(activity.get((g["host"], g["gpu"]), [])), FLAGS=",".join(g["flags"]))
        gpus.add_row(*(cells[name] for name, _ in columns if name not in dropped))
    parts: list = [Text(header, style="bold"), Text(""), gpus]
    stale_gpus, stale_hosts = status.get("gpus_stale", 0), status.get("hosts_stale", 0)
    if stale_gpus:
        silent = f", {stale_hosts} host(s) silent" if stale_hosts else ""
        parts.append(Text(f"STALE: {stale_gpus} GPU(s){silent}: no samples for over "
                          f"{status.get('stale_after_seconds', 0):g}s; their verdicts are the last known"))
    if warmup is not None and warmup[0] < warmup[1]:
        parts.append(Text(f"detector warming up: {warmup[0]} of {warmup[1]} windows of the job seen; anomalies and "
                          f"triggered captures start after"))
    parts += [Text(""), Text(f"open findings: {len(open_findings)}", style="bold")]
    for f in open_findings[:8]:
        parts.append(Text(f"  {f['host']}/gpu{f['gpu']} {f['verdict']} for {age(now - f['start'])} "
                          f"(conf {f['confidence']:.2f}{trust(f.get('counters_verdict') or f['verdict'])}) "
                          f"{f['job'][:40]}" + (f" — {whose(f.get('attribution'))}" if whose(f.get("attribution"))
                                                  else "")))
        parts.append(Text(f"      {f['summary']}"))
    decisions = ", ".join(f"{k} {v}" for k, v in sorted(status.get("decisions", {}).items())) or "none"
    stored = status.get("samples_stored")
    lag = status.get("analysis_lag_seconds")
    parts += [Text(""),
              Text(f"anomalies {status.get('anomalies', 0)}  capture decisions: {decisions}  "
                   f"in flight {status.get('captures_in_flight', 0)}"),
              Text(f"hosts {status.get('hosts', 0)} ({stale_hosts} stale)  GPUs {len(status['gpus'])} "
                   f"({stale_gpus} stale)" + (f"  samples stored {stored:,}" if stored is not None else "")
                   + (f"  analysis lag {lag:.0f}s" if lag else "")),
              Text(f"samples {status['samples_committed']:,}  batches {status['batches_committed']:,}  "
                   f"rejected {status['batches_rejected']}  window {status['window_seconds']:g}s   Ctrl-C to stop")]
    return Group(*parts)


def render(status: dict, open_findings: list[dict], header: str, now: float | None = None,
           trust: Callable[[str], str] = lambda verdict: "", width: int = 160, **extra) -> str:
    """The screen as plain text, `width` columns wide."""
    console = Console(file=io.StringIO(), width=width, color_system=None, record=True, legacy_windows=False)
    console.print(screen(status, open_findings, header, now, trust, width=width, **extra))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def summary(findings: list[dict], ran_s: float) -> str:
    """What a run saw, for the shell once the view is gone."""
    by = Counter(f["verdict"] for f in findings)
    seen_ = ", ".join(f"{v} {n}" for v, n in by.most_common()) or "none"
    still = sum(f["end"] is None for f in findings)
    return (f"gpuscope up ran {age(ran_s)}: {many(len(findings), 'episode')} ({seen_}); "
            f"{many(still, 'still open', 'still open')}")


class LiveView:
    def __init__(self, out: TextIO = sys.stdout):
        self.out = out
        self.tty = out.isatty()
        self._live: Live | None = None
        self._last: dict[tuple[str, int], str] = {}
        self._stale: dict[tuple[str, int], bool] = {}

    def show(self, status: dict, open_findings: list[dict], header: str,
             trust: Callable[[str], str] = lambda verdict: "", **extra) -> None:
        if self.tty:
            if self._live is None:
                self._live = Live(console=Console(file=self.out), screen=True, auto_refresh=False,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start()
            # the width now: a resized terminal gets the columns that fit it
            view = screen(status, open_findings, header, trust=trust, width=self._live.console.size.width, **extra)
            self._live.update(view, refresh=True)
            return
        for g in status["gpus"]:
            key = (g["host"], g["gpu"])
            stale = bool(g.get("stale"))
            if stale != self._stale.get(key, False) and (stale or key in self._stale):
                silent = g.get("last_seen_age_s")
                self.out.write(f"{time.strftime('%H:%M:%S')} {g['host']}/gpu{g['gpu']}: "
                               + (f"stale, no samples for {age(silent) if silent is not None else 'ever'} "
                                  f"(last verdict {g['verdict'] or 'none'})\n" if stale else "reporting again\n"))
                self.out.flush()
            self._stale[key] = stale
            if g["verdict"] and not stale and self._last.get(key) != g["verdict"]:
                self._last[key] = g["verdict"]
                self.out.write(f"{time.strftime('%H:%M:%S')} {g['host']}/gpu{g['gpu']}: {g['verdict']} "
                               f"(conf {g['confidence']:.2f}{', ' + ','.join(g['flags']) if g['flags'] else ''})\n")
                self.out.flush()

    def close(self) -> None:
        """Gives the terminal its screen back."""
        if self._live is not None:
            self._live.stop()
            self._live = None
