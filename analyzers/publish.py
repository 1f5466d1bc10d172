"""Publishing to the fleet tier: each analyzer writes its per-minute rollups,
closed findings and capture summaries as hive-partitioned Parquet
(analyzers/fleet_layout.py) to a directory, S3 or GCS, for fleet-wide
questions (analyzers/fleet_query.py, `gpuscope fleet`).

A pass (every `interval_s`, on the analyzer's scheduler thread, never the
writer's) does three things:

1. stage: the rows of every whole minute older than `delay_s` and not yet
   staged are read from the store (a reader cursor: ingest never waits)
   and written as segments, one per host and hour, into a local outbox;
   then the table's watermark moves and is saved. From here a row is
   durable on the analyzer's disk, whatever the storage does.
2. compact: the segments of an hour that has closed are merged into one,
   and those of a day into one, locally, so readers open one file per host
   and day (a fleet of 1,000 hosts at 5-minute passes would otherwise
   leave 288,000 files a day).
3. upload: each segment in the outbox is put whole (a local rename, an
   S3 or GCS object), retried with backoff; what still fails stays in the
   outbox for the next pass, which resumes from there: slow or absent
   storage delays publishing and loses nothing. Only once a merged segment
   is uploaded are the ones it replaces deleted from storage; readers
   ignore a segment another contains, so the moment in between counts
   nothing twice.

The watermark and outbox live in `state_dir` (beside the DB), so a restart
resumes where the last pass left off. Rows that reach the store later than
`delay_s` after their time (an agent's backlog after an outage longer than
that, a finding closed long after its end at a restart) are not published.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from . import fleet_layout as lay
from .object_store import ObjectStore, StorageError, parse_location

log = structlog.get_logger("gpuscope.publish")

Rows = Callable[[str, float, float], pa.Table]      # (table, lo, hi) -> rows with `host`


@dataclass(frozen=True)
class PublishConfig:
    url: str                          # a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX
    cluster: str
    state_dir: str                    # outbox and watermarks
    interval_s: float = 300.0         # between passes
    delay_s: float = 300.0            # minutes this recent wait: late samples, findings about to close
    attempts: int = 4                 # per file and pass before the pass gives up
    backoff_s: float = 2.0            # first wait between attempts; doubles
    max_backoff_s: float = 60.0
    backfill_s: float = 0.0           # a first start publishes this much of the past too (0: from now on)

    def __post_init__(self) -> None:
        lay.check_cluster(self.cluster)
        parse_location(self.url)
        if not self.interval_s >= 10:
            raise ValueError(f"publish interval: at least 10 s, got {self.interval_s:g}")
        if not self.delay_s >= 0 or not self.backfill_s >= 0:
            raise ValueError("publish delay and backfill: 0 or more seconds")


class Publisher:
    def __init__(self, config: PublishConfig, rows: Rows, storage: ObjectStore | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self._rows = rows
        self.storage = storage if storage is not None else ObjectStore(parse_location(config.url))
        self._clock = clock
        self._dir = Path(config.state_dir)
        self._outbox, self._sent = self._dir / "outbox", self._dir / "sent"
        for d in (self._outbox, self._sent):
            d.mkdir(parents=True, exist_ok=True)
        self._state_path = self._dir / "state.json"
        self.watermarks: dict[str, float] = self._load()
        self._stop = threading.Event()
        self.files_uploaded = self.rows_staged = self.failures = self.consecutive_failures = 0
        self.last_error = ""
        self.last_upload_at: float | None = None
        self.last_pass_at: float | None = None
        self._pending: list[lay.Segment] = []

    # -- state -------------------------------------------------------------------------------
    def _load(self) -> dict[str, float]:
        try:
            state = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"publish state {self._state_path}: {exc}; remove it to start publishing from now "
                               "(what it had staged is still in the outbox beside it)") from None
        return {t: float(v) for t, v in state.get("watermarks", {}).items() if t in lay.TABLES}

    def _save(self) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.config.url, "cluster": self.config.cluster,
                                   "watermarks": self.watermarks}))
        os.replace(tmp, self._state_path)

    def stop(self) -> None:
        """A pass in its backoff returns at once (shutdown)."""
        self._stop.set()

    # -- the pass ----------------------------------------------------------------------------
    def run_pass(self, keep_going: Callable[[], bool] | None = None) -> dict:
        staged = self.stage()
        merged = self.compact()
        uploaded = self.upload(keep_going or (lambda: not self._stop.is_set()))
        self.last_pass_at = self._clock()
        out = dict(rows_staged=staged, segments_merged=merged, files_uploaded=uploaded,
                   files_pending=len(self._pending))
        if staged or uploaded:
            log.info("fleet publish pass", target=self.storage.loc.url, **out)
        return out

    def _horizon(self) -> float:
        return math.floor((self._clock() - self.config.delay_s) / 60.0) * 60.0

    def stage(self) -> int:
        """Rows up to the horizon into the outbox, an hour at most per segment."""
        hi = self._horizon()
        n = 0
        for table in lay.TABLES:
            # a first start publishes from now on (or backfill_s before): the past is the analyzer's to answer
            lo = self.watermarks.get(table, math.floor((hi - self.config.backfill_s) / 60.0) * 60.0)
            for a, b in lay.ranges(lo, hi):
                n += self._stage_range(table, a, b)
                self.watermarks[table] = b
                self._save()
            self.watermarks.setdefault(table, hi)
        self._save()
        self.rows_staged += n
        return n

    def _stage_range(self, table: str, lo: float, hi: float) -> int:
        rows = self._rows(table, lo, hi)
        if rows.num_rows == 0:
            return 0
        hosts = rows.column("host").to_pylist()
        body = rows.drop_columns(["host"])
        start = 0
        for i in range(1, len(hosts) + 1):          # the store sorts by host
            if i == len(hosts) or hosts[i] != hosts[start]:
                seg = lay.segment(table, self.config.cluster, hosts[start], lo, hi)
                self._write(self._outbox / seg.key, body.slice(start, i - start))
                start = i
        return rows.num_rows

    @staticmethod
    def _write(path: Path, rows: pa.Table) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(rows, tmp, compression="zstd")
        os.replace(tmp, path)

    # -- local segments ----------------------------------------------------------------------
    def _local(self) -> dict[lay.Segment, Path]:
        """Every segment in the outbox and among those sent: sent ones are
        kept until their day is one segment, for compaction."""
        out: dict[lay.Segment, Path] = {}
        for base in (self._sent, self._outbox):        # outbox last: a re-staged segment is the newer copy
            for d, _, files in os.walk(base):
                for f in files:
                    seg = lay.parse_key(os.path.relpath(os.path.join(d, f), base))
                    if seg is not None:
                        out[seg] = Path(d) / f
        return out

    def compact(self) -> int:
        """Merges the segments of each closed hour, and of each closed day,
        into one. Returns how many segments were merged."""
        local = self._local()
        merged = 0
        for group in lay.by_partition(local).values():
            first = group[0]
            wm = self.watermarks.get(first.table, -math.inf)
            day = lay.day_start(first.date)
            blocks = [(0, 1440)] if day + lay.DAY_S <= wm else [
                (h * 60, h * 60 + 60) for h in range(24) if day + (h + 1) * lay.HOUR_S <= wm]
            kept = lay.maximal(group)          # once per directory, not per hour
            for lo, hi in blocks:
                inside = [s for s in kept if lo <= s.lo and s.hi <= hi]
                if len(inside) < 2:
                    continue
                block = lay.Segment(first.table, first.date, first.cluster, first.host, lo, hi)
                column = lay.TABLES[first.table]
                tables = [pq.read_table(local[s]) for s in inside]
                rows = pa.concat_tables(tables, promote_options="permissive").sort_by(column)
                self._write(self._outbox / block.key, rows)
                merged += len(inside)
        return merged

    def upload(self, keep_going: Callable[[], bool] = lambda: True) -> int:
        """Puts the outbox's segments (those no other one contains), then
        deletes from storage what an uploaded one replaced."""
        local = self._local()
        keep = set(lay.maximal(local))
        sent = {s for s, p in local.items() if p.is_relative_to(self._sent)}
        todo = sorted(s for s in keep if s not in sent)
        n = 0
        for seg in todo:
            if not keep_going() or not self._put(local[seg], seg):
                break
            dest = self._sent / seg.key
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(local[seg], dest)
            local[seg] = dest
            sent.add(seg)
            n += 1
        self._retire(local, keep, sent)
        self._pending = sorted(s for s in keep if s not in sent)
        return n

    def _put(self, path: Path, seg: lay.Segment) -> bool:
        wait = self.config.backoff_s
        for attempt in range(1, self.config.attempts + 1):
            try:
                self.storage.put(str(path), seg.key)
            except StorageError as exc:
                self.failures += 1
                self.consecutive_failures += 1
                self.last_error = str(exc)
                if self.consecutive_failures == 1 or attempt == self.config.attempts:
                    log.warning("fleet storage refused a segment; retrying", key=seg.key, attempt=attempt,
                                error=str(exc)[:300])
                if attempt == self.config.attempts or self._stop.wait(wait):
                    return False
                wait = min(wait * 2, self.config.max_backoff_s)
                continue
            if self.consecutive_failures:
                log.info("fleet storage answers again; publishing resumed", after_failures=self.consecutive_failures)
                self.last_error = ""        # history now (the log has it): status says what is wrong now
            self.consecutive_failures = 0
            self.files_uploaded += 1
            self.last_upload_at = self._clock()
            return True
        return False

    def _retire(self, local: dict[lay.Segment, Path], keep: set, sent: set) -> None:
        """Segments another one contains: never uploaded ones are dropped;
        uploaded ones are deleted from storage once their container is
        there. A day that is one segment in storage needs no local copy."""
        kept = lay.by_partition(keep)       # looked up per directory: a fleet retires tens of thousands at once
        for seg, path in local.items():
            if seg in keep:
                continue
            if seg in sent:
                container = next((k for k in kept.get((seg.table, seg.date, seg.cluster, seg.host), ())
                                  if k.contains(seg)), None)
                if container is None or container not in sent:
                    continue
                try:
                    self.storage.delete(seg.key)
                except StorageError as exc:
                    self.last_error = str(exc)
                    continue
            path.unlink(missing_ok=True)
        for group in lay.by_partition(s for s in local if s in keep).values():
            first = group[0]
            closed = lay.day_start(first.date) + lay.DAY_S <= self.watermarks.get(first.table, -math.inf)
            if closed and len(group) == 1 and first in sent:
                local[first].unlink(missing_ok=True)

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict:
        """What `gpuscope status` shows: how far behind the fleet tier is,
        and why."""
        now = self._clock()
        marks = [self.watermarks.get(t) for t in lay.TABLES]
        staged_until = min((m for m in marks if m is not None), default=None)
        oldest = min((s.start for s in self._pending), default=None)
        behind = min((x for x in (oldest, staged_until) if x is not None), default=None)
        return dict(target=self.storage.loc.url, cluster=self.config.cluster, interval_seconds=self.config.interval_s,
                    staged_until=staged_until or 0.0, files_pending=len(self._pending),
                    lag_seconds=max(0.0, now - behind) if behind is not None else 0.0,
                    last_upload=self.last_upload_at or 0.0, last_pass=self.last_pass_at or 0.0,
                    files_uploaded=self.files_uploaded, rows_staged=self.rows_staged, failures=self.failures,
                    consecutive_failures=self.consecutive_failures, last_error=self.last_error)

