"""Host-side reading of GPU processes from /proc: CPU use, start time and
command line. Who a process belongs to is collectors/attribution.py's job.

The /proc root is injected so tests point it at a fixture tree. NVML reports
PIDs in the host's namespace; run the agent with the host's /proc (hostPID in
Kubernetes) or the numbers name the wrong processes.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/PID/stat after the ')' that closes the command name: field 3 (state)
# is index 0, so utime (14), stime (15) and starttime (22) are 11, 12 and 19.
_UTIME, _STIME, _STARTTIME = 11, 12, 19


class ProcStat:
    def __init__(self, proc_root: str | os.PathLike = "/proc",
                 clock: Callable[[], float] = time.monotonic,
                 max_tracked: int = 4096):
        self._root = Path(proc_root)
        self._root_str = str(self._root)
        self._clock = clock
        self._last: dict[int, tuple[float, float]] = {}   # pid -> (clock, cpu s)
        self._started: dict[int, int | None] = {}          # pid -> start time read with its CPU
        self._commands: dict[int, tuple[int | None, str]] = {}   # pid -> (start time, command)
        self._max = max_tracked

    def _stat(self, pid: int) -> tuple[float, int | None] | None:
        """(utime+stime in seconds, start time in clock ticks since boot or
        None when the line is short), or None when the process is gone or
        unreadable."""
        # os.open/os.read, not Path.read_bytes: this runs for every GPU process on every tick, and
        # pathlib's parsing and file object cost more than the read itself (~10 us of ~25 us)
        try:
            fd = os.open(f"{self._root_str}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.read(fd, 4096)       # one line of ~300 bytes; the command name is at most 64
        except OSError:
            return None
        finally:
            os.close(fd)
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = raw.rpartition(b")")[2].split()
        try:
            cpu = (int(fields[_UTIME]) + int(fields[_STIME])) / _TICKS
        except (IndexError, ValueError):
            return None
        try:
            return cpu, int(fields[_STARTTIME])
        except (IndexError, ValueError):
            return cpu, None

    def cpu_seconds(self, pid: int) -> float | None:
        """utime+stime of the process, or None when it is gone or unreadable."""
        stat = self._stat(pid)
        return None if stat is None else stat[0]

    def cpu_cores(self, pid: int) -> float | None:
        """CPU used since the previous call for this pid, in cores (1.0 = one
        core busy). None on first sight: a rate needs two readings. The
        start time read with it is kept for `started`."""
        now = self._clock()
        stat = self._stat(pid)
        if stat is None:
            self._last.pop(pid, None)
            self._started[pid] = None
            return None
        cpu, start = stat
        prev = self._last.get(pid)
        self._last[pid] = (now, cpu)
        # a new process under a reused pid is a first sight, not a rate against its predecessor
        reused = self._started.get(pid, start) != start
        self._started[pid] = start
        if prev is None or reused or now <= prev[0] or cpu < prev[1]:
            return None
        return (cpu - prev[1]) / (now - prev[0])

    def started(self, pid: int) -> int | None:
        """When the process started (clock ticks since boot), as read by the
        last `cpu_cores` of it, else read now; None when it is gone. With the
        pid it names one process: pids are reused, start times of one pid are
        not."""
        if pid in self._started:
            return self._started[pid]
        stat = self._stat(pid)
        return None if stat is None else stat[1]

    def command(self, pid: int) -> str:
        start = self.started(pid)
        cached = self._commands.get(pid)
        if cached is not None and (cached[0] == start or start is None):
            return cached[1]
        try:
            raw = (self._root / str(pid) / "cmdline").read_bytes()
            cmd = raw.replace(b"\0", b" ").strip().decode("utf-8", "replace")[:256]
        except OSError:
            cmd = ""
        self._commands[pid] = (start, cmd)
        return cmd

    def forget_except(self, live: set[int]) -> None:
        """Drop state of processes no longer on any GPU (PIDs get reused)."""
        if len(self._last) + len(self._commands) > 2 * len(live) + 64 or len(self._last) > self._max:
            for d in (self._last, self._commands, self._started):
                for pid in [p for p in d if p not in live]:
                    del d[pid]
