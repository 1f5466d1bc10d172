"""What every command of the command line shares."""
from __future__ import annotations

import argparse
import math
import json
import os
import re
import sys

from gpuscope.collectors.records import FINDING_KINDS, POD_JOB_PREFIX  # noqa: F401 (for the commands)

VERDICTS = ("compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound", "idle")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


class UsageError(Exception):
    """A command cannot do what it was asked; the message says what to do.
    `exit_status` 2 where it cannot act here at all without another flag,
    as argparse exits for a command line it cannot run."""

    def __init__(self, message: str, exit_status: int = 1):
        super().__init__(message)
        self.exit_status = exit_status


def duration(value: str) -> float:
    m = _DURATION.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90s, 15m, 1h, 2d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


_BYTES = re.compile(r"^(\d+(?:\.\d+)?)\s*(|B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)(?:/s)?$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "b": 1, "kb": 1e3, "kib": 1 << 10, "mb": 1e6, "mib": 1 << 20, "gb": 1e9, "gib": 1 << 30,
               "tb": 1e12, "tib": 1 << 40}


def byte_rate(value: str) -> int:
    """Bytes a second: 256KiB, 1MB/s, 300000; 0 for off."""
    m = _BYTES.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size a second like 256KiB, 1MiB/s or 0 (off)")
    n = float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()]
    if 0 < n < 1000 or n > 1 << 40:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0 (off) or from 1KB to 1TiB a second")
    return int(n)


def positive_duration(value: str) -> float:
    """A duration above 0: `--since 0` asked for nothing and three commands
    answered three different things (found in a trial)."""
    seconds = duration(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is no time at all: give a duration above 0, like 15m or 1h")
    return seconds


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 1 to {2**31 - 1}")
    return n


def positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not 0 < x <= 86_400 * 7:          # NaN fails too
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0 (at most a week)")
    return x


def number(lo: float, hi: float, kind=float, unit: str = "", zero: bool = False, above: bool = False):
    """An argparse type: a number from lo to hi (above lo when `above`; 0
    also allowed when `zero`), refused at parse time, before anything
    starts, with the range in the message."""
    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            x = None
        ok = x is not None and x == x and ((lo < x if above else lo <= x) and x <= hi or zero and x == 0)
        if not ok:
            span = (f"above {lo:g} and at most {hi:g}{unit}" if above else f"from {lo:g} to {hi:g}{unit}") + (
                " (0: off)" if zero else "")
            raise argparse.ArgumentTypeError(f"{value!r} is not a {'whole ' if kind is int else ''}number {span}")
        return x
    return parse


def age(seconds: float) -> str:
    """A duration for people: 45s, 12m, 5h, 3d."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def seen(stale: bool, age_s: float | None) -> str:
    """When a GPU was last heard from: `3s`, or `STALE 4m`."""
    text = age(age_s) if age_s is not None else ("never" if stale else "-")
    return f"STALE {text}" if stale else text


def default_db() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpuscope", "gpuscope.duckdb")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


def whose_beside(job: str | None, a: dict | None) -> str:
    """whose(a) beside a job's name; nothing when the job is the pod its
    source named (`pod ml/trainer-0 container main`: it would say it twice)."""
    return "" if (job or "").startswith(POD_JOB_PREFIX) else whose(a)


def whose(a: dict | None) -> str:
    """A job's attribution in words, most telling first: `pod ml/trainer-0
    (container main), user alice`, `slurm job 81234 step 0, user alice`;
    "" when nothing is known."""
    a = a or {}
    words = []
    if a.get("pod"):
        words.append(f"pod {a.get('namespace') or '?'}/{a['pod']}"
                     + (f" (container {a['container']})" if a.get("container") else ""))
    elif a.get("pod_uid"):
        words.append(f"pod uid {a['pod_uid']}")
    if a.get("slurm_job"):
        words.append(f"slurm job {a['slurm_job']}" + (f" step {a['slurm_step']}" if a.get("slurm_step") else ""))
    user = a.get("slurm_user") or a.get("user")
    if user:
        words.append(f"user {user}")
    if a.get("container_id") and not a.get("pod"):
        words.append(f"{a.get('runtime') or 'container'} {a['container_id'][:12]}")
    if a.get("unit") and not (a.get("pod") or a.get("slurm_job") or a.get("container_id")):
        words.append(f"unit {a['unit']}")
    if a.get("workload"):
        words.append(a["workload"])
    if a.get("cgroup"):
        words.append(f"cgroup {a['cgroup']}")
    return ", ".join(words)
