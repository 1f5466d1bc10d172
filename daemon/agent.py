"""The agent: samples its collector on a monotonic cadence, keeps a ring of
recent samples, and hands every scrape to the uplink.

Start-up fails fast (the collector must start); after that nothing stops the
sampling loop: a failing scrape is logged, counted and retried next tick.
"""
from __future__ import annotations

import collections
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Protocol

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from gpuscope.collectors.records import DeviceInfo, GpuSample, HealthRecord, Scrape

from .captures import CaptureRecord, CaptureRunner
from .uplink import Uplink

log = structlog.get_logger("gpuscope.agent")
MIN_INTERVAL_S, MAX_RING_SAMPLES, MAX_ERROR_KEYS = 0.1, 200_000, 100


class Collector(Protocol):
    def start(self) -> None: ...
    def devices(self) -> list[DeviceInfo]: ...
    def scrape(self) -> Scrape: ...
    def scrape_slow(self) -> Scrape: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class AgentConfig:
    host: str
    source: str = "nvml"
    interval_s: float = 1.0
    slow_interval_s: float = 10.0
    ring_seconds: float = 600.0


class Agent:
    def __init__(self, config: AgentConfig, collector: Collector,
                 uplink_factory: Callable[[str, Callable[[], list[DeviceInfo]]], Uplink] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if config.interval_s < MIN_INTERVAL_S:
            raise ValueError(f"--interval must be at least {MIN_INTERVAL_S} s, got {config.interval_s}")
        self.config = config
        self.collector = collector
        self.boot_id = uuid.uuid4().hex[:16]
        self._uplink_factory = uplink_factory
        self.uplink: Uplink | None = None
        self._clock = clock
        self._stop = threading.Event()
        self._ring: collections.deque[GpuSample] = collections.deque(maxlen=1)
        self._ring_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._scheduler: BackgroundScheduler | None = None
        self.ticks = self.samples = self.overruns = 0
        self.errors: dict[str, int] = {}
        self.last_error = ""
        self.health: collections.deque[HealthRecord] = collections.deque(maxlen=256)
        self.captures: CaptureRunner | None = None
        self.discovery = None                       # collectors.jobs.JobDiscovery
        self.capture_reporter: Callable[[CaptureRecord, bytes], None] | None = None
        self._gpu_pids: dict[int, dict[int, str]] = {}   # gpu -> {pid: command}, from the latest samples

    def devices(self) -> list[DeviceInfo]:
        return self.collector.devices()

    def start(self, uplink_factory: Callable[[str, Callable[[], list[DeviceInfo]]], Uplink] | None = None) -> None:
        """uplink_factory here overrides the constructor's (`gpuscope up` learns
        its own port only after its server has bound)."""
        self._uplink_factory = uplink_factory or self._uplink_factory
        self.collector.start()                      # fail fast: only here may we refuse to run
        n = max(1, len(self.collector.devices()))
        per_tick = n * max(1, round(1.0 / self.config.interval_s))  # replay may emit several rows per tick
        self._ring = collections.deque(maxlen=min(MAX_RING_SAMPLES, int(self.config.ring_seconds * per_tick)))
        if self._uplink_factory is not None:
            self.uplink = self._uplink_factory(self.boot_id, self.devices)
            self.uplink.start()
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(self._slow_tick, "interval", seconds=self.config.slow_interval_s,
                                max_instances=1, coalesce=True, id="slow-scrape")
        self._scheduler.start()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        log.info("agent started", host=self.config.host, source=self.config.source,
                 gpus=n, interval_s=self.config.interval_s, boot_id=self.boot_id)

    def _run(self) -> None:
        interval = self.config.interval_s
        next_tick = self._clock()
        while not self._stop.is_set():
            try:
                self._handle(self.collector.scrape())
            except Exception as exc:  # top of a loop that must survive
                self._count_error(f"scrape: {type(exc).__name__}: {exc}")
                log.exception("scrape failed", host=self.config.host)
            self.ticks += 1
            next_tick += interval
            delay = next_tick - self._clock()
            if delay < 0:            # the tick overran: skip the missed ones, keep the cadence
                self.overruns += 1
                next_tick = self._clock()
                delay = 0
            if self._stop.wait(delay):
                return

    def _slow_tick(self) -> None:
        try:
            self._handle(self.collector.scrape_slow())
        except Exception as exc:  # top of a loop that must survive
            self._count_error(f"slow scrape: {type(exc).__name__}: {exc}")
            log.exception("slow scrape failed", host=self.config.host)

    def _handle(self, scrape: Scrape) -> None:
        if scrape.samples:
            with self._ring_lock:
                self._ring.extend(scrape.samples)
            self.samples += len(scrape.samples)
            for s in scrape.samples:
                if "procs_count" in s.values or s.processes:
                    self._gpu_pids[s.gpu] = {p.pid: p.command for p in s.processes}
        for key, n in scrape.errors.items():
            self._count_error(key, n)
        for h in scrape.health:
            self.health.append(h)
            log.warning("gpu health event", host=self.config.host, gpu=h.gpu, kind=h.kind.value, detail=h.detail)
        if self.uplink is not None and (scrape.samples or scrape.health):
            self.uplink.submit(scrape.samples, scrape.health)

    def _count_error(self, key: str, n: int = 1) -> None:
        self.last_error = key
        if key in self.errors or len(self.errors) < MAX_ERROR_KEYS:
            self.errors[key] = self.errors.get(key, 0) + n
        else:
            self.errors["other"] = self.errors.get("other", 0) + n

    def recent(self, seconds: float = 0.0, gpu: int | None = None) -> list[GpuSample]:
        with self._ring_lock:
            ring = list(self._ring)
        if seconds > 0 and ring:
            cutoff = ring[-1].t - seconds
            ring = [s for s in ring if s.t >= cutoff]
        if gpu is not None:
            ring = [s for s in ring if s.gpu == gpu]
        return ring

    def gpu_pids(self) -> dict[int, list[int]]:
        """pid -> the GPUs it runs on, from the latest sample of each GPU."""
        out: dict[int, list[int]] = {}
        for gpu, procs in self._gpu_pids.items():
            for pid in procs:
                out.setdefault(pid, []).append(gpu)
        return out

    def jobs(self) -> list:
        return self.discovery.discover(self.gpu_pids()) if self.discovery is not None else []

    def capture(self, duration_ms: int, address: str = "", pid: int | None = None,
                trigger: str = "on-call") -> tuple[CaptureRecord, bytes]:
        """Deep capture of one job now. Raises LookupError when the job has no
        profiler we can find, ValueError for a bad duration."""
        if self.captures is None:
            raise LookupError("captures are off on this agent (no --capture-dir)")
        gpus, job = [], ""
        if pid is not None:
            found = self.discovery.find(pid, self.gpu_pids().get(pid, [])) if self.discovery else None
            if found is None:
                raise LookupError(f"pid {pid}: no XLA profiler service found (start the job with "
                                  f"jax.profiler.start_server(PORT), or set GPUSCOPE_PROFILER_PORT in its environment)")
            address, gpus, job = found.address, found.gpus, f"pid:{pid} {found.command}".strip()
        else:
            for j in self.jobs():
                if j.address == address and j.pid is not None:
                    pid, gpus, job = j.pid, j.gpus, f"pid:{j.pid} {j.command}".strip()
        rec, data = self.captures.capture(address, duration_ms, pid=pid, gpus=gpus, job=job, trigger=trigger)
        if self.capture_reporter is not None:
            # The caller gets the trace now; the analyzer's summary and linking follow.
            threading.Thread(target=self._report, args=(rec, data), name="capture-report", daemon=True).start()
        return rec, data

    def _report(self, rec: CaptureRecord, data: bytes) -> None:
        try:
            self.capture_reporter(rec, data)
        except Exception as exc:  # the analyzer being away must not lose the capture
            rec.error = (rec.error + "; " if rec.error else "") + f"not reported to the analyzer: {exc}"
            log.warning("capture not reported", id=rec.id, error=str(exc))

    def status(self) -> dict:
        up = self.uplink.stats() if self.uplink else {}
        return dict(host=self.config.host, boot_id=self.boot_id, source=self.config.source,
                    interval_s=self.config.interval_s, ticks=self.ticks, samples=self.samples,
                    tick_overruns=self.overruns, errors=dict(self.errors), last_error=self.last_error,
                    devices=self.devices(), uplink=up)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        if self.uplink is not None:
            self.uplink.stop()
        self.collector.close()
        log.info("agent stopped", host=self.config.host, ticks=self.ticks)
