"""Calibration on a schedule, in the agent: each GPU's ceilings measured
again every `every_s` (default a week), only while the GPU is idle, and
stopped if a job arrives.

A GPU is idle when its newest sample shows no process on it and its
utilisation under `idle_util`; it must have stayed so for `idle_for_s`
(15 minutes) before a run starts, so that the gap between two jobs of a
queue is not taken for a free GPU. One GPU at a time, in a process of its
own (`gpuscope calibrate --quick --send ...`): JAX claims GPU memory, and an
agent must never hold it. The child refuses a GPU another process holds
(it is not given --force); while it runs, a process other than the child
appearing on the GPU stops it (SIGTERM), and the run is tried again later.

When each GPU (by UUID: the ceiling follows the GPU) was last calibrated is
kept in a small JSON file, so a restarted agent does not measure again; a
failed run is retried after `retry_s`. Nothing here can stop the agent: a
missing JAX, a refused --send, a crash of the child are logged (once per
distinct failure) and tried again later.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import structlog

from gpuscope.collectors.records import DeviceInfo

log = structlog.get_logger("gpuscope.calibration")


@dataclass(frozen=True)
class ScheduleConfig:
    state_path: str
    every_s: float = 7 * 86400.0
    idle_for_s: float = 900.0
    idle_util: float = 0.05
    retry_s: float = 6 * 3600.0
    timeout_s: float = 600.0           # --quick takes about 30-60 s on an H200
    check_every_s: float = 10.0


class GpuView(Protocol):
    """What the schedule reads of the agent."""
    latest: dict[int, dict[str, float]]

    def devices(self) -> list[DeviceInfo]: ...
    def gpu_pids(self) -> dict[int, list[int]]: ...


class CalibrationSchedule:
    def __init__(self, config: ScheduleConfig, agent: GpuView, command: Callable[[int], list[str]],
                 clock: Callable[[], float] = time.time, popen: Callable[..., subprocess.Popen] = subprocess.Popen):
        self.config = config
        self.agent = agent
        self.command = command
        self._clock = clock
        self._popen = popen
        self.last_done: dict[str, float] = self._load()
        self.failed_at: dict[str, float] = {}
        self.last_error: dict[str, str] = {}
        self._idle_since: dict[int, float] = {}
        self.running: tuple | None = None    # gpu, uuid, child, started, its stderr file
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="calibration", daemon=True)
        self._thread.start()
        log.info("calibration schedule on", every_h=round(self.config.every_s / 3600, 1),
                 idle_for_s=self.config.idle_for_s, state=self.config.state_path)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.running is not None:
            self._end_child("the agent is stopping")

    def _run(self) -> None:
        while not self._stop.wait(self.config.check_every_s):
            try:
                self.tick()
            except Exception:  # top of a loop that must survive
                log.exception("calibration schedule failed; trying again at the next check")

    def tick(self) -> None:
        now = self._clock()
        pids = self.agent.gpu_pids()
        busy = {g for gs in pids.values() for g in gs}
        if self.running is not None:
            self._watch_child(now, pids)
            return
        for d in self.agent.devices():
            util = (self.agent.latest.get(d.gpu) or {}).get("util_gpu_ratio")
            if d.lost or d.gpu in busy or util is None or util >= self.config.idle_util:
                self._idle_since.pop(d.gpu, None)
                continue
            since = self._idle_since.setdefault(d.gpu, now)
            if d.uuid and now - since >= self.config.idle_for_s and self._due(d.uuid, now):
                self._launch(d, now)
                return

    def _due(self, uuid: str, now: float) -> bool:
        return (now - self.last_done.get(uuid, float("-inf")) >= self.config.every_s
                and now - self.failed_at.get(uuid, float("-inf")) >= self.config.retry_s)

    # -- the child -----------------------------------------------------------------------------
    def _launch(self, d: DeviceInfo, now: float) -> None:
        argv = self.command(d.gpu)
        # a file, not a pipe: JAX's start-up chatter would fill a pipe nobody reads until the end
        err = tempfile.TemporaryFile(mode="w+")
        try:
            child = self._popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
        except OSError as exc:
            err.close()
            self._failed(d.uuid, now, f"could not start {argv[0]}: {exc}")
            return
        self.running = (d.gpu, d.uuid, child, now, err)
        log.info("calibration started", gpu=d.gpu, uuid=d.uuid, pid=child.pid,
                 idle_for_s=round(now - self._idle_since.get(d.gpu, now)))

    def _watch_child(self, now: float, pids: dict[int, list[int]]) -> None:
        gpu, uuid, child, started, err = self.running
        rc = child.poll()
        if rc is None:
            intruders = sorted(p for p, gs in pids.items() if gpu in gs and p != child.pid)
            if intruders:      # not a failure: the GPU is due again once it has been idle long enough
                self._end_child(f"a job started on the GPU (pid {intruders[0]})")
                self._idle_since.pop(gpu, None)
            elif now - started > self.config.timeout_s:
                self._end_child(f"it ran past {self.config.timeout_s:.0f} s")
                self._failed(uuid, now, f"ran past {self.config.timeout_s:.0f} s")
            return
        self.running = None
        self._idle_since.pop(gpu, None)
        err.seek(0)
        said = err.read().strip().splitlines()
        err.close()
        if rc == 0:
            self.last_done[uuid] = now
            self.failed_at.pop(uuid, None)
            self.last_error.pop(uuid, None)
            self._save()
            log.info("calibration sent", gpu=gpu, uuid=uuid, seconds=round(now - started, 1))
            return
        self._failed(uuid, now, f"exit {rc}: {said[-1] if said else 'no message'}")

    def _end_child(self, why: str) -> None:
        gpu, uuid, child, _, err = self.running
        self.running = None
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        err.close()
        log.warning("calibration stopped", gpu=gpu, uuid=uuid, reason=why)

    def _failed(self, uuid: str, now: float, error: str) -> None:
        self.failed_at[uuid] = now
        if self.last_error.get(uuid) != error:      # a host without JAX says so once, not weekly per GPU
            log.warning("calibration failed; trying again later", uuid=uuid, error=error[:500],
                        retry_in_h=round(self.config.retry_s / 3600, 1))
        self.last_error[uuid] = error

    # -- state ---------------------------------------------------------------------------------
    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(Path(self.config.state_path).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("calibration state unreadable; every GPU is due", path=self.config.state_path, error=str(exc))
            return {}
        return {str(k): float(v) for k, v in (data.get("last_calibrated") or {}).items()
                if isinstance(v, (int, float))}

    def _save(self) -> None:
        path = Path(self.config.state_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibrations.")
            with os.fdopen(fd, "w") as f:
                json.dump({"last_calibrated": self.last_done}, f)
            os.replace(tmp, path)        # whole or not at all: a crash mid-write keeps the old file
        except OSError as exc:
            log.warning("calibration state not saved; a restart measures again", path=str(path), error=str(exc))
