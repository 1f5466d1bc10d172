"""The analyzer: ingest -> store -> live windows -> findings, and the numbers
the query service reports. Transport-free: the gRPC servicer calls this."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass

import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from gpuscope.collectors.trace_files import parse_trace
from gpuscope.collectors.xspace_reader import TraceError
from gpuscope.v1 import analyzer_pb2 as apb, samples_pb2 as pb

from .classify import Classification
from .commands import CommandHub
from .detector import Anomaly, Detector, DetectorConfig
from .events import EventBus
from .findings import FindingsTracker
from .ingest import DecodedBatch, decode
from .live import LiveWindows
from .store import Store, StoreConfig, finding_row
from .trace_analysis import summarize
from .trigger import Decision, TriggerConfig, TriggerPolicy
from .windows import DEFAULT_WINDOW_S, check_window
from .writer import Writer

log = structlog.get_logger("gpuscope.analyzer")


@dataclass(frozen=True)
class AnalyzerConfig:
    db_path: str
    window_s: float = DEFAULT_WINDOW_S
    memory_limit: str = "1GB"
    threads: int = 2
    detector: DetectorConfig = DetectorConfig()
    trigger: TriggerConfig = TriggerConfig()


@dataclass
class GpuState:
    host: str
    gpu: int
    verdict: str = ""
    confidence: float = 0.0
    flags: tuple[str, ...] = ()
    last_sample: float = 0.0           # sample time (the agent's clock)
    last_arrival: float = 0.0          # the analyzer's clock


class Analyzer:
    def __init__(self, config: AnalyzerConfig):
        self.config = config
        self.window_s = check_window(config.window_s)
        self.store = Store(StoreConfig(config.db_path, config.memory_limit, config.threads))
        self.live = LiveWindows(self.window_s)
        self.findings = FindingsTracker()
        self.findings.load(self.store.open_findings())
        self.writer = Writer(self.store, self._analyse)
        self.gpus: dict[tuple[str, int], GpuState] = {}
        self._names: dict[tuple[str, int], str] = {}
        self._lost: set[tuple[str, int]] = set()
        for d in self.store.devices():
            self._names[(d["host"], d["gpu"])] = d["name"]
            if d["lost"]:
                self._lost.add((d["host"], d["gpu"]))
        self.detector = Detector(config.detector)
        self.policy = TriggerPolicy(config.trigger)
        self.events = EventBus()
        self.commands = CommandHub()
        self.rejected = 0
        self._last_reject_log = float("-inf")
        self._rejects_unlogged = 0
        self.anomalies_total = 0
        self.decisions_total: dict[str, int] = {}
        self.started = time.time()
        self._lock = threading.Lock()
        self._scheduler = BackgroundScheduler(daemon=True)

    def start(self) -> None:
        self.writer.start()
        self._scheduler.add_job(self.sweep, "interval", seconds=self.window_s, max_instances=1,
                                coalesce=True, id="sweep")
        self._scheduler.start()
        log.info("analyzer started", db=self.config.db_path, window_s=self.window_s)

    def submit(self, batch: pb.SampleBatch) -> Future:
        """Validate and queue; raises BatchError (nothing written) for invalid input."""
        try:
            decoded = decode(batch)
        except ValueError as exc:
            self.count_rejected(batch, str(exc))
            raise
        return self.writer.submit(decoded)

    def count_rejected(self, batch: pb.SampleBatch | None, error: str) -> None:
        """Counts every refused batch; logs at most one line a second, cut
        short, so a flood of bad batches cannot flood the log."""
        now = time.monotonic()
        with self._lock:
            self.rejected += 1
            quiet = now - self._last_reject_log < 1.0
            if not quiet:
                self._last_reject_log = now
                since, self._rejects_unlogged = self._rejects_unlogged, 0
            else:
                self._rejects_unlogged += 1
        if not quiet:
            log.warning("batch refused", host=(batch.host[:80] if batch is not None else None),
                        seq=(batch.seq if batch is not None else None), error=error[:300],
                        refused_since_last_line=since)

    # -- writer thread ------------------------------------------------------------------
    def _analyse(self, batches: list[DecodedBatch]) -> None:
        results: list[tuple[str, Classification, str]] = []
        for b in batches:
            for d in b.devices:
                self._names[(b.host, d.gpu)] = d.name
                if d.lost:
                    self._lost.add((b.host, d.gpu))
            if b.count:
                for g in set(b.gpu.tolist()):
                    st = self._state(b.host, g)
                    st.last_sample = max(st.last_sample, float(b.t[b.gpu == g].max()))
                    st.last_arrival = time.time()
            results.extend(self.live.add(b))
            health = [self.detector.health(host, gpu, kind.replace("_uncorrected", ""), detail, t,
                                           (self.findings.open.get((host, gpu)) or {}).get("job", ""))
                      for host, gpu, t, kind, detail, _code in b.health if kind in ("xid", "ecc_uncorrected", "gpu_lost")]
            if health:
                self._act_on(health)
        self._record(results)

    def _state(self, host: str, gpu: int) -> GpuState:
        st = self.gpus.get((host, gpu))
        if st is None:
            st = self.gpus[(host, gpu)] = GpuState(host, gpu)
        return st

    def _record(self, results: list[tuple[str, Classification, str]]) -> None:
        if not results:
            return
        windows, changed, anomalies = [], {}, []
        for host, c, job in results:
            st = self._state(host, c.gpu)
            st.verdict, st.confidence, st.flags = c.verdict, c.confidence, tuple(c.flags)
            windows.append((host, c.gpu, c.start, c.end, c.verdict, c.confidence, json.dumps(c.flags), c.summary))
            for f in self.findings.observe(host, c, job):
                changed[f["id"]] = f
                if f["end"] is None and f["windows"] == 1:
                    log.info("finding opened", host=host, gpu=c.gpu, verdict=c.verdict,
                             confidence=c.confidence, summary=c.summary)
                if f["end"] is not None or f["windows"] == 1:
                    self.events.publish(dict(kind="finding", t=c.end, host=host, gpu=c.gpu, verdict=f["verdict"],
                                             record=f))
            open_f = self.findings.open.get((host, c.gpu))
            a = self.detector.observe(host, c, job, open_f["id"] if open_f else None)
            if a is not None:
                anomalies.append(a)
        store = self.store
        store.begin()
        try:
            store.insert_windows(windows)
            store.upsert_findings([finding_row(f) for f in changed.values()])
            store.commit()
        except Exception:
            store.rollback()
            raise
        if anomalies:
            self._act_on(anomalies)

    # -- anomalies -> decisions -> commands (writer thread) ---------------------------------
    def _act_on(self, anomalies: list[Anomaly]) -> None:
        """Decide on each anomaly, send the captures, then store everything in
        one write: a storm of thousands of anomalies must not stall ingest."""
        hosts_known = len({h for h, _ in self.gpus}) or 1
        rows, decisions = [], []
        for a in anomalies:
            row = asdict(a)
            rows.append(row)
            self.events.publish(dict(kind="anomaly", t=a.t, host=a.host, gpu=a.gpu,
                                     verdict=a.details.get("verdict"), record=row))
            d = self.policy.decide(a, hosts_known, agent_connected=self.commands.connected(a.host))
            if d.status == "pending":
                cmd = apb.Command(id=d.id, gpu=d.gpu, kind=d.action, duration_ms=d.duration_ms, reason=d.reason)
                if d.pid is not None:
                    cmd.pid = d.pid
                if not self.commands.send(a.host, cmd):
                    d = self.policy.finished(d.id, "", False, "the command could not be delivered") or d
            decisions.append(d)
        self.anomalies_total += len(anomalies)
        if len(anomalies) <= 10:       # count a storm, do not log each of it
            for a in anomalies:
                log.info("anomaly", host=a.host, gpu=a.gpu, kinds=a.kinds, reason=a.reason)
        else:
            log.warning("anomaly storm", anomalies=len(anomalies), hosts=len({a.host for a in anomalies}))
        self.store.insert_anomalies(rows)
        self._decided(decisions)

    def _decided(self, decisions: list[Decision]) -> None:
        rows = []
        for d in decisions:
            row = {k: v for k, v in asdict(d).items() if k not in ("duration_ms", "pid")}
            rows.append(row)
            self.decisions_total[d.action] = self.decisions_total.get(d.action, 0) + 1
            self.events.publish(dict(kind="decision", t=d.updated, host=d.host, gpu=d.gpu, verdict=None, record=row))
        if len(decisions) <= 10:
            for d in decisions:
                log.info("capture decision", host=d.host, gpu=d.gpu, action=d.action, status=d.status, reason=d.reason)
        self.store.upsert_decisions(rows)

    def report_capture(self, record, xspace: bytes) -> dict:
        """A capture an agent ran: summarize its trace, store it, link it to
        the open finding of its GPU. Returns the stored row."""
        summary: dict | None = None
        error = record.error
        if xspace:
            try:
                summary = summarize(parse_trace(xspace, record.path or record.id))
            except TraceError as exc:
                error = (error + "; " if error else "") + str(exc)
        verdict = summary.get("verdict") if summary else None
        confidence = float(summary.get("confidence") or 0.0) if summary else 0.0
        row = dict(id=record.id, host=record.host, target=record.target,
                   pid=record.pid if record.HasField("pid") else None, gpus=json.dumps(list(record.gpus)),
                   job=record.job, start=record.start, end=record.end, duration_ms=record.duration_ms,
                   path=record.path, size_bytes=record.size_bytes, status=record.status, error=error,
                   trigger=record.trigger, verdict=verdict, confidence=confidence, kind=record.kind or "jax",
                   summary=json.dumps(summary, default=str) if summary else None, finding_id=None)

        def store(st: Store) -> dict:
            f = self.findings.attach_capture(record.host, list(record.gpus), record.id, verdict, confidence,
                                             summary.get("summary", "") if summary else "")
            if f is not None:
                row["finding_id"] = f["id"]
                st.upsert_findings([finding_row(f)])
            st.upsert_capture(row)
            d = self.policy.finished(record.trigger, record.id, record.status.startswith("ok"),
                                     f"{record.kind or 'capture'} {record.status}"
                                     + (f": {record.error}" if record.error else ""))
            if d is not None:
                self._decided([d])
            gpu = record.gpus[0] if record.gpus else 0
            self.events.publish(dict(kind="capture", t=record.end or time.time(), host=record.host, gpu=gpu,
                                     verdict=verdict, record={k: v for k, v in row.items() if k != "summary"}))
            return row
        return self.writer.call(store).result(timeout=30)

    def sweep(self) -> None:
        """Judge windows of GPUs that went quiet, and close their findings."""
        def run(_store: Store) -> None:
            now = time.time()
            self._record(self.live.sweep(now))
            stale = [k for k, f in self.findings.open.items()
                     if self.gpus.get(k) is None or self.gpus[k].last_arrival < now - 3 * self.window_s]
            if stale:
                closed = [self.findings.close(k, self.gpus[k].last_sample if k in self.gpus else now)
                          for k in stale]
                self.store.upsert_findings([finding_row(f) for f in closed])
            expired = self.policy.expire()
            if expired:
                self._decided(expired)
        self.writer.call(run)

    # -- queries ----------------------------------------------------------------------------
    def status(self) -> dict:
        gpus = []
        for key, st in sorted(self.gpus.items()):
            f = self.findings.open.get(key)
            gpus.append(dict(host=st.host, gpu=st.gpu, name=self._names.get(key, ""), verdict=st.verdict,
                             confidence=st.confidence, flags=list(st.flags), last_sample=st.last_sample,
                             open_finding=f["id"] if f else None, lost=key in self._lost))
        w = self.writer
        return dict(started=self.started, batches_committed=w.batches, batches_duplicate=w.duplicates,
                    batches_rejected=self.rejected, samples_committed=w.samples,
                    hosts=len({h for h, _ in self.gpus}), gpus=gpus, findings_open=len(self.findings.open),
                    db_path=self.config.db_path, window_seconds=self.window_s, anomalies=self.anomalies_total,
                    decisions=dict(self.decisions_total), captures_in_flight=self.policy.in_flight,
                    agents_connected=len(self.commands.hosts))

    def drain(self, timeout_s: float = 6.0) -> None:
        """Stops taking batches and commits those queued, bounded in time."""
        try:
            self._scheduler.shutdown(wait=False)
        except Exception:  # not started
            pass
        self.writer.stop(timeout_s)

    def close(self) -> None:
        self.drain()
        self.store.close()
