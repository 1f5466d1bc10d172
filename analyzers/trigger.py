"""Trigger policy: which anomalies become deep captures, and when not.

A capture costs the job (the profiler pauses nothing, but it does collect),
so the policy errs on the side of fewer: one capture per host at a time and
a cooldown after each, a per-job hourly limit, and a fleet-wide cap on hosts
capturing at once (a small fraction, as Google-Wide Profiling samples a
fraction of machines rather than all). Every decision is returned with its
reason, captured or not. A dry run applies the whole policy (connected
agents, cooldowns, job and fleet limits, as if each capture it would start
had run for its duration) and records what would have happened and why.
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Callable

from .detector import DEEP_KINDS, Anomaly
from .ids import new_id

CAPTURE, BURST = "capture", "counter-burst"


@dataclass(frozen=True)
class TriggerConfig:
    dry_run: bool = False
    host_cooldown_s: float = 600.0      # 10 min: a capture's trace explains the next minutes too
    job_captures_per_hour: int = 3      # beyond that a job is not "changing", it is flapping
    fleet_fraction: float = 0.05        # at most 5 % of known hosts capturing at once ...
    fleet_min_hosts: int = 1            # ... but always at least one
    capture_duration_ms: int = 2000     # 2 s: tens of steps of a training job, hundreds of decode steps
    burst_seconds: float = 30.0         # counter burst at 100 ms for throttling and health events
    timeout_s: float = 120.0            # no report by then: the agent went away mid-capture
    # a straggler finding traces every rank of its job (analyzers/coordinated.py), once per job per this long
    job_capture_cooldown_s: float = 3600.0
    job_capture_duration_ms: int = 3000  # a few dozen steps of every rank
    job_capture_lead_s: float = 2.0      # time for every agent to hear of it before it starts


@dataclass
class Decision:
    id: str
    t: float
    host: str
    gpu: int
    job: str
    anomaly_id: str
    action: str                         # capture, counter-burst, skip, dry-run
    reason: str
    status: str                         # pending, done, failed, skipped
    capture_id: str = ""
    updated: float = 0.0
    duration_ms: int = 0
    pid: int | None = None


@dataclass
class _InFlight:
    decision: Decision
    key: str
    started: float


def job_pid(job: str) -> int | None:
    head = job.split(" ")[0] if job else ""
    return int(head[4:]) if head.startswith("pid:") and head[4:].isdigit() else None


class TriggerPolicy:
    def __init__(self, config: TriggerConfig = TriggerConfig(), clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self._inflight: dict[str, _InFlight] = {}          # decision id -> in flight
        self._last_start: dict[str, float] = {}            # host -> last capture start
        self._job_starts: dict[str, collections.deque] = {}
        self._dry_until: dict[str, float] = {}             # dry run: host -> end of the capture it would run

    def decide(self, a: Anomaly, hosts_known: int, agent_connected: bool) -> Decision:
        now = self._clock()
        cfg = self.config
        action = CAPTURE if a.kind in DEEP_KINDS else BURST
        d = Decision(id=new_id(), t=now, host=a.host, gpu=a.gpu, job=a.job, anomaly_id=a.id,
                     action=action, reason="", status="pending", updated=now, pid=job_pid(a.job),
                     duration_ms=cfg.capture_duration_ms if action == CAPTURE else int(cfg.burst_seconds * 1e3))
        if a.kind == "gpu_lost":
            return self._skip(d, "the GPU is lost: nothing left to capture")
        proc_key = f"{a.host}/pid:{d.pid}" if d.pid is not None else f"{a.host}/gpu:{a.gpu}"
        job_key = f"{a.host}/{a.job.split(' ')[0] if a.job else a.gpu}"
        if not agent_connected:
            return self._skip(d, "the host's agent is not connected to the analyzer's command stream")
        self._dry_until = {h: t for h, t in self._dry_until.items() if t > now}
        if any(f.key == proc_key for f in self._inflight.values()):
            return self._skip(d, "a capture of this process is already running")
        if any(f.decision.host == a.host for f in self._inflight.values()) or a.host in self._dry_until:
            return self._skip(d, "this host is already capturing")
        last = self._last_start.get(a.host)
        if last is not None and now - last < cfg.host_cooldown_s:
            return self._skip(d, f"host cooldown: {cfg.host_cooldown_s - (now - last):.0f} s left")
        starts = self._job_starts.setdefault(job_key, collections.deque())
        while starts and now - starts[0] > 3600:
            starts.popleft()
        if len(starts) >= cfg.job_captures_per_hour:
            return self._skip(d, f"job limit: {len(starts)} captures of this job in the last hour")
        cap = max(cfg.fleet_min_hosts, math.ceil(cfg.fleet_fraction * max(hosts_known, 1)))
        capturing = {f.decision.host for f in self._inflight.values()} | set(self._dry_until)
        if len(capturing) >= cap:
            return self._skip(d, f"fleet cap: {len(capturing)} of {cap} allowed hosts are capturing")
        self._last_start[a.host] = now
        starts.append(now)
        if cfg.dry_run:
            self._dry_until[a.host] = now + d.duration_ms / 1e3
            return self._skip(d, f"dry-run: would start a {action} ({a.kind}: {a.reason})", action="dry-run")
        self._inflight[d.id] = _InFlight(d, proc_key, now)
        d.reason = f"{a.kind}: {a.reason}"
        return d

    def _skip(self, d: Decision, reason: str, action: str = "skip") -> Decision:
        d.action, d.status, d.reason = action, "skipped", reason
        return d

    def finished(self, decision_id: str, capture_id: str, ok: bool, detail: str = "") -> Decision | None:
        f = self._inflight.pop(decision_id, None)
        if f is None:
            return None
        d = f.decision
        d.status, d.capture_id, d.updated = ("done" if ok else "failed"), capture_id, self._clock()
        if detail:
            d.reason = f"{d.reason}; {detail}"
        return d

    def expire(self) -> list[Decision]:
        """Captures whose agent never reported back: failed, slot freed."""
        now = self._clock()
        out = []
        for did, f in list(self._inflight.items()):
            if now - f.started > self.config.timeout_s + f.decision.duration_ms / 1e3:
                d = self.finished(did, "", False, "no report from the agent (disconnected mid-capture?)")
                if d is not None:
                    out.append(d)
        return out

    @property
    def in_flight(self) -> int:
        return len(self._inflight)
