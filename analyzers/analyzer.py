"""The analyzer: ingest -> store -> live windows -> findings, and the numbers
the query service reports. Transport-free: the gRPC servicer calls this.

Staleness: a GPU is `stale` when no sample of it has arrived for
STALE_AFTER_WINDOWS (3) classification windows on the analyzer's clock (15 s
with the default 5 s windows), judged at when the writer last had nothing
waiting (Writer.behind_since: a backlog is not silence): the live view and status say so with the age,
its last partial window is judged, and its open finding closes at the end of
the last window it absorbed, saying "agent went silent". A host is stale when
all its GPUs are. After a restart the analyzer knows every GPU the store
knows (name, last verdict, last seen = its host's last commit); findings left
open are resumed, and those of GPUs not heard from within 3 windows of the
start close at their last window's end.

Findings are written when they open, close or change verdict; a finding
that only absorbs another window (its count and running means) is written
at most `snapshot_s` (--snapshot-every, default SNAPSHOT_EVERY_S) later, a share of such findings with each commit
group (analyzers/trickle.py), and at shutdown: a fleet extends thousands of
findings at every window boundary. Each GPU's state row follows the same rule. Queries
read open findings as they are in memory, never the lagging row, except a
list the engine's gRPC process answers from its mirror (rows as written,
`absorbed_until` saying which window they hold); a kill -9
costs at most `snapshot_s` of an open finding's running means (its
windows are stored with every commit).
"""
from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

import duckdb
import structlog
from apscheduler.schedulers.background import BackgroundScheduler

from gpuscope.collectors.trace_files import parse_trace
from gpuscope.collectors.xspace_reader import TraceError
from gpuscope.v1 import analyzer_pb2 as apb, samples_pb2 as pb

from .calibrations import parse_calibration
from .classify import Classification
from .commands import CommandHub
from .degraded import DegradedConfig, condition as degraded_condition, find_degraded
from .detector import Anomaly, Detector, DetectorConfig, family
from .events import EventBus
from .findings import FindingsTracker
from .rules.transitional import TRANSITIONAL
from .findings_mirror import MAX_CLOSED as MIRROR_CLOSED
from .fleet_findings import ConditionFindings
from .ids import new_id
from .ingest import DecodedBatch, clean_command, decode_counted
from .links import pcie_link
from .live import LiveWindows
from . import coordinated
from .job_list import list_jobs
from .program_check import ProgramCheck
from .program_list import list_programs
from .programs import ProgramsConfig
from .publish import PublishConfig, Publisher
from .rank_skew import COORDINATED, collectives, skew
from .report import build_range_report, build_report, full_id
from .retention import PassResult, Retention, RetentionConfig
from .status import GpuRow, silence_time, summarize as summarize_status
from .stragglers import StragglerConfig, find_stragglers
from .store import FINDING_COLUMNS, Store, StoreConfig, finding_group, finding_row, merge_live
from .trace_analysis import summarize
from .trace_program import trace_program
from .trigger import Decision, TriggerConfig, TriggerPolicy
from .throttle import Throttle
from .trickle import Trickle
from .windows import DEFAULT_WINDOW_S, check_window
from .writer import StoreUnavailable, Writer

log = structlog.get_logger("gpuscope.analyzer")

STALE_AFTER_WINDOWS = 3      # silent this many windows (analyzer's clock): stale, finding closed
SNAPSHOT_EVERY_S = 30.0      # the gpu_state table, and open findings' running means, are this fresh
# the longest --snapshot-every: a restart's scan reaches SNAPSHOT_MARGIN_S past the newest row, which covers
# rows a run with any allowed period left behind
MAX_SNAPSHOT_EVERY_S = 300.0
STORM_LOG_EVERY_S = 10.0     # at most one "anomaly storm" line this often; the rest are counted into it
SNAPSHOT_MARGIN_S = 600.0    # a restart scans windows and samples from this long before it (clock skew)


@dataclass(frozen=True)
class AnalyzerConfig:
    db_path: str
    window_s: float = DEFAULT_WINDOW_S
    memory_limit: str = "1GB"
    threads: int = 2
    detector: DetectorConfig = DetectorConfig()
    trigger: TriggerConfig = TriggerConfig()
    retention_s: float = 14 * 86400       # raw samples kept this long (CLI: --retention 14d)
    rollup: bool = True                   # keep per-minute means of what retention deletes
    history_s: float = 365 * 86400        # rollups, closed findings, anomalies, decisions, captures
    publish: PublishConfig | None = None  # the fleet tier (analyzers/publish.py); None: off
    # the fleet checks (fleet_findings.py): how often; 0: never. A degraded check compares calibrations
    # and the clocks held at the power limit over the last `degraded_span_s` of samples.
    fleet_check_s: float = 300.0
    # how stale the stored copies of each GPU's state and of open findings' running numbers may get (opening,
    # closing and verdict changes are written at once); longer costs less at large fleets: the upserts are a
    # third of the analysis process's DuckDB time at 2,000 agents (docs/benchmarks.md)
    snapshot_s: float = SNAPSHOT_EVERY_S
    degraded_span_s: float = 3600.0
    degraded: DegradedConfig = DegradedConfig()
    programs: ProgramsConfig = ProgramsConfig()     # runs against their programs' baselines (programs.py)
    stragglers: StragglerConfig = StragglerConfig()  # the ranks of a job against each other (stragglers.py)


def _owner(f: dict | None) -> tuple[str, str]:
    """(namespace, pod) of an open finding's job, for the status row: the
    Prometheus verdict gauge carries them, as dcgm-exporter's series do."""
    a = (f or {}).get("attribution") or {}
    return a.get("namespace") or "", a.get("pod") or ""


def _stored(f: dict) -> tuple:
    """What a query filters an open finding by, as last written: a change is
    written at once, not with the next snapshot (a job that takes over a GPU
    is asked for by its pod or Slurm job)."""
    return f["verdict"], f["decided_by"], f["job"], f.get("attribution")


@dataclass
class GpuState:
    host: str
    gpu: int
    verdict: str = ""
    confidence: float = 0.0
    flags: tuple[str, ...] = ()
    last_sample: float = 0.0           # sample time (the agent's clock)
    last_arrival: float = 0.0          # the analyzer's clock; 0: never
    last_window_end: float | None = None   # of the newest judged window (sample clock)


class Analyzer:
    def __init__(self, config: AnalyzerConfig, clock: Callable[[], float] = time.time):
        self.config = config
        if not 1.0 <= config.snapshot_s <= MAX_SNAPSHOT_EVERY_S:
            raise ValueError(f"snapshot period {config.snapshot_s:g} s: expected 1 to {MAX_SNAPSHOT_EVERY_S:g} s")
        self._clock = clock
        self.window_s = check_window(config.window_s)
        self.stale_after_s = STALE_AFTER_WINDOWS * self.window_s
        self.retention = Retention(RetentionConfig(retention_s=config.retention_s, rollup=config.rollup,
                                                   history_s=config.history_s), clock=clock)
        self.store = Store(StoreConfig(config.db_path, config.memory_limit, config.threads))
        self.store.ensure_rollup_columns()
        self.publisher = Publisher(config.publish, self.store.fleet_rows, clock=clock) if config.publish else None
        self.live = LiveWindows(self.window_s)
        self.live.hbm_measured = self.store.measured_hbm()
        self.gpus: dict[tuple[str, int], GpuState] = {}
        self._host_gpus: dict[str, list[int]] = {}     # host -> its GPUs in self.gpus (note_held)
        self._names: dict[tuple[str, int], str] = {}
        self._sources: dict[tuple[str, int], str] = {}     # where each GPU's samples come from
        self._uuids: dict[tuple[str, int], str] = {}
        self._lost: set[tuple[str, int]] = set()
        # GPUs whose agent said their source stopped (DCGM's host engine, dcgm-exporter down), and what it
        # said: a finding closed for lack of samples then says why, not "agent went silent"
        self._source_down: dict[tuple[str, int], str] = {}
        self._dirty: Trickle[tuple[str, int]] = Trickle(config.snapshot_s)   # GPUs whose state row is owed
        self._status_dirty: set[tuple[str, int]] = set()   # ... since the last _publish_status
        # (GPU rows, totals, findings rows written since, a new mirror's start): StatusMirror, FindingsMirror
        self.on_status: Callable[[list[GpuRow], dict, list[tuple], tuple | None], None] | None = None
        self._findings_written: list[tuple] = []    # committed since the last publication (only with on_status)
        self._hosts_heard_at, self._hosts_heard_n = -math.inf, 0
        last_windows = self._restore_gpus()
        self._host_arrival: dict[str, float] = {}      # host -> when a batch of it last arrived
        for (host, _), st in self.gpus.items():
            self._host_arrival[host] = max(self._host_arrival.get(host, 0.0), st.last_arrival)
        self.findings = FindingsTracker(self.window_s, max_gap_s=self.stale_after_s)
        stored = self.store.open_findings()
        written = {f["id"]: f["windows"] for f in stored}
        self.findings.load(stored, last_windows, self._unwritten(stored))
        # open findings extended since they were written (recounted ones too: their rows lag)
        self._findings_dirty: Trickle[dict] = Trickle(config.snapshot_s)
        for f in self.findings.open.values():
            if f["windows"] != written.get(f["id"]):
                self._findings_dirty.add(f["id"], f, clock())
        # finding id -> its deferred writes not yet committed: until then the
        # stored row lags, and queries show the finding as it is (findings_payload)
        self._findings_unstored: dict[str, int] = {}
        # what the store holds of each open finding: a change of these is written at once
        self._findings_stored = {f["id"]: _stored(f) for f in self.findings.open.values()}
        self.conditions = {"degraded": ConditionFindings("degraded", self.store.open_findings("degraded"),
                                                         ended_words="no longer under its peers"),
                           "regression": ConditionFindings("regression", self.store.open_findings("regression"),
                                                           ended_words="the run ended or is back to its baseline"),
                           "straggler": ConditionFindings("straggler", self.store.open_findings("straggler"),
                                                          ended_words="its job's ranks no longer wait for it")}
        self.program_check = ProgramCheck(self.store, self.config.programs)
        self._job_traced: dict[str, float] = {}        # dist job -> when a straggler last had it traced
        self._samples_at_start, _ = self.store.sample_rows()
        self._status_dirty = set(self.gpus)           # a mirror of a new process learns every GPU
        self._newest_seen: dict[str, float] = {}       # host -> newest sample time received
        self._first_window: dict[str, float] = {}      # host -> start of the first window received
        self._analysed: dict[str, float] = {}          # host -> start of the window of its newest analysed sample
        self._judged_end: dict[str, float] = {}        # host -> end of the newest judged window
        self.writer = Writer(self.store, self._analyse, clock=clock)
        self.writer.after_flush = self._publish_status
        self.detector = Detector(config.detector)
        self.policy = TriggerPolicy(config.trigger)
        self.events = EventBus()
        self.commands = CommandHub()
        self.rejected = 0
        self._reject_log = Throttle(1.0)
        self._storm_log = Throttle(STORM_LOG_EVERY_S)
        self.anomalies_total = 0
        self.decisions_total: dict[str, int] = {}
        self.started = clock()
        self._lock = threading.Lock()
        self._scheduler = BackgroundScheduler(daemon=True)

    def _restore_gpus(self) -> dict[tuple[str, int], float]:
        """What the store knows, so status after a restart shows every GPU:
        name and lost from devices; verdict, newest window and sample from
        the gpu_state snapshot plus whatever was stored after it (a bounded
        scan; files without a snapshot are scanned whole, once); last seen
        from its host's last commit (analyzer's clock). Returns each GPU's
        newest window end."""
        snapshot = {(r["host"], int(r["gpu"])): r for r in self.store.gpu_states()}
        since = max((r["written"] for r in snapshot.values()), default=None)
        # a GPU's row is owed for up to snapshot_s: rows written before the newest one may lag it that long
        since = None if since is None else since - self.config.snapshot_s - SNAPSHOT_MARGIN_S
        windows = {(w["host"], int(w["gpu"])): w for w in self.store.latest_windows(since)}
        last_sample = self.store.last_samples(since)
        host_seen = self.store.hosts_last_seen()
        devices = {(d["host"], int(d["gpu"])): d for d in self.store.devices()}
        ends, now = {}, self._clock()
        for key in sorted(set(devices) | set(snapshot) | set(windows)):
            d = devices.get(key)
            if d is not None:
                self._names[key] = d["name"]
                self._sources[key] = d.get("source") or ""
                self._uuids[key] = d.get("uuid") or ""
                if d["lost"]:
                    self._lost.add(key)
            st = self._state(*key)
            snap, w = snapshot.get(key), windows.get(key)
            if snap is not None and snap["last_window_end"] is not None and (
                    w is None or snap["last_window_end"] >= w["end"]):
                w = dict(verdict=snap["verdict"], confidence=snap["confidence"], flags=snap["flags"],
                         end=snap["last_window_end"])
            if w is not None:
                st.verdict, st.confidence = w["verdict"] or "", float(w["confidence"] or 0.0)
                st.flags = tuple(json.loads(w["flags"]) if w["flags"] else ())
                st.last_window_end = ends[key] = w["end"]
            st.last_sample = max(last_sample.get(key, 0.0), (snap or {}).get("last_sample") or 0.0)
            st.last_arrival = (host_seen.get(key[0]) or (d or {}).get("last_seen")
                               or (snap or {}).get("last_arrival") or 0.0)
            if snap is None or (snap["verdict"], snap["last_window_end"], snap["last_sample"] or 0.0) != (
                    st.verdict, st.last_window_end, st.last_sample):
                # the row lags what the scan found (a kill -9 left it owed): a GPU that stays silent
                # would never be written again, and a later restart, scanning less, would believe the row
                self._dirty.add(key, key, now)
        return ends

    def _unwritten(self, findings: list[dict]) -> dict[str, list[tuple[str, float]]]:
        """The windows each open finding absorbed after its row was last
        written, (verdict, confidence) for FindingsTracker.load: a kill -9
        loses no window from an episode's count. Only the windows the episode
        absorbed count, as FindingsTracker.observe takes them: transitional
        ones are skipped, and one of another bottleneck family ended it
        (found in a trial: the windows after a replay's end dragged a 1.00
        finding to 0.43)."""
        extra, out = self.store.windows_after(findings), {}
        for f in findings:
            episode = family(f.get("counters_verdict") or f["verdict"])
            taken = out[f["id"]] = []
            for verdict, flags, confidence in extra.get(f["id"], ()):
                if TRANSITIONAL in json.loads(flags):
                    continue
                if family(verdict) != episode:
                    break
                taken.append((verdict, confidence))
        return out

    def _write_owed(self, now: float, everything: bool = False) -> None:
        """Writes the owed rows (see _owed), all or none."""
        findings, keys, rows, state = self._owed(now, everything)
        if not rows and not state:
            return

        def write(st: Store) -> None:
            st.upsert_findings(rows)
            st.upsert_gpu_state(state)
        self._store_later(write, rows, findings, keys, now)

    def _owed(self, now: float, everything: bool = False) -> tuple[list[dict], list[tuple[str, int]], list, list]:
        """The open findings' running numbers and the GPUs' state rows that
        are owed: what is due and this call's share of the rest, or
        everything (shutdown). The state rows are what a restart reads
        instead of scanning. Returns (findings, GPU keys) taken, to owe again
        if their write fails, and the finding and state rows to write."""
        findings = self._findings_dirty.take_all() if everything else self._findings_dirty.take(now)
        keys = self._dirty.take_all() if everything else self._dirty.take(now)
        state = []
        for key in keys:
            st = self.gpus.get(key)
            if st is not None:
                state.append((st.host, st.gpu, st.verdict, st.confidence, json.dumps(list(st.flags)),
                              st.last_window_end, st.last_sample or None, st.last_arrival or None, now))
        return findings, keys, self._persisted(findings), state

    def _store_later(self, write: Callable[[Store], None], finding_rows: list[tuple], findings: list[dict],
                     keys: list[tuple[str, int]], now: float) -> None:
        """Hands write(store) to the writer's commit thread (Writer.defer).
        Once it has committed, the finding rows it stored go to the status
        mirror (a mirror shows only what is stored); if it failed, the
        findings and GPU state rows it held are owed again, and written by a
        later group or the shutdown."""
        ids = [f["id"] for f in findings]
        for fid in ids:
            self._findings_unstored[fid] = self._findings_unstored.get(fid, 0) + 1

        def done(error: Exception | None) -> None:
            for fid in ids:
                left = self._findings_unstored.pop(fid, 1) - 1
                if left:
                    self._findings_unstored[fid] = left
            if error is None:
                if self.on_status is not None:
                    self._findings_written.extend(finding_rows)
            else:
                self._owe_again(findings, keys, now)
        self.writer.defer(write, done)

    def _owe_again(self, findings: list[dict], keys: list[tuple[str, int]], now: float) -> None:
        """Rows whose write failed (or whose transaction rolled back): owed
        again and due at once, a closed finding's too."""
        self._findings_dirty.put_back({f["id"]: f for f in findings}, now)
        self._dirty.put_back({k: k for k in keys}, now)

    def start(self) -> None:
        self.writer.start()
        self._scheduler.add_job(self.sweep, "interval", seconds=self.window_s, max_instances=1,
                                coalesce=True, id="sweep")
        first = datetime.now(timezone.utc) + timedelta(seconds=min(60.0, self.retention.config.interval_s))
        self._scheduler.add_job(self._retention_job, "interval", seconds=self.retention.config.interval_s,
                                max_instances=1, coalesce=True, id="retention", next_run_time=first)
        if self.config.fleet_check_s > 0:
            self._scheduler.add_job(self._fleet_checks_job, "interval", seconds=self.config.fleet_check_s,
                                    max_instances=1, coalesce=True, id="fleet-checks",
                                    next_run_time=datetime.now(timezone.utc)
                                    + timedelta(seconds=min(30.0, self.config.fleet_check_s)))
        if self.publisher is not None:
            # its own thread in the scheduler's pool: a pass waiting on slow storage holds nothing else up
            self._scheduler.add_job(self._publish_job, "interval", seconds=self.publisher.config.interval_s,
                                    max_instances=1, coalesce=True, id="publish",
                                    next_run_time=datetime.now(timezone.utc) + timedelta(seconds=10))
        self._scheduler.start()
        log.info("analyzer started", db=self.config.db_path, window_s=self.window_s,
                 retention_days=round(self.config.retention_s / 86400, 2), rollup=self.config.rollup)
        if self.publisher is not None:
            c = self.publisher.config
            log.info("publishing the fleet tier", target=self.publisher.storage.loc.url, cluster=c.cluster,
                     interval_s=c.interval_s, delay_s=c.delay_s, state_dir=c.state_dir)

    def submit(self, batch: pb.SampleBatch) -> Future:
        """Validate and queue; raises BatchError (nothing written) for invalid input."""
        return self.submit_decoded(self.check(batch))

    def check(self, batch: pb.SampleBatch) -> DecodedBatch:
        """Validates and decodes, on any thread; raises BatchError, counted
        and logged, for invalid input."""
        return decode_counted(batch, self.count_rejected)

    def submit_decoded(self, decoded: DecodedBatch) -> Future:
        self.note_received(decoded)
        return self.writer.submit(decoded)

    def note_received(self, b: DecodedBatch) -> None:
        """The newest sample time received from the host, for analysis_lag_seconds
        (submit() notes every batch it queues)."""
        if not b.count:
            return
        newest = float(b.t.max())
        with self._lock:
            if newest > self._newest_seen.get(b.host, -math.inf):
                self._newest_seen[b.host] = newest
            if b.host not in self._first_window:
                self._first_window[b.host] = math.floor(float(b.t.min()) / self.window_s) * self.window_s

    def count_rejected(self, batch: pb.SampleBatch | None, error: str) -> None:
        """Counts every refused batch; logs at most one line a second, cut
        short, so a flood of bad batches cannot flood the log."""
        with self._lock:
            self.rejected += 1
        said = self._reject_log.hit(refused=1)
        if said is not None:
            log.warning("batch refused", host=(batch.host[:80] if batch is not None else None),
                        seq=(batch.seq if batch is not None else None), error=error[:300],
                        refused_since_last_line=said["refused"] - 1)

    # -- writer thread ------------------------------------------------------------------
    def _analyse(self, batches: list[DecodedBatch]) -> None:
        now = self._clock()
        for b in batches:
            for d in b.devices:
                key = (b.host, d.gpu)
                if self._names.get(key) != d.name or self._sources.get(key) != d.source or \
                        (d.lost and key not in self._lost):
                    self._status_dirty.add(key)
                self._names[key] = d.name
                self._sources[key] = d.source
                self._uuids[key] = d.uuid
                if d.lost:
                    self._lost.add(key)
            newest_of = self.live.add(b, now)
            if newest_of:
                self._host_arrival[b.host] = now
            for g, newest in newest_of.items():
                st = self._state(b.host, g)
                st.last_sample = max(st.last_sample, newest)
                st.last_arrival = now
                self._touch((b.host, g), now)
            if b.count:
                ws = math.floor(float(b.t.max()) / self.window_s) * self.window_s
                with self._lock:
                    self._analysed[b.host] = max(self._analysed.get(b.host, ws), ws)
            for host, gpu, t, kind, detail, _code in b.health:
                if kind == "source_error":
                    self._source_down[(host, gpu)] = detail
                elif kind == "recovered":
                    self._source_down.pop((host, gpu), None)
            if self._source_down:               # samples again: the source is back (nothing to do, mostly)
                for g in newest_of:
                    self._source_down.pop((b.host, g), None)
            health = [self.detector.health(host, gpu, kind.replace("_uncorrected", ""), detail, t,
                                           (self.findings.open.get((host, gpu)) or {}).get("job", ""))
                      for host, gpu, t, kind, detail, _code in b.health if kind in ("xid", "ecc_uncorrected", "gpu_lost")]
            if health:
                self._act_on(health)
        self._record(self.live.close_pending())
        self._publish_status()

    def _state(self, host: str, gpu: int) -> GpuState:
        st = self.gpus.get((host, gpu))
        if st is None:
            st = self.gpus[(host, gpu)] = GpuState(host, gpu)
            self._host_gpus.setdefault(host, []).append(gpu)
        return st

    def note_held(self, host: str) -> None:
        """A batch of `host` is held back by its ingest rate (--host-rate):
        its agent is heard from, not silent, and its GPUs are not stale nor
        their findings closed while our own policy delays its samples (as
        a backlog of the writer's is not silence either)."""
        def run(_store: Store) -> None:
            now = self._clock()
            if host in self._host_arrival:
                self._host_arrival[host] = max(self._host_arrival[host], now)
            for g in self._host_gpus.get(host, ()):
                self.gpus[(host, g)].last_arrival = now
                self._status_dirty.add((host, g))
        self.writer.call(run)

    def _record(self, results: list[tuple[str, Classification, str, dict[str, str]]]) -> None:
        if not results:
            return
        now = self._clock()
        windows, changed, anomalies = [], {}, []       # changed: findings to write now
        turned: list[dict] = []       # findings opened or closed by these windows
        fresh: set[str] = set()       # findings opened by these windows: no row yet, inserted
        judged: dict[str, float] = {}
        for host, c, job, owner in results:
            st = self._state(host, c.gpu)
            st.verdict, st.confidence, st.flags = c.verdict, c.confidence, tuple(c.flags)
            st.last_window_end = max(st.last_window_end or c.end, c.end)
            self._touch((host, c.gpu), now)
            judged[host] = max(judged.get(host, c.end), c.end)
            windows.append((host, c.gpu, c.start, c.end, c.verdict, c.confidence,
                            json.dumps(c.flags) if c.flags else "[]", c.summary))
            for f in self.findings.observe(host, c, job, owner, self._sources.get((host, c.gpu), "")):
                if f["end"] is None and self._findings_stored.get(f["id"]) == _stored(f):
                    self._findings_dirty.add(f["id"], f, now)      # only extended: owed, written within snapshot_s
                    continue
                changed[f["id"]] = f
                if f["end"] is None and f["windows"] == 1:
                    fresh.add(f["id"])
                if f["end"] is not None or f["windows"] == 1:
                    turned.append(f)
                    self.events.publish(dict(kind="finding", t=c.end, host=host, gpu=c.gpu, verdict=f["verdict"],
                                             record=f))
            open_f = self.findings.open.get((host, c.gpu))
            a = self.detector.observe(host, c, job, open_f["id"] if open_f else None)
            if a is not None:
                anomalies.append(a)
        with self._lock:
            for host, end in judged.items():
                self._judged_end[host] = max(self._judged_end.get(host, end), end)
        self._log_findings(turned)
        stored = list(changed.values())
        rows = self._persisted(stored)
        new_rows = [r for f, r in zip(stored, rows) if f["id"] in fresh]
        old_rows = [r for f, r in zip(stored, rows) if f["id"] not in fresh] if new_rows else rows
        owed, keys, owed_rows, state = self._owed(now)

        def write(st: Store) -> None:
            # a write that fails owes its findings again, and those are upserted: a retried insert never
            # meets its own row
            st.insert_windows(windows)
            st.insert_findings(new_rows)
            st.upsert_findings(old_rows)
            st.upsert_findings(owed_rows)
            st.upsert_gpu_state(state)
        self._store_later(write, rows + owed_rows, [*stored, *owed], keys, now)
        if anomalies:
            self._act_on(anomalies)

    def _persist_findings(self, findings: list[dict]) -> None:
        """Writer thread: upserts the findings as they are now."""
        rows = self._persisted(findings)
        self._store_later(lambda st: st.upsert_findings(rows), rows, findings, [], self._clock())

    def _persisted(self, findings: list[dict]) -> list[tuple]:
        """The findings' rows, marked as stored as they are now: no longer
        owed, and an open one written again only when it changes."""
        for f in findings:
            self._findings_dirty.discard(f["id"])
            self.findings.current(f)
            if f["end"] is None:
                self._findings_stored[f["id"]] = _stored(f)
            else:
                self._findings_stored.pop(f["id"], None)
        return [finding_row(f) for f in findings]

    def _write_findings(self, rows: list[tuple]) -> None:
        self._store_later(lambda st: st.upsert_findings(rows), rows, [], [], self._clock())

    def _log_findings(self, changed: list[dict]) -> None:
        """A line per finding opened or closed; a fleet turning over at once
        (a restart, a storm) gets one line with the counts instead."""
        if len(changed) > 10:
            closed = sum(f["end"] is not None for f in changed)
            log.info("findings changed", opened=len(changed) - closed, closed=closed,
                     hosts=len({f["host"] for f in changed}))
            return
        for f in changed:
            if f["end"] is None:
                log.info("finding opened", host=f["host"], gpu=f["gpu"], verdict=f["verdict"],
                         confidence=f["confidence"], summary=f.get("summary"))
            else:
                log.info("finding closed", host=f["host"], gpu=f["gpu"], verdict=f["verdict"], start=f["start"],
                         end=f["end"], reason=f.get("ended_because", ""))

    # -- anomalies -> decisions -> commands (writer thread) ---------------------------------
    def _act_on(self, anomalies: list[Anomaly]) -> None:
        """Decide on each anomaly, send the captures, then store everything in
        one write: a storm of thousands of anomalies must not stall ingest."""
        hosts_known = self._hosts_heard() or 1
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
            # a fleet changing phase raises a storm per commit group: one line per STORM_LOG_EVERY_S
            said = self._storm_log.hit(storms=1, anomalies=len(anomalies))
            if said is not None:
                log.warning("anomaly storm", anomalies=len(anomalies), hosts=len({a.host for a in anomalies}),
                            storms_since_last_line=said["storms"] - 1,
                            anomalies_since_last_line=said["anomalies"] - len(anomalies))
        self.writer.defer(lambda st: st.insert_anomalies(rows))
        self._decided(decisions, new=True)

    def _decided(self, decisions: list[Decision], new: bool = False) -> None:
        """Publishes and stores decisions; `new`: all just made by the
        policy, so inserted (their later states are upserted)."""
        rows = []
        for d in decisions:
            row = {k: v for k, v in asdict(d).items() if k not in ("duration_ms", "pid")}
            rows.append(row)
            self.decisions_total[d.action] = self.decisions_total.get(d.action, 0) + 1
            self.events.publish(dict(kind="decision", t=d.updated, host=d.host, gpu=d.gpu, verdict=None, record=row))
        if len(decisions) <= 10:
            for d in decisions:
                log.info("capture decision", host=d.host, gpu=d.gpu, action=d.action, status=d.status, reason=d.reason)
        self.writer.defer(lambda st: st.insert_decisions(rows) if new else st.upsert_decisions(rows))

    def report_calibration(self, host: str, record: dict) -> dict:
        """A GPU's measured ceilings: checked (CalibrationInvalid names the bad
        field), stored beside its earlier ones. Returns {id, ceilings}."""
        cal, rows = parse_calibration(host, record, received=time.time())
        def store(st: Store) -> str:
            cid = st.add_calibration(cal, rows)
            # the writer thread judges the windows: the new ceiling reaches them in order
            self.live.hbm_measured = st.measured_hbm()
            return cid
        cid = self.writer.call(store).result(timeout=30)
        log.info("calibration stored", host=host, gpu=cal["gpu"], uuid=cal["uuid"], platform=cal["platform"])
        return dict(id=cid, ceilings=len(rows))

    def report_capture(self, record, xspace: bytes) -> dict:
        """A capture an agent ran: summarize its trace, store it, link it to
        the open finding of its GPU. Returns the stored row."""
        summary: dict | None = None
        error = record.error
        if xspace:
            try:
                links = {g: pcie_link(gen, width, name) for g, (gen, width, name)
                         in self.store.host_links(record.host).items()}
                trace = parse_trace(xspace, record.path or record.id)
                summary = summarize(trace, links, self.store.host_measured_peaks(record.host))
                program = trace_program(trace)
                if program is not None:           # what the program check matches the job's run by
                    summary["program"] = program
                if record.trigger.startswith(COORDINATED):   # one rank of a job's coordinated capture
                    summary["collectives"] = collectives(trace)
            except TraceError as exc:
                error = (error + "; " if error else "") + str(exc)
        verdict = summary.get("verdict") if summary else None
        confidence = float(summary.get("confidence") or 0.0) if summary else 0.0
        row = dict(id=record.id, host=record.host, target=record.target,
                   pid=record.pid if record.HasField("pid") else None, gpus=json.dumps(list(record.gpus)),
                   job=clean_command(record.job), start=record.start, end=record.end, duration_ms=record.duration_ms,
                   path=record.path, size_bytes=record.size_bytes, status=record.status, error=error,
                   trigger=record.trigger, verdict=verdict, confidence=confidence, kind=record.kind or "jax",
                   summary=json.dumps(summary, default=str) if summary else None, finding_id=None)

        stored: list[Exception | None] = []

        def store(_store: Store) -> None:
            f = self.findings.attach_capture(record.host, list(record.gpus), record.id, verdict, confidence,
                                             summary.get("summary", "") if summary else "",
                                             ended=record.end or record.start)
            if f is not None:
                row["finding_id"] = f["id"]
                self._persist_findings([f])
                self._status_dirty.update((record.host, g) for g in record.gpus)
            pair = self._verdict_pair(record, verdict, confidence, f)

            def write(st: Store) -> None:
                st.upsert_capture(row)
                if pair is not None:
                    st.upsert_verdict_pair(pair)
            # deferred behind its finding's row, in the same transaction: whoever
            # sees the capture sees the finding that names it (a CI run read the
            # capture while the finding's row still listed none)
            self.writer.defer(write, stored.append)
            d = self.policy.finished(record.trigger, record.id, record.status.startswith("ok"),
                                     f"{record.kind or 'capture'} {record.status}"
                                     + (f": {record.error}" if record.error else ""))
            if d is not None:
                self._decided([d])
        # a task's future resolves once what it deferred is settled
        self.writer.call(store).result(timeout=30)
        if not stored or stored[0] is not None:
            # a validated record that DuckDB could not write (a full disk, most often) is the store's
            # failure, not the agent's: it is told to resend (found in a trial: UNKNOWN, and the capture lost)
            raise StoreUnavailable(str(stored[0]) if stored else "the writer did not take it")
        gpu = record.gpus[0] if record.gpus else 0
        self.events.publish(dict(kind="capture", t=record.end or time.time(), host=record.host, gpu=gpu,
                                 verdict=verdict, record={k: v for k, v in row.items() if k != "summary"}))
        return row

    def _verdict_pair(self, record, verdict: str | None, confidence: float, finding: dict | None) -> dict | None:
        """What the counters said of the captured GPU when its trace landed,
        beside what the trace said: the open finding's counters verdict, else
        the GPU's latest window if it ended within the capture or just before
        it. None without a trace verdict or a counters verdict to pair."""
        if verdict is None or not record.gpus:
            return None
        gpu = finding["gpu"] if finding is not None else record.gpus[0]
        if finding is not None:
            said, sure = finding["counters_verdict"], finding["confidence"]
        else:
            st = self.gpus.get((record.host, gpu))
            if st is None or not st.verdict or st.last_window_end is None or not (
                    record.start - 2 * self.window_s <= st.last_window_end <= record.end + 2 * self.window_s):
                return None
            said, sure = st.verdict, st.confidence
        return dict(capture_id=record.id, t=record.end or record.start, host=record.host, gpu=gpu,
                    model=self._names.get((record.host, gpu), ""), counters_verdict=said, counters_confidence=sure,
                    trace_verdict=verdict, trace_confidence=confidence,
                    finding_id=finding["id"] if finding is not None else None)

    def sweep(self) -> Future:
        """Judge windows of GPUs that went quiet, and close their findings at
        the end of the last window each absorbed."""
        def run(_store: Store) -> None:
            now = self._clock()
            at = self._silence_clock(now)
            self._record(self.live.sweep(at))
            closed = []
            for key in list(self.findings.open):
                st = self.gpus.get(key)
                # A finding resumed after a restart waits as long for its agent.
                heard = max(st.last_arrival if st is not None else 0.0, self.started)
                if heard < at - self.stale_after_s:
                    closed.append(self.findings.close(key, reason=self._silence(key, st, at)))
                    self._status_dirty.add(key)
            if closed:
                self._persist_findings(closed)
                self._log_findings(closed)
                for f in closed:
                    self.events.publish(dict(kind="finding", t=f["end"], host=f["host"], gpu=f["gpu"],
                                             verdict=f["verdict"], record=f))
            expired = self.policy.expire()
            if expired:
                self._decided(expired)
            self._write_owed(now)
            self._publish_status()
        return self.writer.call(run)

    def _silence_clock(self, now: float) -> float:
        return silence_time(now, self.writer.behind_since())

    def _silence(self, key: tuple[str, int], st: GpuState | None, now: float) -> str:
        if key in self._lost:
            return "GPU lost (fell off the bus); agent sends no samples of it"
        if key in self._source_down:
            silent = f" for {now - st.last_arrival:.0f} s" if st is not None and st.last_arrival else ""
            return f"its source stopped: no samples{silent}; the agent said: {self._source_down[key][:300]}"
        if st is None or st.last_arrival < self.started:
            return "agent went silent (not heard from since the analyzer restarted)"
        return f"agent went silent (no samples for {now - st.last_arrival:.0f} s)"

    def _hosts_heard(self) -> int:
        """Hosts heard from within the staleness horizon, counted at most once
        a second over the hosts (not their GPUs: 16,000 of them took ~4 ms
        and more under load), as anomalies come every commit group once the
        detector has history."""
        now = self._clock()
        if not now - 1.0 < self._hosts_heard_at <= now:
            horizon = self._silence_clock(now) - self.stale_after_s
            self._hosts_heard_n = sum(1 for t in list(self._host_arrival.values()) if t >= horizon)
            self._hosts_heard_at = now
        return self._hosts_heard_n

    # -- fleet checks (fleet_findings.py) ---------------------------------------------------
    def _fleet_checks_job(self) -> None:
        try:
            self.run_fleet_checks().result(timeout=120)
        except Exception as exc:  # a scheduled job: log, and try again at the next interval
            if not self._scheduler.running:      # the analyzer stopped under it (the store closed): no fault
                log.info("fleet checks stopped with the analyzer", error=str(exc)[:200])
                return
            log.exception("fleet checks failed")

    def run_fleet_checks(self, now: float | None = None) -> Future:
        """Runs the fleet checks over what the store holds at `now` and
        turns their answers into findings (opened, refreshed, closed) on the
        writer thread. The queries read on their own cursors here, off the
        writer, so ingest waits only for the findings' rows."""
        now = self._clock() if now is None else now
        inputs = self.store.degraded_inputs(now - self.config.degraded_span_s, now)
        degraded = find_degraded(duckdb.connect(), inputs, self.config.degraded)
        found = {"degraded": [degraded_condition(f, self.config.degraded) for f in degraded]}
        runs, cursor, interval = self.program_check.collect(now)
        weak: dict[tuple[str, int], list[dict]] = {}
        for c in found["degraded"]:
            weak.setdefault((c["host"], c["gpu"]), []).append(c)
        found["regression"] = self.program_check.judge(runs, weak)
        found["straggler"] = find_stragglers(runs, interval, self.config.stragglers, weak)

        def apply(_store: Store) -> dict[str, int]:
            self.program_check.apply(runs, cursor)
            return self._apply_conditions(found, now)
        return self.writer.call(apply)

    def _apply_conditions(self, found: dict[str, list[dict]], now: float) -> dict[str, int]:
        counts = {}
        for kind, conditions in found.items():
            r = self.conditions[kind].reconcile(conditions, now)
            if r.changed:
                self._write_findings([finding_row(f) for f in r.changed])
            turned = r.opened + r.closed
            self._log_findings(turned)
            if kind == "straggler":
                for f in r.opened:
                    self._trace_job(f, now)
            for f in turned:
                self.events.publish(dict(kind="finding", t=f["end"] if f["end"] is not None else f["start"],
                                         host=f["host"], gpu=f["gpu"], verdict=f["verdict"], record=f))
            counts[kind] = len(self.conditions[kind].open)
        return counts

    def _trace_job(self, f: dict, now: float) -> None:
        """A straggler's job traced on every rank over one window (a
        coordinated capture), at most once per job per cooldown; the
        decision is recorded either way."""
        job = (f.get("attribution") or {}).get("dist_job") or ""
        cfg = self.config.trigger
        last = self._job_traced.get(job)
        ranks = self.job_ranks(job) if job else []
        if cfg.dry_run or not ranks or (last is not None and now - last < cfg.job_capture_cooldown_s):
            why = ("dry run" if cfg.dry_run else "no rank of its job seen in the last 10 minutes" if not ranks else
                   f"its job was traced {now - last:.0f} s ago (one coordinated capture per "
                   f"{cfg.job_capture_cooldown_s:.0f} s)")
            action, status, group, reason = ("dry-run" if cfg.dry_run else "skip"), "skipped", "", why
        else:
            self._job_traced[job] = now
            group, _, sent = coordinated.send(self.commands, job, ranks, cfg.job_capture_duration_ms,
                                              cfg.job_capture_lead_s)
            reached = sum(r["sent"] for r in sent)
            action, status = "capture-job", "sent" if reached else "failed"
            reason = (f"every rank of {job} traced over one window ({reached} of {len(sent)} agents reached; "
                      f"`gpuscope capture --job` reads group {group})")
        self._decided([Decision(id=new_id(), t=now, host=f["host"], gpu=f["gpu"], job=job,
                                anomaly_id="", action=action, reason=f"straggler {f['id']}: {reason}", status=status,
                                capture_id=group, updated=now)])

    def open_conditions(self, key: tuple[str, int]) -> list[dict]:
        """The GPU's open degraded (and other fleet-check) findings, as they are now."""
        return [f for c in self.conditions.values() for f in list(c.open.values())
                if (f["host"], f["gpu"]) == key]

    # -- retention --------------------------------------------------------------------------
    def _retention_job(self) -> None:
        try:
            self.run_retention(keep_going=lambda: self._scheduler.running)
        except Exception:  # a scheduled job: log, and try again at the next interval
            log.exception("retention pass failed")

    def run_retention(self, keep_going: Callable[[], bool] = lambda: True, max_chunks: int = 100_000,
                      breather: bool = True) -> PassResult:
        """One pass of retention: chunks on the writer thread until the store
        holds nothing older than the horizon (see analyzers/retention.py)."""
        result = self.retention.run_pass(self.writer.call, keep_going, max_chunks, breather)
        self.writer.call(lambda _store: self.writer.reload_seqs())    # boots the pass pruned leave memory too
        return result

    # -- the fleet tier ---------------------------------------------------------------------
    def _publish_job(self) -> None:
        try:
            self.publisher.run_pass()        # drain() stops it between files
        except Exception as exc:  # a scheduled job: log, and try again at the next interval
            self.publisher.last_error = f"pass failed: {exc}"
            log.exception("fleet publish pass failed")

    # -- queries ----------------------------------------------------------------------------
    def status(self, host: str = "", gpu_limit: int | None = None) -> dict:
        """Totals over the whole fleet, and the GPUs of `host` (all when
        empty), at most `gpu_limit` (None: all): see status.summarize."""
        items = list(self.gpus.items())       # list(): the writer thread may add a GPU
        return summarize_status(((k, st.last_arrival) for k, st in items), self._row, self._totals(),
                                self._clock(), host, gpu_limit)

    def publish_status(self, max_closed: int = MIRROR_CLOSED) -> Future:
        """Publishes every GPU touched so far and the open and recent
        findings (a new mirror's start)."""
        def first(store: Store) -> None:
            self._findings_written = []
            self._publish_status(store.recent_findings(max_closed))
        return self.writer.call(first)

    def _publish_status(self, findings_start: tuple | None = None) -> None:
        """Writer thread, after each commit group's analysis and each sweep:
        the rows of the GPUs touched since, the totals and the findings rows
        committed since, to whoever keeps the mirrors (the engine's parent
        process: StatusMirror, FindingsMirror)."""
        if self.on_status is None:
            return
        keys, self._status_dirty = self._status_dirty, set()
        written, self._findings_written = self._findings_written, []
        try:
            self.on_status([self._row(k) for k in keys if k in self.gpus], self._totals(), written, findings_start)
        except Exception:  # the mirror is a view: its failure must not stop analysis
            log.exception("status not published")

    def _touch(self, key: tuple[str, int], now: float) -> None:
        self._dirty.add(key, key, now)
        self._status_dirty.add(key)

    def _row(self, key: tuple[str, int]) -> GpuRow:
        st = self.gpus[key]
        f = self.findings.open.get(key)
        return GpuRow(st.host, st.gpu, self._names.get(key, ""), st.verdict, st.confidence, st.flags,
                      st.last_sample, st.last_arrival, f["id"] if f else None, key in self._lost,
                      self._sources.get(key, ""), self._uuids.get(key, ""), _owner(f))

    def _totals(self) -> dict:
        w = self.writer
        return dict(started=self.started, batches_committed=w.batches, batches_duplicate=w.duplicates,
                    batches_rejected=self.rejected, samples_committed=w.samples,
                    samples_stored=self._samples_at_start + w.samples - self.retention.samples_deleted,
                    stale_after_seconds=self.stale_after_s, analysis_lag_seconds=self.analysis_lag(),
                    ingest_behind_since=self.writer.behind_since(),
                    store_error=w.last_error if w.failing_since is not None else "",
                    store_failing_since=w.failing_since,
                    findings_open=len(self.findings.open),
                    db_path=self.config.db_path, window_seconds=self.window_s, anomalies=self.anomalies_total,
                    decisions=dict(self.decisions_total), captures_in_flight=self.policy.in_flight,
                    agents_connected=len(self.commands.hosts), retention_seconds=self.config.retention_s,
                    publish=self.publisher.status() if self.publisher is not None else None)

    def live_finding(self, row: dict) -> dict:
        """A stored finding row as it is now: an open finding's running
        numbers live in memory and reach the store with the next snapshot."""
        if row.get("end") is not None:
            return row
        live = self._live_fields(row["id"], row["host"], row["gpu"])
        return row if live is None else {**row, **live}

    def _live_fields(self, finding_id: str, host: str, gpu: int) -> dict | None:
        f = self.findings.open.get((host, gpu))
        if f is None or f["id"] != finding_id:
            return None
        return {**{k: f[k] for k in FINDING_COLUMNS if k in f}, "evidence": self.findings.evidence_of(f),
                "absorbed_until": f.get("last_window_end")}

    def findings_payload(self, **query) -> tuple:
        """What `list_findings` needs, in the form that costs this process
        least: the stored rows as an Arrow table, and the live numbers of
        the open findings among them that changed since they were written
        (the rest are stored as they are). The caller builds the rows
        (`merge_live`): in the process engine that is the gRPC process,
        whose GIL the writer does not hold."""
        table = self.store.findings_table(**query)
        overlay = {}
        dirty, unstored = self._findings_dirty, self._findings_unstored
        if dirty or unstored:
            ends = table.column("end").to_pylist()
            ids, hosts, gpus = (table.column(c).to_pylist() for c in ("id", "host", "gpu"))
            for fid, host, gpu, end in zip(ids, hosts, gpus, ends):
                if end is None and (fid in dirty or fid in unstored):
                    live = self._live_fields(fid, host, gpu)
                    if live is not None:
                        overlay[fid] = live
        return table, overlay

    def list_findings(self, **query) -> list[dict]:
        """Store.findings(**query), open findings as they are now."""
        return merge_live(*self.findings_payload(**query))

    def findings_messages(self, convert: Callable[[dict], object], variant: str, **query) -> list:
        """`list_findings`' rows as `convert` makes them (the engine keeps
        them per `variant`; here nothing is kept)."""
        return [convert(r) for r in self.list_findings(**query)]

    def finding(self, finding_id: str) -> dict | None:
        row = self.store.finding(finding_id)
        return None if row is None else self.live_finding(row)

    def list_programs(self, start: float, host: str = "", fingerprint: str = "", limit: int = 200) -> list[dict]:
        """Programs with runs since `start` and their baselines, or one
        program's runs (analyzers/program_list.py)."""
        return list_programs(self.store, start, host, fingerprint, limit,
                             list(self.conditions["regression"].open.values()), self.config.programs)

    def job_ranks(self, job: str, since_s: float = 600.0) -> list[dict]:
        """The ranks of `job` seen in the last `since_s`, the newest process
        of each: rank, host, GPUs, pid (what a coordinated capture asks for)."""
        jobs = list_jobs(self.store, self._clock() - since_s, job)
        return [dict(rank=r["rank"], host=r["host"], gpus=r["gpus"], pid=r["pid"])
                for j in jobs for r in j.get("rank_list", [])]

    def job_skew(self, group: str) -> dict:
        """What a coordinated capture's traces say (analyzers/rank_skew.py),
        with each rank's capture as it stands (reported or not yet)."""
        rows = self.store.coordinated_captures(group)
        per_rank, hosts, captures = {}, {}, []
        for r in rows:
            rank = r["trigger"].rsplit("-r", 1)[-1]
            hosts[rank] = r["host"]
            per_rank[rank] = json.loads(r["collectives"]) if r["collectives"] else []
            captures.append(dict(rank=rank, id=r["id"], host=r["host"], status=r["status"], error=r["error"],
                                 collectives=len(per_rank[rank])))
        return dict(skew(per_rank, hosts), group=group, captures=captures)

    def list_jobs(self, start: float, job: str = "", limit: int = 200) -> list[dict]:
        """Distributed jobs with ranks since `start`, what their GPUs do now and
        their stragglers, or one job's ranks (analyzers/job_list.py)."""
        now = {key: st.verdict for key, st in list(self.gpus.items()) if st.verdict}
        return list_jobs(self.store, start, job, limit, now, list(self.conditions["straggler"].open.values()))

    def top(self, start: float, end: float, host: str = "", by: str = "gpu", limit: int = 20) -> list[dict]:
        """The GPUs (or jobs, pods, Slurm jobs) bottlenecked longest over
        [start, end] (Store.top_bottlenecked), what holds each now (its open
        finding, as it is in memory) and, by GPU, whether it is stale
        (status' rule)."""
        now = self._clock()
        silence_at = self._silence_clock(now)
        rows = self.store.top_bottlenecked(start, end, limit, now=now, host=host, by=by)
        open_now: dict = {}                 # the tracker's open findings, as they are now: no store read
        for (h, g), f in list(self.findings.open.items()):
            if f["verdict"] != "idle" and (not host or h == host):
                open_now.setdefault((h, g) if by == "gpu" else finding_group(f, by), f)
        for r in rows:
            f = open_now.get((r["host"], r["gpu"]) if by == "gpu" else r["group"])
            r["now"] = None if f is None else {k: f[k] for k in ("id", "verdict", "start", "confidence", "summary",
                                                                 "flags")}
            st = self.gpus.get((r["host"], r["gpu"])) if by == "gpu" else None
            heard = st.last_arrival if st is not None else 0.0
            r["last_seen_age_s"] = now - heard if heard else None
            r["stale"] = by == "gpu" and (not heard or silence_at - heard > self.stale_after_s)
            r["conditions"] = ([f"{f['kind']}: {', '.join(f['flags'])}" for f in self.open_conditions((r["host"], r["gpu"]))]
                               if by == "gpu" else [])
        return rows

    def report(self, finding_id: str, context_s: float = 0.0) -> dict | None:
        """The story of one finding (analyzers/report.py), open ones as they
        are now; the id may be its first characters."""
        fid = full_id(self.store, finding_id)
        return None if fid is None else build_report(self.store, fid, context_s, lookup=self.finding)

    def range_report(self, start: float, end: float, host: str = "", gpu: int | None = None,
                     max_points: int = 0, max_gpus: int = 0) -> dict:
        """The picture of a time range (analyzers/report.py); 0: the defaults."""
        kw = {k: v for k, v in (("max_points", max_points), ("max_gpus", max_gpus)) if v}
        return build_range_report(self.store, start, end, host, gpu, **kw)

    def analysis_lag(self) -> float:
        """How far live analysis is behind the newest samples received: per
        host, the start of the window holding its newest sample minus the end
        of its newest judged window, the largest over hosts; 0 when caught up.
        The window still filling is not lag, nor are windows without samples:
        once a sample is analysed every window before its own counts as judged."""
        lag = 0.0
        with self._lock:
            for host, newest in self._newest_seen.items():
                judged = max(self._judged_end.get(host, -math.inf), self._analysed.get(host, -math.inf))
                if judged == -math.inf:
                    judged = self._first_window.get(host, newest)
                lag = max(lag, math.floor(newest / self.window_s) * self.window_s - judged)
        return lag

    def drain(self, timeout_s: float = 6.0) -> None:
        """Stops taking batches and commits those queued, bounded in time."""
        if self.publisher is not None:
            self.publisher.stop()
        try:
            self._scheduler.shutdown(wait=False)
        except Exception:  # not started
            pass
        self.writer.call(lambda _store: self._write_owed(self._clock(), everything=True))
        self.writer.stop(timeout_s)

    def close(self) -> None:
        self.drain()
        self.store.close()
