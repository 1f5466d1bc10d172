"""The agent: samples its collector on a monotonic cadence, keeps a ring of
recent samples, and hands every scrape to the uplink.

Start-up fails fast (the collector must start); after that nothing stops the
sampling loop: a failing scrape is logged, counted and retried next tick.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Protocol

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from gpuscope.collectors.records import (Attribution, DeviceInfo, GpuSample, HealthKind, HealthRecord,
                                        ProcessRecord, Scrape)
from gpuscope.security.redact import redact_command

from .captures import MAX_LEAD_S, CaptureRecord, CaptureRunner
from .uplink import Uplink

log = structlog.get_logger("gpuscope.agent")
MIN_INTERVAL_S, MAX_RING_SAMPLES, MAX_ERROR_KEYS = 0.1, 200_000, 100
BURST_INTERVAL_S = 0.1
FALLBACK_BURST_S = 30.0      # a job without a profiler still gets 100 ms counters for this long


class TargetNotAllowed(PermissionError):
    """A capture address the agent neither discovered nor was configured with."""


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
    serving_interval_s: float = 5.0       # serving engines' /metrics (0: never)
    network_interval_s: float = 5.0       # the network ports nearest the GPUs (0: never)


def local_start(cmd) -> float | None:
    """A coordinated capture's start on this host's clock: the analyzer's
    `start_at` less how far the analyzer's clock is ahead of ours, read when
    the command arrives (its network delay, milliseconds, is the error);
    at most MAX_LEAD_S ahead, whatever the clocks say."""
    if not cmd.HasField("start_at"):
        return None
    now = time.time()
    start = cmd.start_at - (cmd.sent_at - now) if cmd.sent_at else cmd.start_at
    return min(max(start, now), now + MAX_LEAD_S)


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
        self.stopping = self._stop        # set once stop() begins: what waits on the analyzer gives up
        self._ring: collections.deque[GpuSample] = collections.deque(maxlen=1)
        self._ring_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._scheduler: BackgroundScheduler | None = None
        self.ticks = self.samples = self.overruns = 0
        self.latest: dict[int, dict[str, float]] = {}
        self.latest_at: dict[int, float] = {}      # each GPU's newest sample time
        self.errors: dict[str, int] = {}
        self.last_error = ""
        self.health: collections.deque[HealthRecord] = collections.deque(maxlen=256)
        self.captures: CaptureRunner | None = None
        self.discovery = None                       # collectors.jobs.JobDiscovery
        self.serving = None                         # collectors.serving_sampler.ServingSampler
        self.network = None                         # collectors.network.NetworkSampler
        self._network_said = ""
        self.attribution = None                     # collectors.attribution.Attributor (its status, its kubelet)
        self.capture_reporter: Callable[[CaptureRecord, bytes], None] | None = None
        self.report_retry = None                    # daemon.report_retry.ReportRetry, with a capture_reporter
        self._burst_until = 0.0                          # sample at BURST_INTERVAL_S until then

    def devices(self) -> list[DeviceInfo]:
        return self.collector.devices()

    def start(self, uplink_factory: Callable[[str, Callable[[], list[DeviceInfo]]], Uplink] | None = None) -> None:
        """uplink_factory here overrides the constructor's (`gpuscope up` learns
        its own port only after its server has bound)."""
        self._uplink_factory = uplink_factory or self._uplink_factory
        self.collector.start()                      # fail fast: only here may we refuse to run
        if self.attribution is not None:
            self.attribution.start()                # its kubelet client: a thread that never fails start-up
        n = max(1, len(self.collector.devices()))
        per_tick = n * max(1, round(1.0 / self.config.interval_s))  # replay may emit several rows per tick
        self._ring = collections.deque(maxlen=min(MAX_RING_SAMPLES, int(self.config.ring_seconds * per_tick)))
        if self._uplink_factory is not None:
            self.uplink = self._uplink_factory(self.boot_id, self.devices)
            self.uplink.start()
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(self._slow_tick, "interval", seconds=self.config.slow_interval_s,
                                max_instances=1, coalesce=True, id="slow-scrape")
        if self.serving is not None and self.config.serving_interval_s > 0:
            self._scheduler.add_job(self._serving_tick, "interval", seconds=self.config.serving_interval_s,
                                    max_instances=1, coalesce=True, id="serving-scrape")
        if self.network is not None and self.config.network_interval_s > 0:
            self._scheduler.add_job(self._network_tick, "interval", seconds=self.config.network_interval_s,
                                    max_instances=1, coalesce=True, id="network-scrape")
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
            next_tick += BURST_INTERVAL_S if self._clock() < self._burst_until else interval
            delay = next_tick - self._clock()
            if delay < 0:            # the tick overran: skip the missed ones, keep the cadence
                self.overruns += 1
                next_tick = self._clock()
                delay = 0
            if self._stop.wait(delay):
                return

    def _slow_tick(self) -> None:
        self._scheduled("slow scrape", self.collector.scrape_slow)

    def _serving_tick(self) -> None:
        self._scheduled("serving scrape", self.serving.scrape)

    def _network_tick(self) -> None:
        self._scheduled("network scrape", lambda: Scrape(samples=self.network.scrape()))
        said = self.network.describe()
        if said != self._network_said:          # which port each GPU's traffic takes, said when it changes
            self._network_said = said
            log.info("network ports", host=self.config.host, ports=said)

    def _scheduled(self, what: str, scrape: Callable[[], Scrape]) -> None:
        """A scheduled scrape: whatever it raises is counted and logged, and
        the scheduler calls it again next time."""
        try:
            self._handle(scrape())
        except Exception as exc:  # top of a loop that must survive
            self._count_error(f"{what}: {type(exc).__name__}: {exc}")
            log.exception(f"{what} failed", host=self.config.host)

    def _handle(self, scrape: Scrape) -> None:
        if scrape.samples:
            with self._ring_lock:
                self._ring.extend(scrape.samples)
                for smp in scrape.samples:         # each GPU's newest value of each metric (daemon/exporter.py)
                    self.latest.setdefault(smp.gpu, {}).update(smp.values)
                    self.latest_at[smp.gpu] = max(self.latest_at.get(smp.gpu, 0.0), smp.t)
            self.samples += len(scrape.samples)
        for key, n in scrape.errors.items():
            self._count_error(key, n)
        if scrape.samples and not scrape.errors:
            self.last_error = ""        # the source answers whole again: its old failure is history (counted)
        for h in scrape.health:
            self.health.append(h)
            (log.info if h.kind is HealthKind.RECOVERED else log.warning)(
                "gpu health event", host=self.config.host, gpu=h.gpu, kind=h.kind.value, detail=h.detail)
        if self.uplink is not None and (scrape.samples or scrape.health):
            self.uplink.submit(scrape.samples, scrape.health)

    def _count_error(self, key: str, n: int = 1) -> None:
        self.last_error = key
        if key in self.errors or len(self.errors) < MAX_ERROR_KEYS:
            self.errors[key] = self.errors.get(key, 0) + n
        else:
            self.errors["other"] = self.errors.get("other", 0) + n

    def recent(self, seconds: float = 0.0, gpu: int | None = None) -> list[GpuSample]:
        """The ring's samples (of its newest `seconds`, 0: all), oldest first.
        Walks back from the newest: every /metrics scrape asks for 5 s of a
        ring that holds ten minutes."""
        with self._ring_lock:
            if seconds > 0 and self._ring:
                cutoff = self._ring[-1].t - seconds
                ring = list(itertools.takewhile(lambda s: s.t >= cutoff, reversed(self._ring)))
                ring.reverse()
            else:
                ring = list(self._ring)
        if gpu is not None:
            ring = [s for s in ring if s.gpu == gpu]
        return ring

    def _latest_processes(self) -> list[tuple[int, ProcessRecord]]:
        """(GPU, process) of the latest sample of each GPU that listed
        processes. Derived from the ring when asked (captures and job lists
        are rare), so the sampling hot path does no bookkeeping for it."""
        with self._ring_lock:
            ring = list(self._ring)
        seen: set[int] = set()
        out = []
        for s in reversed(ring):
            if s.gpu in seen or not ("procs_count" in s.values or s.processes):
                continue
            seen.add(s.gpu)
            out.extend((s.gpu, p) for p in s.processes)
        return out

    def gpu_pids(self) -> dict[int, list[int]]:
        """pid -> the GPUs it runs on, as the latest samples say."""
        out: dict[int, list[int]] = {}
        for gpu, p in self._latest_processes():
            out.setdefault(p.pid, []).append(gpu)
        return out

    def owners(self) -> dict[int, Attribution]:
        """pid -> whose it is, as the latest samples say (pods are per GPU:
        a process on several has the first one's)."""
        out: dict[int, Attribution] = {}
        for _, p in self._latest_processes():
            if p.attribution is not None:
                out.setdefault(p.pid, p.attribution)
        return out

    def jobs(self) -> list:
        """What discovery finds. A serving engine whose GPU processes the agent
        cannot see (another PID namespace, a container, a CPU build) and that
        names no GPUs (--serving URL=DIR@0,1) is taken to serve on all of them:
        listed so, its numbers go to each, its captures concern each. GPUs
        named that the host does not have are left out."""
        if self.discovery is None:
            return []
        jobs = self.discovery.discover(self.gpu_pids())
        if any(j.kind == "torch-http" for j in jobs):
            every = [d.gpu for d in self.devices()]
            for j in jobs:
                if j.kind == "torch-http":
                    # a GPU this host lacks gets nothing: its samples would make the analyzer refuse
                    # the whole batch, the real GPUs' samples with it
                    j.gpus = [g for g in j.gpus if g in every] if j.gpus else list(every)
        return jobs

    def capture(self, duration_ms: int, address: str = "", pid: int | None = None,
                trigger: str = "on-call", gpu: int | None = None,
                budget_s: float | None = None, start_at: float | None = None) -> tuple[CaptureRecord, bytes]:
        """Deep capture of one job now: by profiler address, by pid, or (for
        the analyzer's commands) the job on a GPU. Only targets the agent
        knows are captured: discovered jobs and configured addresses.
        Raises LookupError when no capturable job is found, TargetNotAllowed
        for an address the agent does not know or a pid on none of its GPUs,
        ValueError for a bad duration."""
        if self.captures is None:
            raise LookupError("captures are off on this agent (no --capture-dir)")
        job = self._find_job(address, pid, gpu)
        if job is None and address:
            raise TargetNotAllowed(
                f"{address} is not a target this agent knows: it captures only the jobs it discovers on its GPUs "
                f"(`gpuscope jobs`) and the addresses it is configured with; to allow this one, start the agent "
                f"with --profiler {address} (a JAX profiler) or --serving {address}=TRACE_DIR (a serving engine)")
        if job is None:
            what = f"pid {pid}" if pid is not None else f"GPU {gpu}"
            raise LookupError(f"{what}: no XLA profiler service or serving endpoint found (start the job with "
                              f"jax.profiler.start_server(PORT), set GPUSCOPE_PROFILER_PORT in its environment, "
                              f"or give the agent --serving URL=TRACE_DIR)")
        client = None
        if job.kind == "torch-http" and not job.trace_dir:
            raise LookupError(f"{job.address} ({job.found_by}) does not say where it writes its traces: start it "
                              f"with --profiler-config '{{\"profiler\":\"torch\",\"torch_profiler_dir\":DIR}}' "
                              f"(or VLLM_TORCH_PROFILER_DIR=DIR), or give the agent --serving {job.address}=DIR")
        if job.kind == "torch-http":
            from gpuscope.collectors.serving_profiler import TorchProfilerHttp
            # the caller's deadline bounds our waits: it hears "slow", with the capture id, before it gives up
            client = TorchProfilerHttp(job.address, job.trace_dir, budget_s=budget_s)
        rec, data = self.captures.capture(
            job.address, duration_ms, pid=job.pid, gpus=job.gpus,
            job=redact_command(f"pid:{job.pid} {job.command}".strip()) if job.pid else "", trigger=trigger,
            kind=job.kind, client=client, on_late=self._report if self.capture_reporter is not None else None,
            start_at=start_at)
        if self.capture_reporter is not None:
            # The caller gets the trace now; the analyzer's summary and linking follow.
            threading.Thread(target=self._report, args=(rec, data), name="capture-report", daemon=True).start()
        return rec, data

    def _find_job(self, address: str, pid: int | None, gpu: int | None):
        """A discovered job (by pid, address or GPU), or for an address one
        the agent was configured with; None when the agent knows none."""
        if self.discovery is None:
            return None
        pids = self.gpu_pids()
        if pid is not None:
            if pid not in pids:
                # any other process on the host is none of this agent's business
                listed = ', '.join(map(str, sorted(pids))) or 'none'
                raise TargetNotAllowed(
                    f"pid {pid} is not a process on this host's GPUs (its source, {self.config.source}, lists "
                    f"{listed}): the agent captures only the jobs on its GPUs (`gpuscope jobs`) and the "
                    f"addresses it is configured with (--profiler, --serving)")
            return self.discovery.find(pid, pids[pid])
        jobs = self.jobs()
        if address:
            found = next((j for j in jobs if j.address == address), None)
            return found or self.discovery.configured(address)
        return next((j for j in jobs if gpu in j.gpus), None)

    def counter_burst(self, seconds: float, gpu: int, trigger: str) -> CaptureRecord:
        """Sample at 100 ms for `seconds`, then report the burst as a capture
        (its data are the samples themselves, already streaming)."""
        rec = CaptureRecord(id=uuid.uuid4().hex[:12], host=self.config.host, target="counters", gpus=[gpu],
                            start=time.time(), duration_ms=int(seconds * 1e3), trigger=trigger, kind="counter-burst")
        self._burst_until = self._clock() + seconds
        self._stop.wait(seconds)
        if self.captures is not None:
            self.captures.record(rec, "ok")
        else:
            rec.status, rec.end = "ok", time.time()
        if self.capture_reporter is not None:
            self._report(rec, b"")
        return rec

    def run_command(self, cmd) -> None:
        """A capture the analyzer asked for: the job's profiler when it has
        one, else a counter burst; always reported back."""
        try:
            seconds = min(max((cmd.duration_ms or 30_000) / 1e3, 1.0), 300.0)
            if cmd.kind == "capture":
                try:
                    self.capture(cmd.duration_ms or 2000, pid=cmd.pid if cmd.HasField("pid") else None,
                                 trigger=cmd.id, gpu=cmd.gpu, start_at=local_start(cmd))
                    return
                except (LookupError, TargetNotAllowed) as exc:      # e.g. the job left the GPU meanwhile
                    log.info("no profiler for the job: counter burst instead", gpu=cmd.gpu, reason=str(exc))
                    seconds = FALLBACK_BURST_S
            self.counter_burst(seconds, cmd.gpu, cmd.id)
        except Exception as exc:  # a command must never take the agent down
            log.exception("command failed", command=cmd.id)
            self._count_error(f"command: {type(exc).__name__}: {exc}")

    def _report(self, rec: CaptureRecord, data: bytes) -> None:
        error = rec.error
        try:
            self.capture_reporter(rec, data)
        except Exception as exc:  # the analyzer being away must not lose the capture
            rec.error = (rec.error + "; " if rec.error else "") + f"not reported to the analyzer: {exc}"
            log.warning("capture not reported; sent again later" if self.report_retry is not None
                        else "capture not reported", id=rec.id, error=str(exc))
            if self.report_retry is not None:
                self.report_retry.add(rec, data, error)

    def status(self) -> dict:
        up = self.uplink.stats() if self.uplink else {}
        return dict(host=self.config.host, boot_id=self.boot_id, source=self.config.source,
                    interval_s=self.config.interval_s, ticks=self.ticks, samples=self.samples,
                    tick_overruns=self.overruns, errors=dict(self.errors), last_error=self.last_error,
                    devices=self.devices(), uplink=up,
                    attribution=self.attribution.status() if self.attribution is not None else {})

    def stop(self) -> None:
        """Idempotent: a second stop does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        if self.uplink is not None:
            self.uplink.stop()
        if self.captures is not None:
            from gpuscope.collectors.serving_profiler import PENDING_STOPS
            PENDING_STOPS.shutdown()      # no engine keeps profiling because this agent went away
        if self.serving is not None:
            self.serving.close()
        if self.attribution is not None:
            self.attribution.close()
        self.collector.close()
        log.info("agent stopped", host=self.config.host, ticks=self.ticks)
