"""Fleet-wide questions over the fleet tier's Parquet (analyzers/publish.py
writes it; analyzers/fleet_layout.py is the layout), with DuckDB.

The files are chosen here, not by a glob in DuckDB: only the `date=`
directories that overlap the range asked are listed, and of each host's
segments only those no other one contains (a compaction's leftovers, a
re-published range) are read, so nothing counts twice. S3 and GCS are read
through DuckDB's fsspec hook (analyzers/object_store.py says why not
httpfs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable

import duckdb

from . import fleet_layout as lay
from .object_store import ObjectStore, parse_location

BOTTLENECKS = ("compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound")
# group key columns of a rollup row (a job is a host's, as in `gpuscope top`; a Slurm job id is a cluster's)
GROUPS = {"job": ("cluster", "host", "job"), "pod": ("namespace", "pod"), "slurm-job": ("cluster", "slurm_job")}
# what a row of top-jobs shows beside the minutes: the means people read first
SHOWN_MEANS = ("util_gpu_ratio", "gpm_sm_util_ratio", "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio")


class NoFiles(LookupError):
    """Nothing published where and when asked; str() says what to check."""


@dataclass
class Scan:
    table: str
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    hosts: list[str] = field(default_factory=list)      # each file's


class FleetReader:
    def __init__(self, url: str, storage: ObjectStore | None = None, threads: int | None = None,
                 progress: Callable[[str], None] | None = None):
        self.storage = storage if storage is not None else ObjectStore(parse_location(url))
        self.url = self.storage.loc.url
        self.con = duckdb.connect()
        if threads:
            self.con.execute(f"SET threads={int(threads)}")
        if self.storage.fs is not None:
            self.con.register_filesystem(self.storage.fs)
        self._progress = progress or (lambda _text: None)
        self._views: dict[str, Scan] = {}

    # -- files -----------------------------------------------------------------------------
    def scan(self, table: str, start: float | None = None, end: float | None = None,
             cluster: str = "") -> Scan:
        """The files of `table` to read for [start, end)."""
        self._progress(f"listing {table} under {self.url}")
        dates = [d.partition("=")[2] for d in self.storage.directories(f"table={table}") if d.startswith("date=")]
        lo = lay.date_of(start) if start is not None else ""
        hi = lay.date_of(end - 1e-6) if end is not None else "9999"
        sizes: dict[str, int] = {}
        for date in sorted(d for d in dates if lo <= d <= hi):
            sizes.update(self.storage.sizes(f"table={table}/date={date}"))
        segments = {}
        for key in sizes:
            seg = lay.parse_key(key)
            if seg is not None and seg.table == table and (not cluster or seg.cluster == cluster):
                segments[seg] = key
        # newest first: DuckDB takes the columns of the first file, and catalogues only grow
        chosen = [s for s in reversed(lay.maximal(segments))
                  if (start is None or s.end > start) and (end is None or s.start < end)]
        return Scan(table, [self.storage.url_of(segments[s]) for s in chosen],
                    sum(sizes[segments[s]] for s in chosen), [s.host for s in chosen])

    _union = False          # files of different catalogues: columns matched by name across all of them

    def view(self, scan: Scan) -> None:
        """A view named as the table over the scan's files (none: an empty
        view with no columns would fail later, so it is refused here).
        Columns are the first file's until a query meets a file that
        differs (`_query` then retries with union_by_name): reading every
        file's schema first doubled a day's scan."""
        if not scan.files:
            raise NoFiles(f"no {scan.table} files under {self.url} for that range: is an analyzer publishing "
                          "there (gpuscope analyzer --publish URL --cluster NAME; `gpuscope status` shows how "
                          "far it has got)?")
        files = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in scan.files) + "]"
        types = "{" + ", ".join(f"'{k}': '{v}'" for k, v in lay.HIVE_TYPES.items()) + "}"
        self.con.execute(f'CREATE OR REPLACE VIEW "{scan.table}" AS SELECT * EXCLUDE ("table") FROM read_parquet('
                         f"{files}, hive_partitioning = true, hive_types = {types}, union_by_name = {self._union})")
        self._views[scan.table] = scan

    def _columns(self, view: str) -> set[str]:
        return {r[0] for r in self.con.execute(f'DESCRIBE "{view}"').fetchall()}

    def _query(self, scans: Iterable[Scan], sql: str, params: dict | list | None = None) -> list[dict]:
        scans = list(scans)
        for s in scans:
            self.view(s)
        if scans:
            n, size = sum(len(s.files) for s in scans), sum(s.bytes for s in scans)
            self._progress(f"scanning {n:,} file{'s' if n != 1 else ''} ({_bytes(size)})")
        try:
            try:
                cur = self.con.execute(sql, params or {})
            except (duckdb.BinderException, duckdb.InvalidInputException) as exc:
                if self._union or not ("schema mismatch" in str(exc) or isinstance(exc, duckdb.BinderException)):
                    raise
                self._union = True       # a file of another catalogue: match columns by name, and ask again
                for s in list(self._views.values()):
                    self.view(s)
                cur = self.con.execute(sql, params or {})
        except duckdb.CatalogException:
            raise
        except duckdb.Error as exc:       # a bad query, or storage refused a read (says which)
            raise ValueError(str(exc).split("\n")[0]) from None
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    # -- named questions ----------------------------------------------------------------------
    def top_jobs(self, start: float, end: float, by: str = "job", verdicts: Iterable[str] = (),
                 cluster: str = "", limit: int = 10) -> list[dict]:
        """Jobs (pods, Slurm jobs) with the most GPU-minutes in a bottleneck
        (any verdict but idle, or those named) over [start, end): the
        verdicts' minutes, GPUs and hosts, and the mean SM, tensor and DRAM
        activity over those minutes."""
        if by not in GROUPS:
            raise ValueError(f"by: {by!r}, expected {', '.join(GROUPS)}")
        verdicts = list(verdicts) or list(BOTTLENECKS)
        keys = GROUPS[by]
        k = ", ".join(keys)
        scan = self.scan("rollups", start, end, cluster)
        where = (f"t >= $start AND t < $end AND verdict IN (SELECT unnest($verdicts)) AND "
                 + " AND ".join(f"{c} IS NOT NULL" for c in keys) + (" AND cluster = $cluster" if cluster else ""))
        params = {"start": start, "end": end, "verdicts": verdicts, "limit": limit}
        if cluster:
            params["cluster"] = cluster
        # First the ranking, from counts alone (the scan reads keys and verdicts, not metrics)...
        rows = self._query([scan], f"""
            WITH per AS (SELECT {k}, host AS h, gpu, verdict, count(*) AS minutes FROM rollups WHERE {where}
                         GROUP BY ALL),
            g AS (SELECT {k}, sum(minutes) AS gpu_minutes, count(DISTINCT (h, gpu)) AS gpus,
                         count(DISTINCT h) AS hosts, list(DISTINCT h) AS _on
                  FROM per GROUP BY {k} ORDER BY gpu_minutes DESC, {k} LIMIT $limit),
            v AS (SELECT {k}, verdict, sum(minutes) AS minutes FROM per SEMI JOIN g USING ({k}) GROUP BY ALL),
            vv AS (SELECT {k}, arg_max(verdict, (minutes, verdict)) AS main_verdict,
                          list({{'verdict': verdict, 'minutes': minutes}} ORDER BY minutes DESC, verdict DESC) AS verdicts
                   FROM v GROUP BY {k})
            SELECT g.*, vv.main_verdict, vv.verdicts FROM g JOIN vv USING ({k})
            ORDER BY gpu_minutes DESC, {k}""", params)
        means = self._means(scan, keys, where, params, rows) if rows else {}
        for r in rows:
            del r["_on"]
            r.update(means.get(tuple(r[c] for c in keys), dict.fromkeys(SHOWN_MEANS)))
            r["group"] = _group_name(by, r)
        return rows

    def _means(self, scan: Scan, keys: tuple, where: str, params: dict, rows: list[dict]) -> dict:
        """... then the metrics' means of the top groups only, from the files
        of the hosts they ran on (a second scan of a few files, not all)."""
        hosts = {h for r in rows for h in r["_on"]}
        self.view(Scan(scan.table, [f for f, h in zip(scan.files, scan.hosts) if h in hosts], 0, []))
        self._progress(f"activity means of the top {len(rows)}")
        have = self._columns("rollups")          # files of an older catalogue lack newer metrics: NULL
        means = ", ".join((f'avg("{m}")' if m in have else "NULL::DOUBLE") + f' AS "{m}"' for m in SHOWN_MEANS)
        k = ", ".join(keys)
        self.con.execute("CREATE OR REPLACE TEMP TABLE _top AS SELECT * FROM (VALUES "
                         + ", ".join("(" + ", ".join("?" for _ in keys) + ")" for _ in rows) + f") v({k})",
                         [r[c] for r in rows for c in keys])
        out = {}
        for r in self._query([], f"SELECT {k}, {means} FROM rollups SEMI JOIN _top USING ({k}) WHERE {where} "
                                 f"GROUP BY ALL", {p: v for p, v in params.items() if p != "limit"}):
            # sums in parallel differ in the last bits from run to run
            out[tuple(r[c] for c in keys)] = {m: None if r[m] is None else round(r[m], 6) for m in SHOWN_MEANS}
        return out

    def hosts_changed(self, at: float, to: str, window_s: float = 7 * 86400, cluster: str = "",
                      min_change: float = 0.25, limit: int = 50) -> list[dict]:
        """Hosts whose share of GPU-minutes judged `to` grew by at least
        `min_change` from the `window_s` before `at` to the `window_s`
        after it (e.g. after a driver roll-out): each host's share before
        and after, and its main verdict before. Shares are of the minutes
        with a verdict; a host without minutes on both sides is left out."""
        sql = f"""
            WITH per AS (
              SELECT cluster, host, t >= $at AS after, count(verdict) AS judged,
                     count(*) FILTER (WHERE verdict = $to) AS hit,
                     mode(verdict) AS main, count(DISTINCT gpu) AS gpus
              FROM rollups WHERE t >= $lo AND t < $hi {"AND cluster = $cluster" if cluster else ""}
              GROUP BY ALL)
            SELECT a.cluster, a.host, b.hit / b.judged AS before_share, a.hit / a.judged AS after_share,
                   a.hit / a.judged - b.hit / b.judged AS change, b.main AS before_verdict, a.main AS after_verdict,
                   b.judged AS before_minutes, a.judged AS after_minutes, greatest(a.gpus, b.gpus) AS gpus
            FROM per a JOIN per b ON a.cluster = b.cluster AND a.host = b.host AND a.after AND NOT b.after
            WHERE a.judged > 0 AND b.judged > 0 AND a.hit / a.judged - b.hit / b.judged >= $min_change
            ORDER BY change DESC, a.cluster, a.host LIMIT $limit"""
        lo, hi = at - window_s, at + window_s
        scan = self.scan("rollups", lo, hi, cluster)
        params = {"at": at, "to": to, "lo": lo, "hi": hi, "min_change": min_change, "limit": limit}
        if cluster:
            params["cluster"] = cluster
        return self._query([scan], sql, params)

    def sql(self, text: str, start: float | None = None, end: float | None = None, cluster: str = "") -> list[dict]:
        """Any SQL over views named rollups, findings and captures (those
        with files in the range; a table with none has no view)."""
        scans = [s for s in (self.scan(t, start, end, cluster) for t in lay.TABLES) if s.files]
        if not scans:
            raise NoFiles(f"nothing published under {self.url}" + (" in that range" if start or end else "")
                          + ": is an analyzer publishing there (gpuscope analyzer --publish URL --cluster NAME)?")
        try:
            return self._query(scans, text)
        except duckdb.CatalogException as exc:
            have = ", ".join(s.table for s in scans)
            raise ValueError(f"{exc} (views here: {have})") from None

    def close(self) -> None:
        self.con.close()


def _group_name(by: str, r: dict) -> str:
    if by == "job":
        return f"{r['host']}: {r['job']}"
    if by == "pod":
        return f"{r['namespace']}/{r['pod']}"
    return f"{r['cluster']}/{r['slurm_job']}"


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def parse_time(text: str, now: float | None = None) -> float:
    """ISO 8601 (`2026-11-20`, `2026-11-20T00:00`, UTC unless it carries an
    offset), Unix seconds, or an age before now (`24h`, `7d`)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return (time.time() if now is None else now) - float(text[:-1]) * units[text[-1]]
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {text!r}: give ISO 8601 like 2026-11-20T00:00 (UTC unless it says +HH:MM), "
                         "Unix seconds, or an age like 24h or 7d") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
