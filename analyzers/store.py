"""The analyzer's DuckDB store: schema, migrations and every SQL statement.

Times are Unix seconds (DOUBLE); metric columns carry the catalogue's units
(declared again in the `metrics` table so SQL users can see them). Samples are
appended as Arrow tables, never row by row.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS, FINDING_KINDS  # noqa: F401 (the store's vocabulary)

from . import hot_tables
from .calibrations import peaks_from
from .degraded import clocks_at_power_sql
from .programs import RUN_COLUMNS
from .seqset import SeqSet

SCHEMA_VERSION = 11         # 9: findings of other kinds than bottlenecks (degraded, regression); 10: program runs;
                            # 11: findings, anomalies, decisions as hot and history tables (hot_tables.py)
# Columns added after a table first shipped: files created earlier gain them on open.
ADDED_COLUMNS = {"findings_hot": ("counters_verdict", "trace_verdict", "captures",     # 2: captures refine findings
                              "absorbed_until DOUBLE",        # 5: the last window end the row's numbers hold
                              "attribution",                  # 6: whose the job is (JSON of its known labels)
                              "source",                       # 7: where the counters that decided came from
                              # 9: bottleneck, degraded, regression; what a kind's check calls the condition
                              "kind VARCHAR DEFAULT 'bottleneck'", "condition_key"),
                 "captures": ("kind",),                                          # 3: capture kinds
                 "agents": ("committed",),                                       # 4: exact committed seqs
                 "processes": ATTRIBUTION_FIELDS,                                # 6: whose each process is
                 "devices": ("source",                                           # 7: where its samples come from
                             "pcie_max_generation INTEGER", "pcie_max_width INTEGER",    # 8: the link's best
                             "driver_version",                                           # 8: and the driver
                             "pcie_busy_generation INTEGER", "pcie_busy_width INTEGER")}  # 9: the link under load
# What findings and queries group by, beside GPUs: the key's SQL over a findings row's
# attribution JSON (NULL where the job's attribution does not say)
_LABEL = "json_extract_string(attribution, '$.{}')"
FINDING_GROUPS = {"job": "host || ': ' || job",          # a job is a host's, as pids are
                  "pod": f"{_LABEL.format('namespace')} || '/' || {_LABEL.format('pod')}",
                  "slurm-job": _LABEL.format("slurm_job")}


def finding_group(f: dict, by: str) -> str | None:
    """FINDING_GROUPS' key of a finding held in memory (an open one)."""
    a = f.get("attribution") or {}
    if by == "job":
        return f"{f['host']}: {f['job']}" if f.get("job") is not None else None
    if by == "pod":
        return f"{a['namespace']}/{a['pod']}" if a.get("namespace") and a.get("pod") else None
    return a.get("slurm_job")


# ... and over a processes row, for metrics pooled by job (query --group-by)
PROCESS_GROUPS = {"job": "host || ' pid:' || pid || coalesce(' ' || nullif(command, ''), '')",
                  "pod": "namespace || '/' || pod",
                  "slurm-job": "slurm_job"}
# ... and over a gpu_owners row (a GPU its source names the owner of, no process seen)
OWNER_GROUPS = {"job": "o.host || ' ' || o.job", "pod": "o.namespace || '/' || o.pod", "slurm-job": "o.slurm_job"}
AGGREGATES = {"mean": "avg({m})", "min": "min({m})", "max": "max({m})",
              "p50": "quantile_cont({m}, 0.5)", "p95": "quantile_cont({m}, 0.95)",
              "p99": "quantile_cont({m}, 0.99)", "last": "arg_max({m}, t)"}
AGENT_COLUMNS = ("host", "boot_id", "max_seq", "last_seen", "dropped_samples", "committed")
DEVICE_COLUMNS = ("host", "gpu", "uuid", "name", "architecture", "memory_total_bytes", "power_limit_watts",
                  "pcie_generation", "pcie_width", "gpm_supported", "lost", "source", "pcie_max_generation",
                  "pcie_max_width", "driver_version", "pcie_busy_generation", "pcie_busy_width", "last_seen")
HEALTH_COLUMNS = ("host", "gpu", "t", "kind", "detail", "code")
WINDOW_COLUMNS = ("host", "gpu", "start", "end", "verdict", "confidence", "flags", "summary")
GPU_OWNER_COLUMNS = ("host", "gpu", "t_start", "t_end", "job", "namespace", "pod", "container", "slurm_job")
FINDING_COLUMNS = ("id", "host", "gpu", "job", "verdict", "start", "end", "confidence",
                   "windows", "evidence", "flags", "summary", "alternatives", "decided_by",
                   "counters_verdict", "trace_verdict", "captures", "absorbed_until", "attribution", "source",
                   "kind", "condition_key")
# Rows written before kinds existed (FINDING_KINDS), and rows that name none, are bottlenecks.
BOTTLENECK = "coalesce(kind, 'bottleneck') = 'bottleneck'"
VERDICT_PAIR_COLUMNS = ("capture_id", "t", "host", "gpu", "model", "counters_verdict", "counters_confidence",
                        "trace_verdict", "trace_confidence", "finding_id")
ANOMALY_COLUMNS = ("id", "t", "host", "gpu", "job", "kind", "kinds", "reason", "details", "finding_id")
DECISION_COLUMNS = ("id", "t", "host", "gpu", "job", "anomaly_id", "action", "reason", "status", "capture_id", "updated")
DRAWN_FLAGS = ("power-capped", "thermal-throttled")     # a window's flags a report draws beside its verdict
RECORD_TABLES = {"anomalies": ("kinds", "details"), "decisions": ()}
CALIBRATION_COLUMNS = ("id", "host", "gpu", "uuid", "model", "driver", "cuda", "jax", "platform", "started_at",
                       "duration_s", "quick", "forced", "received")
CEILING_COLUMNS = ("calibration_id", "uuid", "host", "gpu", "name", "unit", "value", "best", "spread", "repeats",
                   "conditions", "error")
CAPTURE_COLUMNS = ("id", "host", "target", "pid", "gpus", "job", "start", "end", "duration_ms", "path", "size_bytes",
                   "status", "error", "trigger", "verdict", "confidence", "summary", "finding_id", "kind")


MEMORY_SIZE = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B|B)", re.IGNORECASE)
# as DuckDB reads them: KB, MB... are powers of 1000, KiB, MiB... of 1024
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_size_bytes(text: str) -> int:
    """Bytes in a size MEMORY_SIZE matches (ValueError otherwise)."""
    m = MEMORY_SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r}: expected a size like 1GB or 512MiB")
    return int(float(text[:m.start(2)]) * _SIZE_UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class StoreConfig:
    path: str
    memory_limit: str = "1GB"        # DuckDB's own cap; the process adds Python and gRPC
    threads: int = 2
    # WAL size that makes DuckDB checkpoint at a commit. Its default (16 MB) is reached every ~5 s at 1,500
    # agents, and each checkpoint re-reads and re-compresses the samples table's unfinished row group:
    # appends alone took 19.0 s against 15.5 s at 64 MB, with peaks of +170 MB against +70 MB
    # (docs/benchmarks.md). A kill -9 replays at most this much WAL at the next start.
    checkpoint_threshold: str = "64MB"


def _ddl() -> list[str]:
    metric_cols = ",\n  ".join(f'"{m.name}" DOUBLE' for m in cat.METRICS)
    return [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        f"CREATE TABLE IF NOT EXISTS samples (\n  host VARCHAR NOT NULL,\n  gpu INTEGER NOT NULL,\n  t DOUBLE NOT NULL,\n  {metric_cols}\n)",
        """CREATE TABLE IF NOT EXISTS metrics (name VARCHAR PRIMARY KEY, unit VARCHAR, kind VARCHAR, help VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS processes (host VARCHAR, gpu INTEGER, t DOUBLE, pid BIGINT,
             used_memory_bytes BIGINT, cpu_cores DOUBLE, command VARCHAR)""",
        # a GPU's owner as its source names it (dcgm-exporter's pod labels) when no process is seen: one
        # row per batch, over the times of its samples
        """CREATE TABLE IF NOT EXISTS gpu_owners (host VARCHAR, gpu INTEGER, t_start DOUBLE, t_end DOUBLE,
             job VARCHAR, namespace VARCHAR, pod VARCHAR, container VARCHAR, slurm_job VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS devices (host VARCHAR, gpu INTEGER, uuid VARCHAR, name VARCHAR,
             architecture VARCHAR, memory_total_bytes BIGINT, power_limit_watts DOUBLE,
             pcie_generation INTEGER, pcie_width INTEGER, gpm_supported BOOLEAN, lost BOOLEAN,
             last_seen DOUBLE, PRIMARY KEY (host, gpu))""",
        """CREATE TABLE IF NOT EXISTS health (host VARCHAR, gpu INTEGER, t DOUBLE, kind VARCHAR,
             detail VARCHAR, code UBIGINT)""",
        """CREATE TABLE IF NOT EXISTS agents (host VARCHAR, boot_id VARCHAR, max_seq UBIGINT,
             last_seen DOUBLE, dropped_samples UBIGINT, committed VARCHAR, PRIMARY KEY (host, boot_id))""",
        """CREATE TABLE IF NOT EXISTS windows (host VARCHAR, gpu INTEGER, start DOUBLE, "end" DOUBLE,
             verdict VARCHAR, confidence DOUBLE, flags VARCHAR, summary VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS findings_hot (id VARCHAR PRIMARY KEY, host VARCHAR, gpu INTEGER,
             job VARCHAR, verdict VARCHAR, start DOUBLE, "end" DOUBLE, confidence DOUBLE,
             windows INTEGER, evidence VARCHAR, flags VARCHAR, summary VARCHAR,
             alternatives VARCHAR, decided_by VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS anomalies_hot (id VARCHAR PRIMARY KEY, t DOUBLE, host VARCHAR, gpu INTEGER,
             job VARCHAR, kind VARCHAR, kinds VARCHAR, reason VARCHAR, details VARCHAR, finding_id VARCHAR)""",
        """CREATE TABLE IF NOT EXISTS decisions_hot (id VARCHAR PRIMARY KEY, t DOUBLE, host VARCHAR, gpu INTEGER,
             job VARCHAR, anomaly_id VARCHAR, action VARCHAR, reason VARCHAR, status VARCHAR,
             capture_id VARCHAR, updated DOUBLE)""",
        """CREATE TABLE IF NOT EXISTS captures (id VARCHAR PRIMARY KEY, host VARCHAR, target VARCHAR, pid BIGINT,
             gpus VARCHAR, job VARCHAR, start DOUBLE, "end" DOUBLE, duration_ms INTEGER, path VARCHAR,
             size_bytes UBIGINT, status VARCHAR, error VARCHAR, trigger VARCHAR, verdict VARCHAR,
             confidence DOUBLE, summary VARCHAR, finding_id VARCHAR, kind VARCHAR)""",
        # Stated accuracy: what the counters said of a GPU when a trace of it landed, and what
        # the trace said (analyzers/accuracy.py); one row per capture with a trace verdict.
        """CREATE TABLE IF NOT EXISTS verdict_pairs (capture_id VARCHAR PRIMARY KEY, t DOUBLE, host VARCHAR,
             gpu INTEGER, model VARCHAR, counters_verdict VARCHAR, counters_confidence DOUBLE,
             trace_verdict VARCHAR, trace_confidence DOUBLE, finding_id VARCHAR)""",
        # Retention: samples older than the horizon, one row per GPU-minute (t: the minute's start).
        f"CREATE TABLE IF NOT EXISTS samples_1m (\n  host VARCHAR NOT NULL,\n  gpu INTEGER NOT NULL,\n"
        f"  t DOUBLE NOT NULL,\n  samples BIGINT NOT NULL,\n  {metric_cols}\n)",
        # Measured ceilings (`gpuscope calibrate --send`): every calibration is kept, the newest
        # per GPU UUID is that GPU's current one. The id is derived from (uuid, started_at): a resend replaces.
        """CREATE TABLE IF NOT EXISTS calibrations (id VARCHAR PRIMARY KEY, host VARCHAR, gpu INTEGER, uuid VARCHAR,
             model VARCHAR, driver VARCHAR, cuda VARCHAR, jax VARCHAR, platform VARCHAR, started_at DOUBLE,
             duration_s DOUBLE, quick BOOLEAN, forced BOOLEAN, received DOUBLE)""",
        """CREATE TABLE IF NOT EXISTS ceilings (calibration_id VARCHAR, uuid VARCHAR, host VARCHAR, gpu INTEGER,
             name VARCHAR, unit VARCHAR, value DOUBLE, best DOUBLE, spread DOUBLE, repeats INTEGER,
             conditions VARCHAR, error VARCHAR, PRIMARY KEY (calibration_id, name))""",
        # The analyzer's view of each GPU, written every 30 s: a restart reads it
        # (and what came after it) instead of scanning every window and sample.
        """CREATE TABLE IF NOT EXISTS gpu_state (host VARCHAR, gpu INTEGER, verdict VARCHAR, confidence DOUBLE,
             flags VARCHAR, last_window_end DOUBLE, last_sample DOUBLE, last_arrival DOUBLE, written DOUBLE,
             PRIMARY KEY (host, gpu))""",
        # Runs of programs (analyzers/programs.py): one process of one command, what its GPUs did
        # (signature: metric -> [sum, count] of the samples of the GPUs it held alone; verdicts:
        # verdict -> windows) and what its captures said (HLO fingerprint, step, top ops).
        """CREATE TABLE IF NOT EXISTS program_runs (id VARCHAR PRIMARY KEY, host VARCHAR, pid BIGINT, command VARCHAR,
             command_fp VARCHAR, hlo_fp VARCHAR, name VARCHAR, job VARCHAR, gpus VARCHAR, attribution VARCHAR,
             start DOUBLE, "end" DOUBLE, sampled_s DOUBLE, signature VARCHAR, verdicts VARCHAR, step_seconds DOUBLE,
             step_captures INTEGER, top_ops VARCHAR, captures VARCHAR, updated DOUBLE)""",
    ]


class Store:
    """One DuckDB file. Writes go through one connection (the writer thread);
    each reader gets its own cursor, so queries never block ingest."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self._generation = 0
        self._local = threading.local()
        self._siblings: list[Store] = []
        self._owner: Store | None = None
        self._con = self._connect()
        self._migrate()

    def sibling(self) -> "Store":
        """A second writer on this database: its own connection, so its own
        transactions, run at the same time as this one's (the writer's
        commit thread stores samples while the analysis writes windows and
        findings here; they never write the same tables). It follows
        reopen() and close(), which only its owner calls, while the
        sibling is idle."""
        sib = copy.copy(self)
        sib._owner, sib._siblings, sib._local = self, [], threading.local()
        sib._con = self._con.cursor()
        self._siblings.append(sib)
        return sib

    def _close_siblings(self) -> None:
        # a sibling's connection keeps the database (and its file lock) open after this one closes
        for sib in self._siblings:
            try:
                sib._con.close()
            except duckdb.Error:
                pass

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            con = duckdb.connect(self.config.path)
        except duckdb.Error as exc:
            raise RuntimeError(f"cannot open DuckDB file {self.config.path}: {exc}{_advice(exc)}") from exc
        if not MEMORY_SIZE.fullmatch(self.config.memory_limit):
            raise ValueError(f"memory limit: {self.config.memory_limit!r}, expected a size like 1GB or 512MiB")
        con.execute(f"SET memory_limit='{self.config.memory_limit}'")
        con.execute(f"SET threads={int(self.config.threads)}")
        if not MEMORY_SIZE.fullmatch(self.config.checkpoint_threshold):
            raise ValueError(f"checkpoint threshold: {self.config.checkpoint_threshold!r}, expected a size like 64MB")
        con.execute(f"SET checkpoint_threshold='{self.config.checkpoint_threshold}'")
        return con

    def reopen(self) -> None:
        """After a fatal error (e.g. the disk filled mid-commit) DuckDB
        invalidates the connection; a new one replays the WAL."""
        self._close_siblings()
        try:
            self._con.close()
        except duckdb.Error:
            pass
        self._con = self._connect()
        self._generation += 1

    def _migrate(self) -> None:
        con = self._con
        written = self._schema_written()
        if written > SCHEMA_VERSION:
            # an older gpuscope would write into a layout it does not know (schema 11 turned tables into
            # views: an older one's writes all fail); refuse before touching the file
            con.close()
            raise RuntimeError(f"{self.config.path} was written by a newer gpuscope (schema {written}; this one "
                               f"knows up to {SCHEMA_VERSION}): run that version, or start on a new --db")
        if not written and not self._ours_or_empty():
            # found in a trial: pointed at another program's DuckDB file, the analyzer added its tables
            # and 61 columns to the user's own `samples` before failing; refuse before writing anything
            con.close()
            raise RuntimeError(f"{self.config.path} holds tables of another program (not a gpuscope database): "
                               f"pass another --db")
        hot_tables.adopt_old_tables(con)
        for stmt in _ddl():
            con.execute(stmt)
        # Metrics added to the catalogue after the file was created become new columns.
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples'").fetchall()}
        for m in cat.METRICS:
            if m.name not in have:
                con.execute(f'ALTER TABLE samples ADD COLUMN "{m.name}" DOUBLE')
        for table, cols in ADDED_COLUMNS.items():
            have = {r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]).fetchall()}
            for col in cols:
                name, _, kind = col.partition(" ")
                if name not in have:         # quoted: `user` and `namespace` are SQL words
                    con.execute(f'ALTER TABLE {table} ADD COLUMN "{name}" {kind or "VARCHAR"}')
        hot_tables.make_views(con)
        con.execute("DELETE FROM metrics")
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)",
                        [(m.name, m.unit, m.kind.value, m.help) for m in cat.METRICS])
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])

    def _ours_or_empty(self) -> bool:
        """A file without gpuscope's schema mark: new and empty, or one of the first gpuscope's (its
        samples table keyed by host, gpu and t)."""
        tables = {r[0] for r in self._con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        if not tables:
            return True
        cols = {r[0] for r in self._con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples'").fetchall()}
        return {"host", "gpu", "t"} <= cols

    def _schema_written(self) -> int:
        """The schema version the file was last opened with (0: a new file)."""
        if not self._con.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'meta'").fetchall():
            return 0
        row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        try:
            return int(row[0][0]) if row else 0
        except ValueError:
            return 0

    def reader(self) -> duckdb.DuckDBPyConnection:
        cur, gen = getattr(self._local, "cursor", (None, -1))
        if cur is None or gen != self._generation:
            cur = self._con.cursor()
            self._local.cursor = (cur, self._generation)
        return cur

    # -- writes (writer thread only) -------------------------------------------------
    def begin(self) -> None:
        if self._owner is not None and self._generation != self._owner._generation:   # its owner reopened
            self._con = self._owner._con.cursor()
            self._generation = self._owner._generation
        self._con.execute("BEGIN TRANSACTION")

    def commit(self) -> None:
        self._con.execute("COMMIT")

    def rollback(self) -> None:
        try:
            self._con.execute("ROLLBACK")
        except duckdb.Error:
            pass

    @contextlib.contextmanager
    def transaction(self):
        """All or nothing: committed at the end of the block, rolled back
        if it raises."""
        self.begin()
        try:
            yield self._con
            self.commit()
        except BaseException:
            self.rollback()
            raise

    def append(self, table: str, rows: pa.Table, replace: bool = False) -> None:
        """Columnar insert; replace=True upserts on the table's primary key.
        (executemany costs ~100 us a row in DuckDB; an Arrow scan does not.
        A table concatenated from many batches is combined first: DuckDB
        scans 250 one-batch chunks ~18x slower than one.)"""
        rows = rows.combine_chunks()
        self._con.register("_incoming", rows)
        try:
            cols = ", ".join(f'"{c}"' for c in rows.column_names)
            verb = "INSERT OR REPLACE" if replace else "INSERT"
            self._con.execute(f"{verb} INTO {table} ({cols}) SELECT {cols} FROM _incoming")
        finally:
            try:
                self._con.unregister("_incoming")
            except duckdb.Error:   # an aborted transaction refuses this too; the INSERT's error is the one to see
                pass

    def _rows(self, table: str, names: Sequence[str], rows: Sequence[tuple], replace: bool = False) -> None:
        if rows:
            self.append(table, _arrow(names, rows), replace)

    def committed_seqs(self) -> dict[tuple[str, str], SeqSet]:
        """What each agent boot has stored. Files from before schema 4 kept
        only a high-water mark: everything up to it is taken as stored."""
        out = {}
        for h, b, max_seq, committed in self._con.execute(
                "SELECT host, boot_id, max_seq, committed FROM agents").fetchall():
            out[(h, b)] = (decode_ranges(committed) if committed is not None
                           else SeqSet([(1, int(max_seq))] if max_seq else []))
        return out

    def upsert_agents(self, rows: Sequence[tuple]) -> None:
        self._rows("agents", AGENT_COLUMNS, rows, replace=True)

    def upsert_devices(self, rows: Sequence[tuple]) -> None:
        self._rows("devices", DEVICE_COLUMNS, rows, replace=True)

    def insert_health(self, rows: Sequence[tuple]) -> None:
        self._rows("health", HEALTH_COLUMNS, rows)

    def insert_gpu_owners(self, rows: Sequence[tuple]) -> None:
        self._rows("gpu_owners", GPU_OWNER_COLUMNS, rows)

    def insert_windows(self, rows: Sequence[tuple]) -> None:
        self._rows("windows", WINDOW_COLUMNS, rows)

    def upsert_findings(self, rows: Sequence[tuple]) -> None:
        self._rows(hot_tables.hot("findings"), FINDING_COLUMNS, rows, replace=True)

    def insert_findings(self, rows: Sequence[tuple]) -> None:
        """Findings never stored before (ids.new_id): a plain insert, which
        costs DuckDB a fifth of an upsert into a table of a million rows."""
        self._rows(hot_tables.hot("findings"), FINDING_COLUMNS, rows)

    def upsert_capture(self, row: dict) -> None:
        self._rows("captures", CAPTURE_COLUMNS, [tuple(row.get(k) for k in CAPTURE_COLUMNS)], replace=True)

    def insert_anomalies(self, anomalies: Sequence[dict]) -> None:
        rows = [tuple(json.dumps(a[k], default=str) if k in ("kinds", "details") else a.get(k) for k in ANOMALY_COLUMNS)
                for a in anomalies]
        self._rows(hot_tables.hot("anomalies"), ANOMALY_COLUMNS, rows)      # made once, never changed: a plain insert

    def upsert_decisions(self, decisions: Sequence[dict]) -> None:
        """A decision's later states (finished, expired) replace its row."""
        self._rows(hot_tables.hot("decisions"), DECISION_COLUMNS, _decision_rows(decisions), replace=True)

    def insert_decisions(self, decisions: Sequence[dict]) -> None:
        """Decisions just made (ids.new_id): a plain insert, as insert_findings."""
        self._rows(hot_tables.hot("decisions"), DECISION_COLUMNS, _decision_rows(decisions))

    def add_calibration(self, calibration: dict, ceilings: Sequence[dict]) -> str:
        """Stores one checked calibration (analyzers/calibrations.py) and its
        ceilings; returns its id. Sending the same run again replaces it."""
        cid = hashlib.sha256(f"{calibration['uuid']}\0{calibration['started_at']!r}".encode()).hexdigest()[:16]
        with self.transaction():            # all or nothing: a half-stored run would stand as the GPU's current one
            self._con.execute("DELETE FROM ceilings WHERE calibration_id = ?", [cid])
            self._rows("calibrations", CALIBRATION_COLUMNS,
                       [tuple(cid if k == "id" else calibration.get(k) for k in CALIBRATION_COLUMNS)], replace=True)
            self._rows("ceilings", CEILING_COLUMNS,
                       [tuple(cid if k == "calibration_id" else c.get(k) for k in CEILING_COLUMNS) for c in ceilings])
        return cid

    def ceilings(self, host: str | None = None, model: str | None = None, uuid: str | None = None,
                 history: bool = False) -> list[dict]:
        """One dict per calibration, newest first, with its `ceilings` (dicts
        by measurement name); only each UUID's newest unless `history`.
        `model` matches a fragment of the GPU's name, case-insensitively."""
        where, args = [], []
        for col, v in (("host", host), ("uuid", uuid)):
            if v:
                where.append(f"c.{col} = ?")
                args.append(v)
        if model:
            where.append("contains(lower(c.model), lower(?))")
            args.append(model)
        latest = "" if history else ("QUALIFY row_number() OVER (PARTITION BY c.uuid "
                                     "ORDER BY c.started_at DESC, c.received DESC) = 1")
        cals = _dicts(self.reader().execute(
            f"SELECT c.* FROM calibrations c {'WHERE ' + ' AND '.join(where) if where else ''} {latest} "
            "ORDER BY c.host, c.gpu, c.started_at DESC", args))
        if not cals:
            return []
        ids = [c["id"] for c in cals]
        by: dict[str, dict] = {i: {} for i in ids}
        for r in _dicts(self.reader().execute(
                f"SELECT * FROM ceilings WHERE calibration_id IN ({', '.join('?' * len(ids))})", ids)):
            r["conditions"] = json.loads(r["conditions"]) if r["conditions"] else {}
            by[r.pop("calibration_id")][r["name"]] = r
        for c in cals:
            c["ceilings"] = by[c["id"]]
        return cals

    def measured_peaks(self, uuid: str) -> tuple[float | None, float | None, float] | None:
        """(HBM bytes/s, BF16 matmul FLOP/s, when measured) of a GPU's current
        calibration; None when it has none or it measured neither."""
        cals = self.ceilings(uuid=uuid)
        if not cals:
            return None
        hbm, flops = peaks_from(list(cals[0]["ceilings"].values()))
        return (hbm, flops, cals[0]["started_at"]) if hbm or flops else None

    def host_measured_peaks(self, host: str) -> dict[int, tuple[float | None, float | None, float]]:
        """GPU index -> measured_peaks of the GPU its agent says sits there
        (by UUID: a calibration follows the GPU, not the slot)."""
        rows = self.reader().execute("SELECT gpu, uuid FROM devices WHERE host = ? AND uuid <> ''", [host]).fetchall()
        return {int(g): p for g, u in rows if (p := self.measured_peaks(u)) is not None}

    def records(self, table: str, host: str = "", since: float = 0.0, limit: int = 200,
                finding_id: str | None = None) -> list[dict]:
        if table not in RECORD_TABLES:
            raise KeyError(table)
        where, args = _where_host_gpu(["t >= ?"], [since], host, None)
        if finding_id is not None:
            if table == "anomalies":
                where.append("finding_id = ?")
                args.append(finding_id)
            else:
                # a straggler's coordinated capture of its job is decided from the finding, not an anomaly
                # (Analyzer._trace_job): its reason names the finding
                where.append("(anomaly_id IN (SELECT id FROM anomalies WHERE finding_id = ?) "
                             "OR starts_with(reason, ?))")
                args += [finding_id, f"straggler {finding_id}: "]
        rows = _dicts(self.reader().execute(
            f"SELECT * FROM {table} WHERE {' AND '.join(where)} ORDER BY t DESC LIMIT ?", args + [limit]))
        for r in rows:
            for k in RECORD_TABLES[table]:
                r[k] = json.loads(r[k]) if r[k] else None
        return rows

    def finding(self, finding_id: str) -> dict | None:
        rows = _findings(self.reader().execute("SELECT * FROM findings WHERE id = ?", [finding_id]))
        return rows[0] if rows else None

    def finding_ids(self, prefix: str, limit: int = 6) -> list[str]:
        """Ids starting with `prefix` (people type the first few characters)."""
        return [r[0] for r in self.reader().execute(
            "SELECT id FROM findings WHERE starts_with(id, ?) ORDER BY id LIMIT ?", [prefix, limit]).fetchall()]

    def means(self, host: str, gpu: int, start: float, end: float, metrics: Sequence[str]) -> dict:
        """Mean of each metric for one GPU over [start, end), and the sample
        count; minutes already rolled up count with their sample counts (a
        minute's mean weighs as many samples as the minute had, whether or
        not a slow metric was read in each)."""
        ms = [m for m in metrics if m in cat.BY_NAME]
        cols = ", ".join(f'"{m}"' for m in ms)
        where = "host = ? AND gpu = ? AND t >= ? AND t < ?"
        args: list = [host, gpu, start, end]
        source = f"SELECT {cols}{', ' if ms else ''}1 AS n FROM samples WHERE {where}"
        if self._rolled_up_before(start):
            # a minute counts where its middle falls: a row's t is its minute's start,
            # and a finding of 12:00:10-12:00:40 must not see its minute as "before"
            source += (f" UNION ALL SELECT {cols}{', ' if ms else ''}samples AS n FROM samples_1m "
                       "WHERE host = ? AND gpu = ? AND t + 30 >= ? AND t + 30 < ?")
            args = args + args
        means = "".join(f', sum("{m}" * n) / sum(CASE WHEN "{m}" IS NOT NULL THEN n END) AS "{m}"' for m in ms)
        row = self.reader().execute(f"SELECT CAST(coalesce(sum(n), 0) AS BIGINT) AS samples{means} FROM ({source})",
                                    args)
        return _dicts(row)[0]

    def captures(self, host: str = "", limit: int = 100) -> list[dict]:
        where, args = _where_host_gpu([], [], host, None)
        sql = "SELECT * FROM captures" + (" WHERE " + " AND ".join(where) if where else "")
        return _dicts(self.reader().execute(sql + " ORDER BY start DESC LIMIT ?", args + [limit]))

    def open_findings(self, kind: str = "bottleneck") -> list[dict]:
        return _findings(self._con.execute(f'SELECT * FROM findings WHERE "end" IS NULL AND {_KIND}', [kind]))

    def windows_after(self, findings: list[dict]) -> dict[str, list[tuple[str, str, float]]]:
        """For open findings written before their latest windows (an extended
        finding is written every 30 s, a kill -9 comes at any time): the
        windows of each one's GPU that started at or after `absorbed_until`,
        oldest first, as (verdict, flags JSON, confidence), by finding id."""
        marks = [(f["id"], f["host"], f["gpu"], f["absorbed_until"]) for f in findings
                 if f.get("absorbed_until") is not None]
        if not marks:
            return {}
        self._con.register("_marks", pa.table(dict(zip(("id", "host", "gpu", "absorbed_until"), zip(*marks)))))
        try:
            rows = self._con.execute(
                # the constant lower bound lets DuckDB skip the older row groups of windows
                "SELECT m.id, w.verdict, w.flags, w.confidence FROM windows w JOIN _marks m "
                "ON w.host = m.host AND w.gpu = m.gpu AND w.start >= m.absorbed_until "
                "WHERE w.start >= ? ORDER BY m.id, w.start", [min(m[3] for m in marks)]).fetchall()
        finally:
            self._con.unregister("_marks")
        out: dict[str, list[tuple[str, str, float]]] = {}
        for fid, verdict, flags, confidence in rows:
            out.setdefault(fid, []).append((verdict, flags or "[]", float(confidence or 0.0)))
        return out

    def devices(self) -> list[dict]:
        return _dicts(self._con.execute("SELECT * FROM devices"))

    # -- queries (any thread) ------------------------------------------------------------
    def host_links(self, host: str) -> dict[int, tuple[int | None, int | None, str | None]]:
        """GPU -> (PCIe generation, width, name) of one host, as its agent said; the generation is the
        link's best where known (an idle link's Gen1 is power saving, not its line rate)."""
        rows = self.reader().execute("SELECT gpu, greatest(pcie_generation, pcie_max_generation), pcie_width, name "
                                     "FROM devices WHERE host = ?",
                                     [host]).fetchall()
        return {int(g): (gen, width, name) for g, gen, width, name in rows}

    def findings(self, host: str = "", gpu: int | None = None, verdicts: Iterable[str] = (),
                 start: float | None = None, end: float | None = None, open_only: bool = False,
                 limit: int = 1000, **owner) -> list[dict]:
        return finding_dicts(self.findings_table(host, gpu, verdicts, start, end, open_only, limit, **owner))

    def open_conditions(self, gpus: Sequence[tuple[str, int]] = ()) -> dict[tuple[str, int], list[dict]]:
        """The open findings that are not bottlenecks (degraded, regression),
        by GPU; of `gpus` only when given."""
        where, args = ['"end" IS NULL', f"NOT {BOTTLENECK}"], []
        if gpus:
            _where_gpus(where, args, gpus)
        out: dict[tuple[str, int], list[dict]] = {}
        for f in _findings(self.reader().execute(
                f"SELECT * FROM findings WHERE {' AND '.join(where)} ORDER BY host, gpu, start", args)):
            out.setdefault((f["host"], f["gpu"]), []).append(f)
        return out

    def findings_table(self, host: str = "", gpu: int | None = None, verdicts: Iterable[str] = (),
                       start: float | None = None, end: float | None = None, open_only: bool = False,
                       limit: int = 1000, flags: Iterable[str] = (), pod: str = "", namespace: str = "",
                       slurm_job: str = "", gpus: Sequence[tuple[str, int]] = (),
                       kinds: Iterable[str] = ()) -> pa.Table:
        """The matching rows as stored (JSON fields as text), newest first:
        DuckDB builds the table without the GIL, and `finding_dicts` turns it
        into rows wherever the caller is (the gRPC process, not this one).
        pod: a pod's name, or namespace/name; namespace, slurm_job: the
        job's, as its attribution says; gpus: (host, gpu) pairs, any of them;
        kinds: FINDING_KINDS, any of them (empty: all)."""
        where, args = _where_host_gpu([], [], host, gpu)
        kinds = list(kinds)
        if kinds:
            where.append(f"coalesce(kind, 'bottleneck') IN ({', '.join('?' * len(kinds))})")
            args.extend(kinds)
        if gpus:
            _where_gpus(where, args, gpus)
        if "/" in pod:
            namespace, pod = pod.split("/", 1)
        for label, value in (("pod", pod), ("namespace", namespace), ("slurm_job", slurm_job)):
            if value:
                where.append(f"{_LABEL.format(label)} = ?")
                args.append(value)
        verdicts = list(verdicts)
        if verdicts:
            where.append(f"verdict IN ({', '.join('?' * len(verdicts))})")
            args.extend(verdicts)
        _where_range(where, args, 'coalesce("end", 1e300)', "start", start, end)
        if open_only:
            where.append('"end" IS NULL')
        for flag in flags:            # flags are a JSON list of words: the quoted word is in the text
            where.append("contains(flags, ?)")
            args.append(json.dumps(flag))
        sql = "SELECT * FROM findings" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY start DESC, id DESC LIMIT ?"      # ties by id: the mirror orders the same way
        args.append(limit)
        return self._arrow(sql, args)

    def recent_findings(self, max_closed: int) -> tuple[list[tuple], float]:
        """Every open finding and the `max_closed` that ended last, as
        stored (FINDING_COLUMNS); and the end after which every closed
        finding is among them (-inf: all are). A FindingsMirror's start."""
        cols = ", ".join(f'"{c}"' for c in FINDING_COLUMNS)
        cur = self.reader()
        rows = cur.execute(f'SELECT {cols} FROM findings WHERE "end" IS NULL').fetchall()
        closed = cur.execute(f'SELECT {cols} FROM findings WHERE "end" IS NOT NULL ORDER BY "end" DESC LIMIT ?',
                             [max_closed]).fetchall()
        end = FINDING_COLUMNS.index("end")
        return rows + closed, closed[-1][end] if len(closed) == max_closed else -math.inf

    def _arrow(self, sql: str, params) -> pa.Table:
        """A query's result as Arrow, on a cursor of its own: a relation refuses a cursor whose
        last result was not read to the end (this thread's reader may hold one), and Arrow from
        execute() warns of an extra copy."""
        cur = self._con.cursor()
        try:
            rel = cur.sql(sql, params=params)
            return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()     # DuckDB 2, 1.x
        finally:
            cur.close()

    def top_bottlenecked(self, start: float, end: float, limit: int = 10, now: float | None = None,
                         host: str = "", by: str = "gpu") -> list[dict]:
        """GPUs (by="gpu"), or jobs, pods or Slurm jobs (by="job", "pod",
        "slurm-job": a job is a host's, as pids are; findings whose job's
        attribution names no pod or Slurm job are left out of those) with the
        most seconds in a bottleneck (any verdict but idle) over [start, end],
        most first. `main_verdict` is the verdict with the most of those
        seconds (`verdicts` has each one's); the job, attribution, summary,
        confidence, flags and id are those of its longest finding, and
        `group` the key grouped by."""
        if by != "gpu" and by not in FINDING_GROUPS:
            raise ValueError(f"by: {by!r}, expected gpu, {', '.join(FINDING_GROUPS)}")
        now = end if now is None else now
        where, args = ["verdict <> 'idle'", BOTTLENECK, "start <= ?", 'coalesce("end", ?) >= ?'], [end, now, start]
        if host:
            where.append("host = ?")
            args.append(host)
        keys = ", ".join(f"m.{c}" for c in (("host", "gpu") if by == "gpu" else ('"group"',)))
        k = keys.replace("m.", "")
        same = " AND ".join(f"f.{c} IS NOT DISTINCT FROM m.{c}" for c in k.split(", "))
        sql = f"""
            WITH f0 AS (SELECT *, least(coalesce("end", ?), ?) - greatest(start, ?) AS overlap,
                               {"NULL" if by == "gpu" else FINDING_GROUPS[by]} AS "group"
                        FROM findings WHERE {' AND '.join(where)}),
            f AS (SELECT * FROM f0 {'' if by == 'gpu' else 'WHERE "group" IS NOT NULL'}),
            per AS (SELECT {k}, verdict, sum(overlap) AS secs FROM f GROUP BY {k}, verdict),
            m AS (SELECT {k}, sum(secs) AS bottleneck_seconds, arg_max(verdict, (secs, verdict)) AS main_verdict,
                         list({{'verdict': verdict, 'seconds': secs}} ORDER BY secs DESC, verdict) AS verdicts
                  FROM per GROUP BY {k})
            SELECT any_value(m.bottleneck_seconds) AS bottleneck_seconds, any_value(m.main_verdict) AS main_verdict,
                   any_value(m.verdicts) AS verdicts, any_value(f."group") AS "group", count(*) AS findings,
                   count(DISTINCT (f.host, f.gpu)) AS gpus,
                   -- one finding's fields, never a mix of several: the main verdict's longest
                   -- (ties broken by the latest start, then id)
                   arg_max({{'host': f.host, 'gpu': f.gpu, 'job': f.job, 'id': f.id, 'summary': f.summary,
                             'confidence': f.confidence, 'flags': f.flags, 'attribution': f.attribution}},
                           (f.verdict = m.main_verdict, overlap, start, id)) AS longest
            FROM f JOIN m ON {same}
            GROUP BY {keys} ORDER BY bottleneck_seconds DESC, {keys} LIMIT ?"""
        out = []
        for r in _dicts(self.reader().execute(sql, [now, end, start] + args + [limit])):
            longest = r["longest"]
            out.append(dict(host=longest["host"], gpu=longest["gpu"], bottleneck_seconds=r["bottleneck_seconds"],
                            main_verdict=r["main_verdict"], verdicts=r["verdicts"], findings=r["findings"],
                            gpus=r["gpus"], job=longest["job"], finding_id=longest["id"],
                            summary=longest["summary"], confidence=longest["confidence"], group=r.get("group"),
                            attribution=_json_dict(longest["attribution"]),
                            flags=json.loads(longest["flags"]) if longest["flags"] else []))
        return out

    def metric(self, metric: str, host: str, gpu: int | None, start: float, end: float,
               aggregate: str, step: float, rate: bool = False, group_by: str = "") -> list[dict]:
        """A metric's series or aggregate per GPU; `rate`: a counter's
        increase per second between consecutive samples instead of its
        running total, each placed at the later sample (wraps and resets as
        collectors/counters.py reads them). group_by ("job", "pod",
        "slurm-job"): per group instead, each row with its `group` and the
        `gpus` it pooled (see `_grouped`)."""
        m = cat.BY_NAME.get(metric)
        if m is None:
            raise KeyError(metric)
        if group_by and group_by not in PROCESS_GROUPS:
            raise ValueError(f"group_by: {group_by!r}, expected {', '.join(PROCESS_GROUPS)}")
        col = f'"{metric}"'
        where, args = _where_host_gpu(["t BETWEEN ? AND ?", f"{col} IS NOT NULL"], [start, end], host, gpu)
        w = " AND ".join(where)
        source = f"SELECT host, gpu, t, {col} AS v, 1 AS n FROM samples WHERE {w}"
        if self._rolled_up_before(start) and not group_by:     # rolled-up minutes keep no processes to group by
            # minutes rolled up count with their sample counts as weights; min,
            # max, quantiles and last of the old part are those of minute means
            source += f" UNION ALL SELECT host, gpu, t, {col} AS v, samples AS n FROM samples_1m WHERE {w}"
            args = args + args
        if rate:
            # collectors/counters.py's rule, in SQL: a drop from below the counter's span is a wrap
            # unless it implies more than half the span moved; any other drop is a reset, and the
            # interval it falls in has no rate
            span = float(2 ** m.wrap_bits) if m.wrap_bits else None
            grown = ("CASE WHEN v >= pv THEN v - pv "
                     + (f"WHEN pv < {span!r} AND v - pv + {span!r} <= {span / 2!r} THEN v - pv + {span!r} " if span
                        else "") + "END")
            source = (f"SELECT host, gpu, t, ({grown}) / (t - pt) AS v, 1 AS n FROM (SELECT host, gpu, t, v, "
                      f"lag(v) OVER w AS pv, lag(t) OVER w AS pt FROM ({source}) "
                      f"WINDOW w AS (PARTITION BY host, gpu ORDER BY t)) WHERE t > pt AND ({grown}) IS NOT NULL")
        if aggregate == "series":
            # a bitmask's bucket holds every bit set in it: a mean of bits names reasons that never were
            value = ("CAST(bit_or(CAST(v AS UBIGINT)) AS DOUBLE)" if m.unit == "bitmask" and not rate
                     else "sum(v * n) / sum(n)")
        else:
            value = "sum(v * n) / sum(n)" if aggregate == "mean" else AGGREGATES[aggregate].format(m="v")
        if group_by:
            return self._grouped(source, args, group_by, value, aggregate == "series", step, host, gpu, start, end)
        if aggregate == "series":      # the step is a parameter: floats never become SQL text
            sql = (f"SELECT host, gpu, floor(t / ?) * ? AS bucket, {value} AS value, "
                   f"CAST(sum(n) AS BIGINT) AS n FROM ({source}) GROUP BY ALL ORDER BY host, gpu, bucket")
            args = [step, step] + args
        else:
            sql = (f"SELECT host, gpu, {value} AS value, CAST(sum(n) AS BIGINT) AS n "
                   f"FROM ({source}) GROUP BY ALL ORDER BY host, gpu")
        return _dicts(self.reader().execute(sql, args))

    def _grouped(self, source: str, args: list, group_by: str, value: str, series: bool, step: float,
                 host: str, gpu: int | None, start: float, end: float) -> list[dict]:
        """A metric pooled by group: a sample belongs to the group of its
        GPU's job at that sample (the process holding the most memory, as
        ingest names a GPU's job), whose attribution may not name one (then
        the sample is in no group). A job is a host's process (`host pid:N
        command`); a pod or Slurm job may span GPUs and hosts, and its row's
        host is the first of them."""
        pw, pargs = _where_host_gpu(["t BETWEEN ? AND ?"], [start, end], host, gpu)
        owners = (f"SELECT host, gpu, t, arg_max_null({PROCESS_GROUPS[group_by]}, "
                  f"(coalesce(used_memory_bytes, 0), pid)) AS grp FROM processes WHERE {' AND '.join(pw)} "
                  f"GROUP BY host, gpu, t")
        joined = (f"SELECT s.host, s.gpu, s.t, s.v, s.n, o.grp FROM ({source}) s JOIN ({owners}) o "
                  f"ON s.host = o.host AND s.gpu = o.gpu AND s.t = o.t WHERE o.grp IS NOT NULL "
                  # GPUs whose source names the owner and lists no process: the batch's times
                  f"UNION ALL SELECT s.host, s.gpu, s.t, s.v, s.n, {OWNER_GROUPS[group_by]} AS grp "
                  f"FROM ({source}) s JOIN gpu_owners o ON s.host = o.host AND s.gpu = o.gpu "
                  f"AND s.t BETWEEN o.t_start AND o.t_end WHERE {OWNER_GROUPS[group_by]} IS NOT NULL")
        args = args + pargs + args
        pooled = "g AS (SELECT grp, min(host) AS host, count(DISTINCT (host, gpu)) AS gpus FROM j GROUP BY grp)"
        if series:
            sql = (f"WITH j AS ({joined}), {pooled} SELECT g.host, 0 AS gpu, j.grp AS \"group\", g.gpus, "
                   f"floor(j.t / ?) * ? AS bucket, {value} AS value, CAST(sum(n) AS BIGINT) AS n "
                   f"FROM j JOIN g ON j.grp = g.grp GROUP BY ALL ORDER BY \"group\", bucket")
            params = args + [step, step]
        else:
            sql = (f"WITH j AS ({joined}) SELECT min(host) AS host, 0 AS gpu, grp AS \"group\", "
                   f"count(DISTINCT (host, gpu)) AS gpus, {value} AS value, CAST(sum(n) AS BIGINT) AS n "
                   f"FROM j GROUP BY grp ORDER BY \"group\"")
            params = args
        return _dicts(self.reader().execute(sql, params))

    # -- a time range drawn (analyzers/report.py, build_range_report) --------------------
    def gpus_in_range(self, start: float, end: float, host: str = "", gpu: int | None = None) -> list[dict]:
        """GPUs with samples in [start, end] (rolled-up minutes included):
        host, gpu, name (as its agent said), samples, and bottleneck_seconds
        (judged windows in any verdict but idle, within the range)."""
        where, args = _where_host_gpu(["t BETWEEN ? AND ?"], [start, end], host, gpu)
        w = " AND ".join(where)
        seen = f"SELECT host, gpu, 1 AS n FROM samples WHERE {w}"
        if self._rolled_up_before(start):
            seen += f" UNION ALL SELECT host, gpu, samples AS n FROM samples_1m WHERE {w}"
            args = args + args
        ww, wargs = _where_host_gpu(['"end" >= ?', "start <= ?", "verdict <> 'idle'"], [start, end], host, gpu)
        sql = (f"WITH s AS (SELECT host, gpu, CAST(sum(n) AS BIGINT) AS samples FROM ({seen}) GROUP BY ALL), "
               f"b AS (SELECT host, gpu, sum(least(\"end\", ?) - greatest(start, ?)) AS secs FROM windows "
               f"WHERE {' AND '.join(ww)} GROUP BY ALL) "
               "SELECT s.host, s.gpu, d.name, s.samples, coalesce(b.secs, 0.0) AS bottleneck_seconds FROM s "
               "LEFT JOIN b ON s.host = b.host AND s.gpu = b.gpu "
               "LEFT JOIN devices d ON s.host = d.host AND s.gpu = d.gpu ORDER BY s.host, s.gpu")
        return _dicts(self.reader().execute(sql, args + [end, start] + wargs))

    def sample_extent(self, host: str = "", gpu: int | None = None) -> tuple[float, float] | None:
        """The first and last sample time (raw or rolled up) of a host, a GPU
        or the fleet; None when there is none."""
        where, args = _where_host_gpu([], [], host, gpu)
        w = (" WHERE " + " AND ".join(where)) if where else ""
        row = self.reader().execute(
            f"SELECT least((SELECT min(t) FROM samples{w}), (SELECT min(t) FROM samples_1m{w})), "
            f"greatest((SELECT max(t) FROM samples{w}), (SELECT max(t) FROM samples_1m{w}))", args * 4).fetchone()
        return None if row[0] is None else (float(row[0]), float(row[1]))

    def window_counts(self, start: float, end: float, gpus: Sequence[tuple[str, int]]) -> int:
        """The most judged windows any of `gpus` has in [start, end]."""
        if not gpus:
            return 0
        where, args = _where_gpus(['"end" >= ?', "start <= ?"], [start, end], gpus)
        row = self.reader().execute(f"SELECT max(n) FROM (SELECT count(*) AS n FROM windows WHERE "
                                    f"{' AND '.join(where)} GROUP BY host, gpu)", args).fetchone()
        return int(row[0] or 0)

    def verdict_windows(self, start: float, end: float, gpus: Sequence[tuple[str, int]],
                        step: float | None = None) -> list[dict]:
        """Judged windows of `gpus` overlapping [start, end], in time order:
        host, gpu, start, end, verdict, flags (a JSON list). With `step`, one
        row per GPU and step-wide bucket instead (a window counts in the
        bucket it starts in): the verdict that held most of the bucket's
        seconds, and each flag that held half of them or more."""
        if not gpus:
            return []
        where, args = _where_gpus(['"end" >= ?', "start <= ?"], [start, end], gpus)
        w = " AND ".join(where)
        if step is None:
            return _dicts(self.reader().execute(
                f'SELECT host, gpu, start, "end", verdict, flags FROM windows WHERE {w} ORDER BY host, gpu, start',
                args))
        flagged = ", ".join(f"""sum(CASE WHEN contains(flags, '"{f}"') THEN secs END) >= sum(secs) / 2 AS "{f}" """
                            for f in DRAWN_FLAGS)
        flag_cols = ", ".join(f'f."{f}"' for f in DRAWN_FLAGS)
        sql = (f"WITH per AS (SELECT host, gpu, floor(start / ?) AS b, verdict, flags, \"end\" - start AS secs "
               f"FROM windows WHERE {w}), "
               "v AS (SELECT host, gpu, b, verdict, sum(secs) AS vs FROM per GROUP BY ALL), "
               "top AS (SELECT host, gpu, b, arg_max(verdict, (vs, verdict)) AS verdict FROM v GROUP BY ALL), "
               f"f AS (SELECT host, gpu, b, {flagged} FROM per GROUP BY ALL) "
               f"SELECT top.host, top.gpu, top.b * ? AS start, (top.b + 1) * ? AS \"end\", top.verdict, "
               f"{flag_cols} FROM top JOIN f USING (host, gpu, b) "
               "ORDER BY top.host, top.gpu, top.b")
        rows = _dicts(self.reader().execute(sql, [step] + args + [step, step]))
        for r in rows:
            r["flags"] = json.dumps([f for f in DRAWN_FLAGS if r.pop(f)])
        return rows

    def series(self, metrics: Sequence[str], start: float, end: float, step: float,
               gpus: Sequence[tuple[str, int]]) -> list[dict]:
        """Bucketed means of several gauges of `gpus` in one scan: host, gpu,
        bucket (its start), n (samples in it) and one column per metric
        (rolled-up minutes weigh as the samples they had)."""
        ms = [m for m in metrics if m in cat.BY_NAME]
        if not gpus or not ms:
            return []
        cols = ", ".join(f'"{m}"' for m in ms)
        where, args = _where_gpus(["t BETWEEN ? AND ?"], [start, end], gpus)
        w = " AND ".join(where)
        source = f"SELECT host, gpu, t, {cols}, 1 AS n FROM samples WHERE {w}"
        if self._rolled_up_before(start):
            source += f" UNION ALL SELECT host, gpu, t, {cols}, samples AS n FROM samples_1m WHERE {w}"
            args = args + args
        means = ", ".join(f'sum("{m}" * n) / sum(CASE WHEN "{m}" IS NOT NULL THEN n END) AS "{m}"' for m in ms)
        sql = (f"SELECT host, gpu, floor(t / ?) * ? AS bucket, CAST(sum(n) AS BIGINT) AS n, {means} "
               f"FROM ({source}) GROUP BY ALL ORDER BY host, gpu, bucket")
        return _dicts(self.reader().execute(sql, [step, step] + args))

    def captures_between(self, start: float, end: float, host: str = "", limit: int = 100) -> list[dict]:
        """Captures that ran within [start, end] (by their start and end), oldest first."""
        where, args = _where_host_gpu([], [], host, None)
        _where_range(where, args, 'coalesce("end", start)', "start", start, end)
        sql = "SELECT * FROM captures WHERE " + " AND ".join(where) + " ORDER BY start LIMIT ?"
        return _dicts(self.reader().execute(sql, args + [limit]))

    def count(self, table: str) -> int:
        return int(self.reader().execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def close(self) -> None:
        self._close_siblings()
        try:
            self._con.close()
        except duckdb.Error:
            pass

    # == Lifecycle and retention (analyzers/retention.py, Analyzer start-up) ==============
    # Samples older than the retention horizon become one row per GPU-minute in
    # samples_1m (every metric's mean, and the count of samples) and are deleted,
    # one bounded chunk per transaction on the writer thread. A minute is either
    # raw or rolled up, never both, so a query may union the two without counting
    # anything twice.
    _rollup_end: Any = None            # end of the newest rolled-up minute; None: unknown yet
    _rollup_end_known = False
    _rollup_columns_checked = False
    GPU_STATE_COLUMNS = ("host", "gpu", "verdict", "confidence", "flags", "last_window_end", "last_sample",
                         "last_arrival", "written")

    def ensure_rollup_columns(self) -> None:
        """Metrics added to the catalogue after samples_1m was created become
        columns of it too (writer thread, or before it starts)."""
        if self._rollup_columns_checked:
            return
        have = {r[0] for r in self._con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples_1m'").fetchall()}
        for m in cat.METRICS:
            if m.name not in have:
                self._con.execute(f'ALTER TABLE samples_1m ADD COLUMN "{m.name}" DOUBLE')
        self._rollup_columns_checked = True

    def oldest_before(self, horizon: float) -> float | None:
        """The oldest time older than the horizon in samples, processes, health
        or windows; None when nothing is. Zone maps skip the newer row groups."""
        row = self._con.execute(
            'SELECT least((SELECT min(t) FROM samples WHERE t < $h), (SELECT min(t) FROM processes WHERE t < $h), '
            '(SELECT min(t) FROM health WHERE t < $h), (SELECT min("end") FROM windows WHERE "end" < $h))',
            {"h": horizon}).fetchall()[0]
        return None if row[0] is None else float(row[0])

    def retention_chunk(self, lo: float, hi: float, rollup: bool) -> dict:
        """One transaction: samples with t < hi rolled up by minute (merged with
        minutes already rolled up, for late samples) and deleted; processes,
        health and windows older than hi deleted. lo and hi are whole minutes
        and lo is at or before the oldest sample, so the chunk holds [lo, hi)."""
        con = self._con
        out = dict(samples_deleted=0, minutes_written=0, processes_deleted=0, health_deleted=0,
                   windows_deleted=0)
        with self.transaction():
            if rollup:
                self.ensure_rollup_columns()
                names = [m.name for m in cat.METRICS]
                means = ", ".join(f'avg("{n}") AS "{n}"' for n in names)
                old = ", ".join(f'"{n}"' for n in names)
                merged = ", ".join(f'sum("{n}" * n) / sum(CASE WHEN "{n}" IS NOT NULL THEN n END) AS "{n}"'
                                   for n in names)
                # One row per (host, gpu, minute) on either side of the union in
                # the usual case, where the merge is exact (x * n / n).
                con.execute(
                    f"CREATE OR REPLACE TEMP TABLE _rollup AS SELECT host, gpu, t, sum(n) AS samples, {merged} "
                    f"FROM (SELECT host, gpu, floor(t / 60) * 60 AS t, count(*) AS n, {means} "
                    f"      FROM samples WHERE t < $hi GROUP BY ALL "
                    f"      UNION ALL "
                    f"      SELECT host, gpu, t, samples AS n, {old} FROM samples_1m WHERE t >= $lo AND t < $hi) "
                    f"GROUP BY host, gpu, t", {"lo": lo, "hi": hi}).fetchall()
                con.execute("DELETE FROM samples_1m WHERE t >= $lo AND t < $hi", {"lo": lo, "hi": hi}).fetchall()
                out["minutes_written"] = int(con.execute(
                    "INSERT INTO samples_1m BY NAME SELECT * FROM _rollup ORDER BY t, host, gpu").fetchall()[0][0])
                con.execute("DROP TABLE _rollup").fetchall()
                con.execute("INSERT OR REPLACE INTO meta VALUES ('rollup_end', CAST(greatest(? , coalesce("
                            "(SELECT CAST(value AS DOUBLE) FROM meta WHERE key = 'rollup_end'), 0)) AS VARCHAR))",
                            [hi]).fetchall()
            out["samples_deleted"] = int(con.execute("DELETE FROM samples WHERE t < ?", [hi]).fetchall()[0][0])
            out["processes_deleted"] = int(con.execute("DELETE FROM processes WHERE t < ?", [hi]).fetchall()[0][0])
            con.execute("DELETE FROM gpu_owners WHERE t_end < ?", [hi]).fetchall()
            out["health_deleted"] = int(con.execute("DELETE FROM health WHERE t < ?", [hi]).fetchall()[0][0])
            out["windows_deleted"] = int(con.execute('DELETE FROM windows WHERE "end" < ?', [hi]).fetchall()[0][0])
        if rollup and out["minutes_written"] and self._rollup_end_known:
            self._rollup_end = max(self._rollup_end or hi, hi)   # unknown: read on the next query
        return out

    def prune_bookkeeping(self, horizon: float) -> dict:
        """Agent boots last seen before the horizon, unless the newest boot of
        their host; devices not seen since the horizon."""
        con = self._con
        with self.transaction():
            agents = con.execute(
                "DELETE FROM agents WHERE last_seen < ? AND boot_id <> "
                "(SELECT arg_max(a.boot_id, a.last_seen) FROM agents a WHERE a.host = agents.host)",
                [horizon]).fetchall()[0][0]
            devices = con.execute("DELETE FROM devices WHERE last_seen < ?", [horizon]).fetchall()[0][0]
            con.execute("DELETE FROM gpu_state WHERE last_arrival < ?", [horizon]).fetchall()
        return dict(agents_deleted=int(agents), devices_deleted=int(devices))

    def move_to_history(self, cut: float, limit: int = hot_tables.MOVE_ROWS) -> dict[str, int]:
        """One transaction of hot_tables.move: rows moved by table."""
        with self.transaction():
            moved = hot_tables.move(self._con, cut, limit)
        return moved

    def prune_history(self, horizon: float) -> dict:
        """The long horizon: per-minute rollups, closed findings, anomalies,
        decisions, captures and verdict pairs older than it."""
        con = self._con
        out = {}
        with self.transaction():
            for table, where in (("samples_1m", "t < ?"), ("findings", '"end" IS NOT NULL AND "end" < ?'),
                                 ("anomalies", "t < ?"), ("decisions", "coalesce(updated, t) < ?"),
                                 ("captures", 'coalesce("end", start) < ?'), ("verdict_pairs", "t < ?"),
                                 ("program_runs", '"end" < ?')):
                # a view's rows are deleted from both its tables
                parts = [hot_tables.hot(table), hot_tables.history(table)] if table in hot_tables.MOVABLE else [table]
                out[f"{table}_deleted"] = sum(int(con.execute(f"DELETE FROM {part} WHERE {where}",
                                                              [horizon]).fetchall()[0][0]) for part in parts)
        return out

    # == The fleet tier (analyzers/publish.py) ============================================
    # What the publisher exports, read on a reader cursor: DuckDB's MVCC gives it a snapshot
    # while the writer commits, so ingest never waits for it. One range is at most an hour.
    def fleet_rows(self, table: str, lo: float, hi: float) -> pa.Table:
        """Rows of a fleet table whose time is in [lo, hi), with `host`
        (the publisher partitions by it and drops it from the file)."""
        sql = {"rollups": self._fleet_rollups_sql, "findings": self._fleet_findings_sql,
               "captures": self._fleet_captures_sql}[table]()
        return self._arrow(sql, {"lo": lo, "hi": hi})

    def _fleet_rollups_sql(self) -> str:
        # Each GPU-minute: every metric's mean over raw samples and minutes retention rolled up
        # (a minute is either, but merged by sample count as retention merges late samples), and
        # the finding holding the minute's middle: its verdict, job and whose the job is.
        names = [m.name for m in cat.METRICS]
        means = ", ".join(f'avg("{n}") AS "{n}"' for n in names)
        old = ", ".join(f'"{n}"' for n in names)
        merged = ", ".join(f'sum("{n}" * n) / sum(CASE WHEN "{n}" IS NOT NULL THEN n END) AS "{n}"' for n in names)
        label = "json_extract_string(f.attribution, '$.{}')"
        return f"""
            WITH m AS (
              SELECT host, gpu, t, CAST(sum(n) AS BIGINT) AS samples, {merged}
              FROM (SELECT host, gpu, floor(t / 60) * 60 AS t, count(*) AS n, {means}
                    FROM samples WHERE t >= $lo AND t < $hi GROUP BY ALL
                    UNION ALL
                    SELECT host, gpu, t, samples AS n, {old} FROM samples_1m WHERE t >= $lo AND t < $hi)
              GROUP BY host, gpu, t),
            f AS (SELECT host, gpu, start, coalesce("end", 'infinity'::DOUBLE) AS fin, id, verdict, job, attribution
                  FROM findings WHERE start < $hi AND coalesce("end", 'infinity'::DOUBLE) >= $lo AND {BOTTLENECK})
            SELECT m.host, m.gpu, m.t, m.samples, f.verdict, f.job, f.id AS finding_id,
                   {label.format('namespace')} AS namespace, {label.format('pod')} AS pod,
                   {label.format('slurm_job')} AS slurm_job, {', '.join(f'm."{n}"' for n in names)}
            FROM m LEFT JOIN f ON f.host = m.host AND f.gpu = m.gpu AND f.start <= m.t + 30 AND m.t + 30 < f.fin
            QUALIFY row_number() OVER (PARTITION BY m.host, m.gpu, m.t ORDER BY f.start DESC NULLS LAST) = 1
            ORDER BY m.host, m.t, m.gpu"""

    @staticmethod
    def _fleet_findings_sql() -> str:
        # closed findings, by when they closed: an open one still changes
        label = "json_extract_string(attribution, '$.{}')"
        cols = ", ".join(f'"{c}"' for c in FINDING_COLUMNS if c not in ("absorbed_until",))
        return (f"SELECT {cols}, {label.format('namespace')} AS namespace, {label.format('pod')} AS pod, "
                f"{label.format('slurm_job')} AS slurm_job FROM findings "
                f'WHERE "end" >= $lo AND "end" < $hi ORDER BY host, "end", id')

    @staticmethod
    def _fleet_captures_sql() -> str:
        cols = ", ".join(f'"{c}"' for c in CAPTURE_COLUMNS if c != "end")
        return (f'SELECT {cols}, coalesce("end", start) AS "end" FROM captures '
                f'WHERE coalesce("end", start) >= $lo AND coalesce("end", start) < $hi ORDER BY host, "end", id')

    def upsert_verdict_pair(self, row: dict) -> None:
        self._rows("verdict_pairs", VERDICT_PAIR_COLUMNS, [tuple(row.get(k) for k in VERDICT_PAIR_COLUMNS)],
                   replace=True)

    def verdict_pairs(self, start: float | None = None, end: float | None = None, host: str = "") -> list[dict]:
        """(model, counters_verdict, trace_verdict, pairs) over [start, end]."""
        where, args = _where_host_gpu([], [], host, None)
        _where_range(where, args, "t", "t", start, end)
        sql = ("SELECT coalesce(model, '') AS model, counters_verdict, trace_verdict, count(*) AS pairs "
               "FROM verdict_pairs" + (" WHERE " + " AND ".join(where) if where else "")
               + " GROUP BY ALL ORDER BY model, counters_verdict, trace_verdict")
        return _dicts(self.reader().execute(sql, args))

    def degraded_inputs(self, start: float, end: float) -> pa.Table:
        """One row per GPU the agents describe, for `degraded.find_degraded`:
        its model, its current calibration's ceilings (by UUID: they follow
        the GPU), the SM clock it holds at its power limit over [start, end),
        of the GPUs heard from since `start` (a host out of service is no one's peer),
        and its PCIe link against the link it can train to: the best link its
        agent saw while the GPU was busy (an idle link rests at Gen1; a GPU
        never seen busy has no generation to judge, and its width as read).
        Peers are of one model and driver, the driver as the agent says it
        now (a GPU whose agent does not say is grouped with the others that do not)."""
        return self._arrow(f"""
            WITH clocks AS ({clocks_at_power_sql("samples", in_range=True)}),
            measured AS ({_CURRENT_CEILINGS})
            SELECT d.host, d.gpu, d.uuid, d.name AS model, coalesce(d.driver_version, '') AS driver,
                   d.pcie_busy_generation AS pcie_generation, coalesce(d.pcie_busy_width, d.pcie_width) AS pcie_width,
                   d.pcie_max_generation, d.pcie_max_width,
                   c.sm_clock_at_power_hertz, m.hbm_bytes_per_s, m.tensor_flops_per_s, m.pcie_h2d_bytes_per_s,
                   m.nvlink_d2d_bytes_per_s
            FROM devices d LEFT JOIN clocks c USING (host, gpu) LEFT JOIN measured m ON m.uuid = d.uuid
            WHERE NOT coalesce(d.lost, false) AND d.name <> '' AND d.last_seen >= $start""", dict(start=start, end=end))

    def measured_hbm(self) -> dict[str, float]:
        """UUID -> the HBM ceiling its current calibration measured, bytes/s
        (what live windows set DRAM activity against)."""
        rows = self.reader().execute(f"SELECT uuid, hbm_bytes_per_s FROM ({_CURRENT_CEILINGS}) "
                                     "WHERE hbm_bytes_per_s > 0").fetchall()
        return {u: float(v) for u, v in rows}

    def upsert_gpu_state(self, rows: Sequence[tuple]) -> None:
        self._rows("gpu_state", self.GPU_STATE_COLUMNS, rows, replace=True)

    def gpu_states(self) -> list[dict]:
        return _dicts(self._con.execute("SELECT * FROM gpu_state"))

    def latest_windows(self, since: float | None = None) -> list[dict]:
        """The newest judged window of each GPU (among those ending at or
        after `since`: zone maps skip older row groups)."""
        where, args = ('WHERE "end" >= ?', [since]) if since is not None else ("", [])
        return _dicts(self._con.execute(
            'SELECT host, gpu, arg_max(verdict, "end") AS verdict, arg_max(confidence, "end") AS confidence, '
            f'arg_max(flags, "end") AS flags, max("end") AS "end" FROM windows {where} GROUP BY host, gpu', args))

    def last_samples(self, since: float | None = None) -> dict[tuple[str, int], float]:
        """The newest sample time of each GPU (among those at or after `since`)."""
        where, args = ("WHERE t >= ?", [since]) if since is not None else ("", [])
        rows = self._con.execute(f"SELECT host, gpu, max(t) FROM samples {where} GROUP BY ALL", args).fetchall()
        return {(h, int(g)): float(t) for h, g, t in rows}

    def hosts_last_seen(self) -> dict[str, float]:
        """When each host's agent last committed a batch, on the analyzer's clock."""
        return {h: float(t) for h, t in self._con.execute(
            "SELECT host, max(last_seen) FROM agents GROUP BY host").fetchall() if t is not None}

    def sample_rows(self) -> tuple[int, int]:
        """Rows in samples and in samples_1m (start-up; the analyzer keeps
        the counts up to date from then on)."""
        raw = self._con.execute("SELECT count(*) FROM samples").fetchall()[0][0]
        rolled = self._con.execute("SELECT count(*) FROM samples_1m").fetchall()[0][0]
        return int(raw), int(rolled)

    def _rolled_up_before(self, start: float) -> bool:
        if not self._rollup_end_known:     # kept in meta: samples_1m may hold a year of the fleet
            rows = self.reader().execute("SELECT value FROM meta WHERE key = 'rollup_end'").fetchall()
            self._rollup_end = float(rows[0][0]) if rows else None
            self._rollup_end_known = True
        end = self._rollup_end
        return end is not None and start < end


    # == Program runs (analyzers/programs.py) ===============================================
    def meta_float(self, key: str) -> float | None:
        rows = self.reader().execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()
        return float(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: float) -> None:
        self._con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, repr(value)])

    def process_presence(self, lo: float, hi: float) -> list[dict]:
        """Each (host, pid, command) the agents listed in (lo, hi]: its GPUs,
        first and last time, and its attribution labels."""
        labels = ", ".join(f'any_value("{f}") FILTER (WHERE "{f}" IS NOT NULL AND "{f}" <> \'\') AS "{f}"'
                           for f in ATTRIBUTION_FIELDS)
        return _dicts(self.reader().execute(
            f"SELECT host, pid, coalesce(command, '') AS command, list(DISTINCT gpu ORDER BY gpu) AS gpus, "
            f"min(t) AS first, max(t) AS last, {labels} FROM processes WHERE t > ? AND t <= ? GROUP BY ALL",
            [lo, hi]))

    def process_signatures(self, lo: float, hi: float, metrics: Sequence[str]) -> list[dict]:
        """Per (host, pid, command): sums and counts of `metrics` over the
        samples in (lo, hi] of its GPUs while it held them alone (a span two
        processes of one GPU share says nothing of either), and its windows'
        verdicts there (verdict -> count, as JSON)."""
        sums = ", ".join(f'sum(s."{m}") AS "sum_{m}", count(s."{m}") AS "n_{m}"' for m in metrics)
        cols = "s.host, s.gpu, s.t, " + ", ".join(f's."{m}"' for m in metrics)
        return _dicts(self.reader().execute(f"""
            WITH pg AS (SELECT host, gpu, pid, coalesce(command, '') AS command, min(t) AS first, max(t) AS last
                        FROM processes WHERE t > $lo AND t <= $hi GROUP BY ALL),
            shared AS (SELECT a.host, a.gpu, greatest(a.first, b.first) AS lo, least(a.last, b.last) AS hi
                       FROM pg a JOIN pg b ON a.host = b.host AND a.gpu = b.gpu AND (a.pid, a.command) < (b.pid, b.command)
                            AND a.first <= b.last AND b.first <= a.last),
            shared_gpus AS (SELECT DISTINCT host, gpu FROM shared),
            -- most GPUs had one process at a time: only the few that had two look for shared spans
            alone AS (SELECT {cols} FROM samples s ANTI JOIN shared_gpus USING (host, gpu)
                      WHERE s.t > $lo AND s.t <= $hi
                      UNION ALL
                      SELECT {cols} FROM samples s SEMI JOIN shared_gpus USING (host, gpu)
                      WHERE s.t > $lo AND s.t <= $hi AND NOT EXISTS (
                          SELECT 1 FROM shared x WHERE x.host = s.host AND x.gpu = s.gpu AND s.t >= x.lo AND s.t <= x.hi)),
            sig AS (SELECT a.host, a.pid, a.command, {sums}
                    FROM pg a JOIN alone s ON s.host = a.host AND s.gpu = a.gpu AND s.t >= a.first AND s.t <= a.last
                    GROUP BY ALL),
            ver AS (SELECT host, pid, command, to_json(map(list(verdict), list(n))) AS verdicts FROM (
                        SELECT a.host, a.pid, a.command, w.verdict, count(*) AS n
                        FROM pg a JOIN windows w ON w.host = a.host AND w.gpu = a.gpu
                             AND w."end" >= a.first AND w.start <= a.last AND w."end" > $lo AND w."end" <= $hi
                        WHERE w.verdict IS NOT NULL AND NOT EXISTS (
                            SELECT 1 FROM shared x WHERE x.host = w.host AND x.gpu = w.gpu
                            AND w."end" >= x.lo AND w.start <= x.hi)
                        GROUP BY ALL) GROUP BY ALL)
            SELECT * FROM sig FULL JOIN ver USING (host, pid, command)""", dict(lo=lo, hi=hi)))

    def program_runs(self, since: float | None = None, host: str = "", fingerprints: Sequence[str] = (),
                     before: float | None = None, limit: int = 10_000) -> list[dict]:
        """Runs (newest first) that ended at or after `since`, of a host, of
        programs (an HLO or a command fingerprint), or starting before `before`."""
        where, args = [], []
        for cond, arg in (('"end" >= ?', since), ("host = ?", host or None), ("start < ?", before)):
            if arg is not None:
                where.append(cond)
                args.append(arg)
        if fingerprints:
            where.append("(list_contains(?, hlo_fp) OR list_contains(?, command_fp))")
            args += [list(fingerprints), list(fingerprints)]
        return _dicts(self.reader().execute(
            "SELECT * FROM program_runs" + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY start DESC LIMIT ?", args + [limit]))

    def program_captures(self, since: float) -> list[dict]:
        """Captures started at or after `since` whose trace named a program:
        id, host, pid, gpus, start, end, and the summary's program and top ops."""
        return _dicts(self.reader().execute(
            "SELECT id, host, pid, gpus, start, \"end\", json_extract(summary, '$.program') AS program, "
            "json_extract(summary, '$.top_ops') AS top_ops FROM captures "
            "WHERE start >= ? AND json_extract(summary, '$.program') IS NOT NULL ORDER BY start", [since]))

    def runs_of_programs(self, fingerprints: Sequence[str], per_program: int) -> list[dict]:
        """The newest `per_program` runs of each of `fingerprints` (an HLO or
        a command fingerprint), each row with the `fingerprint` it is listed
        under (a run is listed under its HLO's and its command's): one query
        for a whole check."""
        if not fingerprints:
            return []
        return _dicts(self.reader().execute("""
            WITH r AS (SELECT *, unnest([hlo_fp, command_fp]) AS fingerprint FROM program_runs
                       WHERE list_contains($fps, hlo_fp) OR list_contains($fps, command_fp))
            SELECT * FROM r WHERE list_contains($fps, fingerprint)
            QUALIFY row_number() OVER (PARTITION BY fingerprint ORDER BY start DESC) <= $n""",
            dict(fps=list(fingerprints), n=per_program)))

    def dist_job_runs(self, since: float, job: str = "", limit: int = 100_000) -> list[dict]:
        """Runs that ended at or after `since` of processes their launcher
        made ranks of a distributed job (of `job` only, when given), each
        with its `dist_job`, newest first."""
        where, args = ['"end" >= ?', "json_extract_string(attribution, '$.dist_job') IS NOT NULL"], [since]
        if job:
            where.append("json_extract_string(attribution, '$.dist_job') = ?")
            args.append(job)
        return _dicts(self.reader().execute(
            "SELECT *, json_extract_string(attribution, '$.dist_job') AS dist_job FROM program_runs WHERE "
            + " AND ".join(where) + " ORDER BY start DESC LIMIT ?", args + [limit]))

    def coordinated_captures(self, group: str) -> list[dict]:
        """The captures of one coordinated capture (trigger cc-GROUP-rRANK):
        host, status, error, trigger, and the collectives their traces held."""
        return _dicts(self.reader().execute(
            "SELECT id, host, status, error, trigger, json_extract(summary, '$.collectives') AS collectives "
            "FROM captures WHERE starts_with(trigger, ?) ORDER BY trigger", [f"cc-{group}-r"]))

    def upsert_program_runs(self, rows: Sequence[tuple]) -> None:
        self._rows("program_runs", RUN_COLUMNS, rows, replace=True)

    def programs(self, since: float = 0.0, host: str = "", limit: int = 1000) -> list[dict]:
        """One row per program with runs ending at or after `since`: its
        fingerprint and kind, its runs, hosts, first and last time, its
        runs' median step, and its newest run's name and command."""
        where, args = ['"end" >= ?'], [since]
        if host:
            where.append("host = ?")
            args.append(host)
        return _dicts(self.reader().execute(f"""
            SELECT coalesce(hlo_fp, command_fp) AS fingerprint,
                   CASE WHEN bool_or(hlo_fp IS NOT NULL) THEN 'hlo' ELSE 'command' END AS kind,
                   arg_max(name, start) AS name, arg_max(command, start) AS command, count(*) AS runs,
                   count(DISTINCT host) AS hosts, min(start) AS first_seen, max("end") AS last_seen,
                   sum(sampled_s) AS sampled_s, median(step_seconds) AS step_seconds,
                   list(DISTINCT command_fp) FILTER (WHERE command_fp IS NOT NULL) AS command_fps
            FROM program_runs WHERE {" AND ".join(where)} AND coalesce(hlo_fp, command_fp) IS NOT NULL
            GROUP BY 1 ORDER BY last_seen DESC LIMIT ?""", args + [limit]))


def encode_ranges(seqs: SeqSet) -> str:
    """`1-500,502-900`: compact, and readable by a person in SQL."""
    return ",".join(f"{lo}-{hi}" for lo, hi in seqs.ranges)


def decode_ranges(text: str) -> SeqSet:
    return SeqSet([tuple(int(x) for x in part.split("-")) for part in text.split(",") if part])


def _where_host_gpu(where: list[str], args: list, host: str, gpu: int | None) -> tuple[list[str], list]:
    if host:
        where.append("host = ?")
        args.append(host)
    if gpu is not None:
        where.append("gpu = ?")
        args.append(gpu)
    return where, args


def _where_gpus(where: list[str], args: list, gpus: Sequence[tuple[str, int]]) -> tuple[list[str], list]:
    """Rows of any of `gpus` ((host, gpu) pairs; a report draws a few dozen)."""
    where.append("(" + " OR ".join("(host = ? AND gpu = ?)" for _ in gpus) + ")")
    for host, gpu in gpus:
        args += [host, gpu]
    return where, args


def _decision_rows(decisions: Sequence[dict]) -> list[tuple]:
    return [tuple(d.get(k) for k in DECISION_COLUMNS) for d in decisions]


def _arrow(names: Sequence[str], rows: Sequence[tuple]) -> pa.Table:
    short = next((r for r in rows if len(r) != len(names)), None)
    if short is not None:        # zip would shift every later value into the wrong column, silently
        raise ValueError(f"a row of {len(short)} values for {len(names)} columns ({', '.join(names)})")
    cols = list(zip(*rows))
    # an all-None column has no type for Arrow to infer; DuckDB casts on insert
    return pa.table({n: pa.array(list(c), type=pa.null() if all(v is None for v in c) else None)
                     for n, c in zip(names, cols)})


def _where_range(where: list[str], args: list, ends_col: str, starts_col: str, start: float | None,
                 end: float | None) -> None:
    """Rows overlapping [start, end]: those ending at or after `start` and
    starting at or before `end` (a point in time is both its own ends)."""
    if start is not None:
        where.append(f"{ends_col} >= ?")
        args.append(start)
    if end is not None:
        where.append(f"{starts_col} <= ?")
        args.append(end)


def _dicts(cur: Any) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


_KIND = "coalesce(kind, 'bottleneck') = ?"
# Each GPU's current calibration (its newest, never a CPU run's) as one row of ceilings by UUID.
# HBM is the better of triad and copy: both move bytes through HBM, a GPU reaches its ceiling in one.
_CURRENT_CEILINGS = """
    WITH cal AS (SELECT id, uuid FROM calibrations WHERE coalesce(platform, '') <> 'cpu'
                 QUALIFY row_number() OVER (PARTITION BY uuid ORDER BY started_at DESC, received DESC) = 1)
    SELECT cal.uuid,
           max(c.value) FILTER (WHERE c.name IN ('hbm_triad', 'hbm_copy')) AS hbm_bytes_per_s,
           max(c.value) FILTER (WHERE c.name = 'matmul_bf16') AS tensor_flops_per_s,
           max(c.value) FILTER (WHERE c.name = 'h2d') AS pcie_h2d_bytes_per_s,
           max(c.value) FILTER (WHERE c.name = 'd2d') AS nvlink_d2d_bytes_per_s
    FROM cal JOIN ceilings c ON c.calibration_id = cal.id GROUP BY cal.uuid"""
_JSON_FIELDS = ("evidence", "flags", "alternatives", "captures", "attribution")
_DICT_FIELDS = ("evidence", "attribution")
_EMPTY_JSON = ("[]", "{}")


def _findings(cur: Any) -> list[dict]:
    return finding_fields(_dicts(cur))


def finding_dicts(table: pa.Table) -> list[dict]:
    """Rows of a `findings_table`, as `findings()` returns them."""
    return finding_fields(table.to_pylist())


def merge_live(table: pa.Table, overlay: dict[str, dict]) -> list[dict]:
    """The rows of a findings table with the live numbers of the open
    findings that changed since they were written (Analyzer.findings_payload)."""
    rows = finding_dicts(table)
    if overlay:
        rows = [{**r, **overlay[r["id"]]} if r["id"] in overlay else r for r in rows]
    return rows


def finding_fields(rows: list[dict]) -> list[dict]:
    """Stored findings rows (JSON fields as text) as the queries return them."""
    for r in rows:
        for k in _JSON_FIELDS:
            v = r.get(k)
            # most rows hold empty lists: skip the parser (a fleet-wide list is 1,000 rows x 4 fields)
            r[k] = json.loads(v) if v and v not in _EMPTY_JSON else ({} if k in _DICT_FIELDS else [])
        r["counters_verdict"] = r.get("counters_verdict") or r["verdict"]
    return rows


def finding_row(f: dict) -> tuple:
    """The stored row; `absorbed_until` is the last window the numbers hold."""
    return tuple(_json(f.get(k), k) if k in _JSON_FIELDS else
                 f.get("last_window_end") if k == "absorbed_until" else
                 f.get(k) or "bottleneck" if k == "kind" else f.get(k) for k in FINDING_COLUMNS)


def _json(v: Any, key: str) -> str:
    if not v:              # most findings have no flags, alternatives or captures
        return "{}" if key in _DICT_FIELDS else "[]"
    return json.dumps(v)


def _json_dict(text: str | None) -> dict:
    return json.loads(text) if text and text != "{}" else {}


@dataclass(frozen=True)
class LockHolder:
    """Who holds a DB's lock, as DuckDB names it and /proc tells."""
    pid: int
    analyzer: int | None = None     # the gpuscope analyzer whose analysis process it is, if one
    orphan: bool = False            # a multiprocessing child whose parent is no gpuscope process: the
    #                                 analysis process of an analyzer that is gone, closing the store


def lock_holder(text: str, proc: str = "/proc") -> LockHolder | None:
    """The holder of the lock that DuckDB's error `text` is about, or None."""
    lock = re.search(r"Conflicting lock is held in .* \(PID (\d+)\)", text)
    if not lock:
        return None
    pid = int(lock.group(1))
    try:
        parent = int(Path(f"{proc}/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        argv = Path(f"{proc}/{parent}/cmdline").read_bytes().split(b"\0")
        child = b"multiprocessing" in Path(f"{proc}/{pid}/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):       # gone meanwhile, or not ours to see
        return LockHolder(pid)
    if any(a.endswith(b"gpuscope") or a == b"gpuscope.daemon.cli" for a in argv):
        return LockHolder(pid, analyzer=parent)
    return LockHolder(pid, orphan=child)


def _advice(exc: duckdb.Error) -> str:
    """What to do about a DB that will not open, where DuckDB's words do not say."""
    text = str(exc)
    holder = lock_holder(text)
    if holder is not None:
        if holder.analyzer is not None:      # a gpuscope analyzer holds its DB in its analysis process
            return (f" (PID {holder.pid} is the analysis process of gpuscope PID {holder.analyzer}: "
                    f"stop PID {holder.analyzer}, or pass another --db)")
        return f" (another process holds it: stop PID {holder.pid}, or pass another --db)"
    if "not a valid DuckDB database file" in text:
        return " (not a gpuscope database: pass another --db, or move this file away)"
    return ""
