"""DuckDB's memory for the keys of the records the analyzer makes, over one
long session: the analysis inserts findings, anomalies and decisions (~900 a
second at 2,000 agents), and DuckDB keeps each primary key's index (an ART)
in memory while the file is open.

    python bench/index_memory.py [--rows 6000000] [--memory-limit 200MB] [--commit 1000]
                                 [--move-every 200000]

Rows (anomalies, 20-hex-digit ids) are inserted through the store, `--commit`
a transaction, under the analyzer's DuckDB cap. With `--move-every N` the
rows older than the newest N move to the history table each N rows, in the
retention pass's chunks (analyzers/hot_tables.py); with 0 they all stay
keyed, as before schema 11. Also reported: the time moving took, in total and
per chunk (a chunk holds the analyzer's writer). Reported every 500,000 rows: the index's MB
(duckdb_memory()), and the first error if DuckDB fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuscope.analyzers import hot_tables  # noqa: E402
from gpuscope.analyzers.store import ANOMALY_COLUMNS, Store, StoreConfig  # noqa: E402


def _rows(n: int, t0: float) -> pa.Table:
    cols = {k: [None] * n for k in ANOMALY_COLUMNS}
    cols.update(id=[os.urandom(10).hex() for _ in range(n)], t=[t0 + i for i in range(n)], host=["sim-00001"] * n,
                gpu=[1] * n, kind=["bottleneck"] * n, kinds=['["bottleneck"]'] * n, reason=["memory-bound"] * n,
                details=['{"verdict": "memory-bound", "confidence": 0.9}'] * n)
    return pa.table({k: cols[k] for k in ANOMALY_COLUMNS})


def _memory(s: Store) -> dict[str, int]:
    return {tag: mb for tag, mb in s._con.execute(
        "SELECT tag, memory_usage_bytes >> 20 FROM duckdb_memory() WHERE memory_usage_bytes > 1 << 20").fetchall()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=6_000_000)
    ap.add_argument("--memory-limit", default="200MB")
    ap.add_argument("--commit", type=int, default=1000)
    ap.add_argument("--move-every", type=int, default=200_000)
    ns = ap.parse_args()
    s = Store(StoreConfig(os.path.join(tempfile.mkdtemp(), "index.duckdb"), memory_limit=ns.memory_limit))
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), memory_limit=ns.memory_limit, move_every=ns.move_every,
               rows=0, error=None, points=[])
    c = time.perf_counter()
    moving = 0.0
    chunks: list[float] = []
    try:
        while out["rows"] < ns.rows:
            s.begin()
            s.append(hot_tables.hot("anomalies"), _rows(ns.commit, out["rows"]))
            s.commit()
            out["rows"] += ns.commit
            if ns.move_every and out["rows"] % ns.move_every == 0:
                while True:                          # as the retention pass does: a transaction a chunk
                    m = time.perf_counter()
                    moved = s.move_to_history(out["rows"] - ns.move_every)
                    took = time.perf_counter() - m
                    moving += took
                    chunks.append(took)
                    if max(moved.values()) < hot_tables.MOVE_ROWS:
                        break
            if out["rows"] % 500_000 == 0:
                out["points"].append(dict(rows=out["rows"], seconds=round(time.perf_counter() - c, 1), **_memory(s)))
                print(json.dumps(out["points"][-1]), file=sys.stderr, flush=True)
    except Exception as exc:  # the finding: report it, with how far it got
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    out["moving_s"] = round(moving, 1)
    out["move_chunks"] = len(chunks)
    out["move_chunk_ms"] = dict(median=round(1e3 * sorted(chunks)[len(chunks) // 2]) if chunks else None,
                                max=round(1e3 * max(chunks)) if chunks else None)
    out["insert_s"] = round(time.perf_counter() - c - moving, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
