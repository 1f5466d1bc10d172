"""The live view of `gpuscope up`: each GPU's verdict and the open findings.

On a terminal it redraws one screen a second; otherwise it prints a line
whenever a GPU's verdict changes or it goes stale (no samples for the
analyzer's staleness horizon) or comes back, so a log keeps the story.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from typing import Callable

from .cliutil import age, seen


def _seen(g: dict) -> str:
    return seen(g.get("stale", False), g.get("last_seen_age_s"))


def render(status: dict, open_findings: list[dict], header: str, now: float | None = None,
           trust: Callable[[str], str] = lambda verdict: "") -> str:
    """`trust(verdict)`: the words on a counters verdict's measured precision
    against traces (analyzers.accuracy.trust_words), '' where none is known."""
    now = time.time() if now is None else now
    lines = [header, "",
             f"{'HOST':<16} {'GPU':>3}  {'NAME':<24} {'VERDICT':<20} {'CONF':>5}  {'SEEN':<10} FLAGS"]
    for g in status["gpus"]:
        lost = " (LOST)" if g["lost"] else ""
        lines.append(f"{g['host'][:16]:<16} {g['gpu']:>3}  {(g['name'] or '')[:24]:<24} "
                     f"{(g['verdict'] or 'warming up') + lost:<20} {g['confidence']:>5.2f}  {_seen(g):<10} "
                     f"{','.join(g['flags'])}")
    stale_gpus, stale_hosts = status.get("gpus_stale", 0), status.get("hosts_stale", 0)
    if stale_gpus:
        silent = f", {stale_hosts} host(s) silent" if stale_hosts else ""
        lines.append(f"STALE: {stale_gpus} GPU(s){silent}: no samples for over "
                     f"{status.get('stale_after_seconds', 0):g}s; their verdicts are the last known")
    lines += ["", f"open findings: {len(open_findings)}"]
    for f in open_findings[:8]:
        lines.append(f"  {f['host']}/gpu{f['gpu']} {f['verdict']} for {age(now - f['start'])} "
                     f"(conf {f['confidence']:.2f}{trust(f.get('counters_verdict') or f['verdict'])})"
                     f" {f['job'][:40]}")
        lines.append(f"      {f['summary']}")
    decisions = ", ".join(f"{k} {v}" for k, v in sorted(status.get("decisions", {}).items())) or "none"
    stored = status.get("samples_stored")
    lag = status.get("analysis_lag_seconds")
    lines += ["", f"anomalies {status.get('anomalies', 0)}  capture decisions: {decisions}  "
              f"in flight {status.get('captures_in_flight', 0)}",
              f"hosts {status.get('hosts', 0)} ({stale_hosts} stale)  GPUs {len(status['gpus'])} ({stale_gpus} stale)"
              + (f"  samples stored {stored:,}" if stored is not None else "")
              + (f"  analysis lag {lag:.0f}s" if lag else ""),
              f"samples {status['samples_committed']:,}  batches {status['batches_committed']:,}  "
              f"rejected {status['batches_rejected']}  window {status['window_seconds']:g}s   Ctrl-C to stop"]
    return "\n".join(lines)


class LiveView:
    def __init__(self, out: TextIO = sys.stdout):
        self.out = out
        self.tty = out.isatty()
        self._last: dict[tuple[str, int], str] = {}
        self._stale: dict[tuple[str, int], bool] = {}

    def show(self, status: dict, open_findings: list[dict], header: str,
             trust: Callable[[str], str] = lambda verdict: "") -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + render(status, open_findings, header, trust=trust) + "\n")
            self.out.flush()
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
