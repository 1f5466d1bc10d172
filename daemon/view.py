"""The live view of `gpuscope up`: each GPU's verdict and the open findings.

On a terminal it redraws one screen a second; otherwise it prints a line
whenever a GPU's verdict changes, so a log keeps the story.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _age(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def render(status: dict, open_findings: list[dict], header: str, now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [header, "",
             f"{'HOST':<16} {'GPU':>3}  {'NAME':<24} {'VERDICT':<20} {'CONF':>5}  FLAGS"]
    for g in status["gpus"]:
        lost = " (LOST)" if g["lost"] else ""
        lines.append(f"{g['host'][:16]:<16} {g['gpu']:>3}  {(g['name'] or '')[:24]:<24} "
                     f"{(g['verdict'] or 'warming up') + lost:<20} {g['confidence']:>5.2f}  {','.join(g['flags'])}")
    lines += ["", f"open findings: {len(open_findings)}"]
    for f in open_findings[:8]:
        lines.append(f"  {f['host']}/gpu{f['gpu']} {f['verdict']} for {_age(now - f['start'])} "
                     f"(conf {f['confidence']:.2f}) {f['job'][:40]}")
        lines.append(f"      {f['summary']}")
    decisions = ", ".join(f"{k} {v}" for k, v in sorted(status.get("decisions", {}).items())) or "none"
    lines += ["", f"anomalies {status.get('anomalies', 0)}  capture decisions: {decisions}  "
              f"in flight {status.get('captures_in_flight', 0)}",
              f"samples {status['samples_committed']:,}  batches {status['batches_committed']:,}  "
              f"rejected {status['batches_rejected']}  window {status['window_seconds']:g}s   Ctrl-C to stop"]
    return "\n".join(lines)


class LiveView:
    def __init__(self, out: TextIO = sys.stdout):
        self.out = out
        self.tty = out.isatty()
        self._last: dict[tuple[str, int], str] = {}

    def show(self, status: dict, open_findings: list[dict], header: str) -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + render(status, open_findings, header) + "\n")
            self.out.flush()
            return
        for g in status["gpus"]:
            key = (g["host"], g["gpu"])
            if g["verdict"] and self._last.get(key) != g["verdict"]:
                self._last[key] = g["verdict"]
                self.out.write(f"{time.strftime('%H:%M:%S')} {g['host']}/gpu{g['gpu']}: {g['verdict']} "
                               f"(conf {g['confidence']:.2f}{', ' + ','.join(g['flags']) if g['flags'] else ''})\n")
                self.out.flush()
