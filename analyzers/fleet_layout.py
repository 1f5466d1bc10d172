"""The fleet tier's file layout, shared by the publisher and the readers.

    <root>/table=<table>/date=<YYYY-MM-DD>/cluster=<cluster>/host=<host>/part-<HHMM>-<HHMM>.parquet

Hive-style partitions (DuckDB, BigQuery, Spark, Trino read them as columns);
the partition columns are in the path only, never in the file (BigQuery
refuses a file that repeats them). A file is a *segment*: every row of its
table, date, cluster and host whose time falls in the UTC minutes
[from, to) of that date (`2400` is the end of the day). Names are
deterministic, so a re-publish after a crash overwrites instead of adding a
copy.

Segments may overlap only by containment: a publish pass that was cut off
and redone covers a range that starts where the cut one did, and compaction
writes the union of the segments it merges. Readers therefore take, per
partition directory, only the segments not contained in another
(`maximal`): exact at every moment, whatever was left behind by a crash or
by a compaction whose clean-up has not run yet.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone

DAY_S = 86400
HOUR_S = 3600

# table -> the column whose time puts a row in a date and segment
TABLES = {"rollups": "t", "findings": "end", "captures": "end"}
PARTITIONS = ("table", "date", "cluster", "host")
HIVE_TYPES = {"date": "DATE", "cluster": "VARCHAR", "host": "VARCHAR"}   # a host named 0042 stays text

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_SEGMENT = re.compile(r"part-(\d{4})-(\d{4})\.parquet")


def check_cluster(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"cluster name {name!r}: letters, digits, '.', '_' and '-' (at most 63), "
                         "starting with a letter or digit")
    return name


def quote(value: str) -> str:
    """A partition value as a path segment: hive's percent-encoding, which
    DuckDB decodes (a host name is the agent's and may hold anything)."""
    return urllib.parse.quote(value, safe="._-")


def date_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def day_start(date: str) -> float:
    return datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()


@dataclass(frozen=True, order=True)
class Segment:
    table: str
    date: str
    cluster: str
    host: str                   # as the agent names it (unquoted)
    lo: int                     # minutes into the date, [lo, hi)
    hi: int

    @property
    def directory(self) -> str:
        return (f"table={self.table}/date={self.date}/cluster={quote(self.cluster)}/"
                f"host={quote(self.host)}")

    @property
    def key(self) -> str:
        return f"{self.directory}/part-{self.lo // 60:02d}{self.lo % 60:02d}-{self.hi // 60:02d}{self.hi % 60:02d}.parquet"

    @property
    def start(self) -> float:
        return day_start(self.date) + 60 * self.lo

    @property
    def end(self) -> float:
        return day_start(self.date) + 60 * self.hi

    def contains(self, other: "Segment") -> bool:
        return self.lo <= other.lo and other.hi <= self.hi and (self.lo, self.hi) != (other.lo, other.hi)


def segment(table: str, cluster: str, host: str, start: float, end: float) -> Segment:
    """The segment of [start, end), whole minutes within one UTC date."""
    date = date_of(start)
    base = day_start(date)
    lo, hi = round((start - base) / 60), round((end - base) / 60)
    if not 0 <= lo < hi <= 1440 or start % 60 or end % 60:
        raise ValueError(f"segment [{start}, {end}) is not whole minutes within one UTC date")
    return Segment(table, date, cluster, host, lo, hi)


def parse_key(key: str) -> Segment | None:
    """The segment a stored key names (anything under the root, a prefix
    before `table=` allowed); None for what is not one (a temporary file,
    someone else's object)."""
    parts = key.strip("/").split("/")
    if len(parts) < 5:
        return None
    m = _SEGMENT.fullmatch(parts[-1])
    values = {}
    for part in parts[-5:-1]:
        name, eq, value = part.partition("=")
        if not eq:
            return None
        values[name] = urllib.parse.unquote(value)
    if m is None or tuple(values) != PARTITIONS or values["table"] not in TABLES:
        return None
    lo = int(m.group(1)[:2]) * 60 + int(m.group(1)[2:])
    hi = int(m.group(2)[:2]) * 60 + int(m.group(2)[2:])
    if not 0 <= lo < hi <= 1440:
        return None
    try:
        day_start(values["date"])
    except ValueError:
        return None
    return Segment(values["table"], values["date"], values["cluster"], values["host"], lo, hi)


def by_partition(segments) -> dict[tuple, list[Segment]]:
    """The segments grouped by their partition directory (table, date, cluster, host)."""
    out: dict[tuple, list[Segment]] = {}
    for s in segments:
        out.setdefault((s.table, s.date, s.cluster, s.host), []).append(s)
    return out


def maximal(segments) -> list[Segment]:
    """Per partition directory, the segments no other one contains: what
    a reader reads, so that nothing is counted twice."""
    out = []
    for group in by_partition(segments).values():
        # widest first: a segment is dropped if one already kept contains it
        kept: list[Segment] = []
        for s in sorted(set(group), key=lambda s: (s.lo, -s.hi)):
            if not any(k.contains(s) for k in kept):
                kept.append(s)
        out.extend(kept)
    return sorted(out)


def ranges(start: float, end: float) -> list[tuple[float, float]]:
    """[start, end) cut at every UTC hour: a segment never straddles an
    hour, so hours and days are unions of segments and compaction is exact."""
    out = []
    lo = start
    while lo < end:
        hi = min(end, (lo // HOUR_S + 1) * HOUR_S)
        out.append((lo, hi))
        lo = hi
    return out
