"""The records the analyzer makes and rewrites (findings, anomalies,
decisions) live in two tables each: `<name>_hot`, keyed by id, where they
are written, and `<name>_history`, without a key, where they go once they
can no longer change. The view `<name>` reads both, so every query is as
before.

Why: DuckDB keeps a primary key's index (an ART) in memory, about 45 bytes
a row, and does not give it back while the file is open. One table holding
a year of records grew it without bound: 4 million anomalies filled a 200MB
cap, and the checkpoint failed with a FATAL error (bench/index_memory.py).
At 2,000 agents the analysis writes ~900 such rows a second. A hot table
holds the open findings, pending decisions and the last minutes of the
rest, so its index stays a few tens of MB whatever the history holds.

Rows move on the writer thread, a bounded number at a time, with the
retention pass (analyzers/retention.py).
"""
from __future__ import annotations

import duckdb

STALE_PENDING_S = 86400     # a pending decision this old was left by an analyzer that stopped
# a row that cannot change any more, older than the cut-off: (condition, its time, for the oldest first)
MOVABLE = {
    "findings": ('"end" IS NOT NULL AND "end" < $cut', '"end"'),
    "anomalies": ("t < $cut", "t"),
    # a pending decision waits for its capture's report (Analyzer._decided updates it), minutes at most; one a
    # day old was left by an analyzer that stopped before the report came, and never changes
    "decisions": (f"(status <> 'pending' OR coalesce(updated, t) < $cut - {STALE_PENDING_S}) "
                  "AND coalesce(updated, t) < $cut", "coalesce(updated, t)"),
}
# Rows whose time is older than this move. The times are the agents' (a finding's end, an anomaly's
# window), not when the row was written, so a row can move soon after its last write; nothing rewrites
# a closed finding, a finished decision or an anomaly, and if something did, the view shows the hot row
# and hides the moved one (make_views), so a rewrite can never show twice.
HOT_S = 600.0
# per table and transaction: moving a row costs ~14 us, most of it the commit deleting its key from the
# index, so a transaction of three tables' rows holds the writer ~0.2 s (bench/index_memory.py)
MOVE_ROWS = 5_000


def hot(name: str) -> str:
    return f"{name}_hot"


def history(name: str) -> str:
    return f"{name}_history"


def adopt_old_tables(con: duckdb.DuckDBPyConnection) -> None:
    """A file from before schema 11 holds each as one keyed table under the
    view's name: it becomes the hot table (the next moves empty it)."""
    for name in MOVABLE:
        kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_name = ?",
                           [name]).fetchall()
        if kind and kind[0][0] == "BASE TABLE":
            con.execute(f"ALTER TABLE {name} RENAME TO {hot(name)}")


def make_views(con: duckdb.DuckDBPyConnection) -> None:
    """After the hot tables have their columns: the history tables with the
    same, and the views over both."""
    for name in MOVABLE:
        con.execute(f"CREATE TABLE IF NOT EXISTS {history(name)} AS SELECT * FROM {hot(name)} WITH NO DATA")
        have = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                          [history(name)]).fetchall()}
        for col, kind in con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = ? ORDER BY ordinal_position", [hot(name)]).fetchall():
            if col not in have:
                con.execute(f'ALTER TABLE {history(name)} ADD COLUMN "{col}" {kind}')
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {hot(name)} UNION ALL BY NAME "
                    f"SELECT * FROM {history(name)} h WHERE NOT EXISTS (SELECT 1 FROM {hot(name)} k WHERE k.id = h.id)")


def move(con: duckdb.DuckDBPyConnection, cut: float, limit: int = MOVE_ROWS) -> dict[str, int]:
    """Moves the oldest rows of each table that can no longer change and
    are older than `cut` to its history, about `limit` of them, in the
    caller's transaction. Rows tied at the last one's time go too: a
    fleet-wide storm's anomalies share their window's end, so a chunk can
    hold one more row per GPU. Returns the
    rows moved by table. The rows are chosen by their time, not their ids:
    rows are written about in time order, so DuckDB's zone maps skip the
    newer part of the table (a join on ids read all of it, three times)."""
    out = {}
    for name, (where, when) in MOVABLE.items():
        bound = con.execute(f"SELECT max(w) FROM (SELECT {when} AS w FROM {hot(name)} WHERE {where} "
                            f"ORDER BY w LIMIT $limit)", {"cut": cut, "limit": limit}).fetchall()[0][0]
        if bound is None:
            out[name] = 0
            continue
        chosen, args = f"{where} AND {when} <= $bound", {"cut": cut, "bound": bound}
        con.execute(f"INSERT INTO {history(name)} BY NAME SELECT * FROM {hot(name)} WHERE {chosen}", args)
        out[name] = int(con.execute(f"DELETE FROM {hot(name)} WHERE {chosen}", args).fetchall()[0][0])
    return out

