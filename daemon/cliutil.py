"""What every command of the command line shares."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

VERDICTS = ("compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound", "idle")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


class UsageError(Exception):
    pass


def duration(value: str) -> float:
    m = _DURATION.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90s, 15m, 1h, 2d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def default_db() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpuscope", "gpuscope.duckdb")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")
