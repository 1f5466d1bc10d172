"""The analyzer's status (what `GetStatus` answers), from one row per GPU and
the analyzer's totals.

Two places answer it: the Analyzer itself (one process), and, when the
analysis runs in a process of its own, the gRPC process from a mirror that
the analysis process keeps current (StatusMirror). Why a mirror: a fleet's
analysis process is a whole core of Python at 2,000 agents, and a status
answered there waited for its writer thread's GIL (0.7-0.9 s at p95,
docs/benchmarks.md); the gRPC process has the slack, and the rows that
changed cost the analysis process a few milliseconds a second to send.
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from typing import Callable, Iterable, NamedTuple

import numpy as np

Key = tuple[str, int]


class GpuRow(NamedTuple):
    host: str
    gpu: int
    name: str
    verdict: str
    confidence: float
    flags: tuple[str, ...]
    last_sample: float            # sample time (the agent's clock); 0: none
    last_arrival: float           # the analyzer's clock; 0: never heard from
    open_finding: str | None
    lost: bool
    source: str = ""              # where its samples come from (the agent's words)
    uuid: str = ""
    owner: tuple[str, str] = ("", "")    # (namespace, pod) of the open finding's job


def silence_time(now: float, behind_since: float | None) -> float:
    """When silence is judged: now, unless the analyzer is behind its
    agents (Writer.behind_since): then when it last kept up, so that its
    own backlog is never taken for silent agents."""
    return now if behind_since is None else min(now, behind_since)


def summarize(arrivals: Iterable[tuple[Key, float]], row_of: Callable[[Key], GpuRow], totals: dict,
              now: float, host: str = "", gpu_limit: int | None = None) -> dict:
    """The status: fleet counts over every GPU (`arrivals`: each GPU's last
    arrival), and the GPUs of `host` (all when empty) ordered by host and
    index, at most `gpu_limit` (None: all) — a fleet's full list is
    thousands of entries."""
    horizon = _horizon(totals, now)
    host_fresh: dict[str, bool] = {}
    stale_n = total = 0
    keys = []
    for key, last in arrivals:
        fresh = bool(last) and last >= horizon
        total += 1
        stale_n += not fresh
        host_fresh[key[0]] = host_fresh.get(key[0], False) or fresh
        if not host or key[0] == host:
            keys.append(key)
    keys.sort()
    matching = len(keys)
    if gpu_limit is not None:
        keys = keys[:gpu_limit]
    return _status(totals, [row_of(k) for k in keys], now, horizon, hosts=len(host_fresh),
                   hosts_stale=sum(1 for fresh in host_fresh.values() if not fresh), gpus_total=total,
                   gpus_matching=matching, gpus_stale=stale_n)


def _horizon(totals: dict, now: float) -> float:
    """An arrival before this is stale."""
    return silence_time(now, totals.get("ingest_behind_since")) - totals["stale_after_seconds"]


def _status(totals: dict, rows: list[GpuRow], now: float, horizon: float, *, hosts: int, hosts_stale: int,
            gpus_total: int, gpus_matching: int, gpus_stale: int) -> dict:
    gpus = []
    for r in rows:
        age = now - r.last_arrival if r.last_arrival else None
        gpus.append(dict(host=r.host, gpu=r.gpu, name=r.name, verdict=r.verdict, confidence=r.confidence,
                         flags=list(r.flags), last_sample=r.last_sample, open_finding=r.open_finding, lost=r.lost,
                         stale=not r.last_arrival or r.last_arrival < horizon, last_seen_age_s=age, source=r.source,
                         uuid=r.uuid, namespace=r.owner[0], pod=r.owner[1]))
    return dict(totals, hosts=hosts, hosts_stale=hosts_stale, gpus=gpus, gpus_total=gpus_total,
                gpus_matching=gpus_matching, gpus_stale=gpus_stale)


class StatusMirror:
    """The analysis process's GPU rows and totals, as last published: the
    rows a commit group's analysis or a sweep touched come after it. GPUs
    are never forgotten by the analyzer, so a row is only ever added or
    replaced.

    A status lists at most `gpu_limit` GPUs but counts the whole fleet
    (16,000 GPUs at 2,000 agents), asked for every second by dashboards and
    on-call tools: the keys are kept sorted and the arrivals in arrays, so a
    status costs its listed GPUs and a few array passes, not a sort of the
    fleet (40 ms at 2,000 agents before)."""

    def __init__(self) -> None:
        self._rows: dict[Key, GpuRow] = {}
        self._keys: list[Key] = []                  # sorted
        self._slot: dict[Key, int] = {}             # key -> its place in the arrays
        self._arrival = np.zeros(1024)              # each GPU's last arrival (0: never)
        self._host_of = np.zeros(1024, np.int64)    # each GPU's host, as an index into _hosts
        self._hosts: dict[str, int] = {}
        self._totals: dict | None = None
        self._at = -math.inf               # monotonic time of the last publication
        self._lock = threading.Lock()

    def age(self) -> float:
        """Seconds since the last publication (inf: none yet)."""
        return time.monotonic() - self._at

    def apply(self, rows: list[GpuRow], totals: dict) -> None:
        with self._lock:
            for r in rows:
                key = (r.host, r.gpu)
                slot = self._slot.get(key)
                if slot is None:
                    slot = self._slot[key] = len(self._slot)
                    if slot == len(self._arrival):
                        self._arrival = np.concatenate([self._arrival, np.zeros(slot)])
                        self._host_of = np.concatenate([self._host_of, np.zeros(slot, np.int64)])
                    self._host_of[slot] = self._hosts.setdefault(r.host, len(self._hosts))
                    bisect.insort(self._keys, key)
                self._arrival[slot] = r.last_arrival
                self._rows[key] = r
            self._totals = totals
            self._at = time.monotonic()

    def status(self, now: float, host: str = "", gpu_limit: int | None = None, **fresher) -> dict:
        """`fresher`: totals this process knows better (who is connected)."""
        with self._lock:
            totals = self._totals
            if totals is None:
                raise LookupError("nothing published yet")
            totals = {**totals, **fresher}
            horizon = _horizon(totals, now)
            n = len(self._slot)
            last = self._arrival[:n]
            fresh = (last != 0) & (last >= horizon)           # as summarize(): 0 is never heard from
            fresh_hosts = int(np.count_nonzero(np.bincount(self._host_of[:n][fresh], minlength=len(self._hosts))))
            lo, hi = (bisect.bisect_left(self._keys, (host,)), bisect.bisect_left(self._keys, (host, math.inf))) \
                if host else (0, n)
            rows = [self._rows[k] for k in self._keys[lo:hi if gpu_limit is None else min(hi, lo + gpu_limit)]]
            hosts = len(self._hosts)
        return _status(totals, rows, now, horizon, hosts=hosts, hosts_stale=hosts - fresh_hosts, gpus_total=n,
                       gpus_matching=hi - lo, gpus_stale=n - int(np.count_nonzero(fresh)))
