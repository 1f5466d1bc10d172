"""Queries on a fleet-sized store: 24 h x 100 hosts x 8 GPUs at 1 Hz
(69.1 M samples) plus the findings such a fleet produces, generated in DuckDB.

    python bench/queries.py [--hours 24] [--hosts 100] [--runs 30] [--db PATH]

Times the on-call queries through the analyzer's own Store methods (the SQL
the gRPC service runs): findings for one host over the last hour, fleet-wide
top-10 bottlenecked GPUs over 24 h, and one GPU's p95 of a metric over 1 h.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers.store import Store, StoreConfig  # noqa: E402

VERDICTS = ["compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound"]


def generate(store: Store, hours: float, hosts: int, gpus: int, end: float) -> dict:
    con = store._con   # bulk generation; the analyzer itself only appends Arrow batches
    start = end - hours * 3600
    n_sec = int(hours * 3600)
    t0 = time.perf_counter()
    con.execute(f"""
        INSERT INTO samples (host, gpu, t, util_gpu_ratio, util_mem_ratio, power_watts, gpm_sm_util_ratio,
                             gpm_tensor_util_ratio, gpm_dram_bw_util_ratio, procs_cpu_cores)
        SELECT 'host-' || lpad(h::VARCHAR, 3, '0'), g, {start} + s,
               (hash(h, g, s // 600) % 100) / 100.0, (hash(g, h, s // 600) % 100) / 100.0,
               100 + (hash(s, h, g) % 600), (hash(h, g, s // 600) % 100) / 100.0,
               (hash(h, s // 600, g) % 100) / 100.0, (hash(s // 600, h, g) % 100) / 100.0,
               (hash(h, g, s // 300) % 400) / 100.0
        FROM range({hosts}) r1(h), range({gpus}) r2(g), range({n_sec}) r3(s)
        ORDER BY s""")
    gen_samples = time.perf_counter() - t0
    # Findings: per GPU, alternating bottleneck episodes of 5-60 min and quiet gaps.
    rng = np.random.default_rng(7)
    rows = []
    for h in range(hosts):
        for g in range(gpus):
            t = start + rng.uniform(0, 1800)
            while t < end:
                dur = rng.uniform(300, 3600)
                e = t + dur
                rows.append((f"f{h:03d}{g}{len(rows):08d}", f"host-{h:03d}", g, f"pid:{1000 + g} python train.py",
                             VERDICTS[rng.integers(len(VERDICTS))], t, e if e < end else None,
                             round(float(rng.uniform(0.5, 1)), 3), int(dur // 5),
                             json.dumps({"sm_util_ratio": 0.5}), "[]", "generated", "[]", "counters"))
                t = e + rng.uniform(60, 3600)
    import pyarrow as pa
    cols = list(zip(*rows))
    names = ["id", "host", "gpu", "job", "verdict", "start", "end", "confidence", "windows", "evidence", "flags",
             "summary", "alternatives", "decided_by"]
    store.append("findings", pa.table({n: list(c) for n, c in zip(names, cols)}))
    return dict(samples=store.count("samples"), findings=len(rows), generate_s=round(gen_samples, 1))


def timed(fn, runs: int) -> dict:
    fn()   # warm
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return dict(p50_ms=round(1000 * float(np.percentile(ts, 50)), 2), p95_ms=round(1000 * float(np.percentile(ts, 95)), 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--db", default=None)
    ap.add_argument("--memory-limit", default="4GB",
                    help="DuckDB's cap while timing (the analyzer's --memory-limit); generated under 4GB")
    ns = ap.parse_args()
    db = ns.db or tempfile.mktemp(suffix=".duckdb", dir=os.environ.get("TMPDIR", "/tmp"))
    end = time.time()
    store = Store(StoreConfig(db, memory_limit="4GB"))
    info = generate(store, ns.hours, ns.hosts, ns.gpus, end) if store.count("samples") == 0 else dict(samples=store.count("samples"))
    if ns.memory_limit != "4GB":
        store.close()
        store = Store(StoreConfig(db, memory_limit=ns.memory_limit))
    res = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               store=info, db_bytes=os.path.getsize(db), memory_limit=ns.memory_limit)
    res["findings_one_host_last_hour"] = timed(lambda: store.findings(host="host-042", start=end - 3600, end=end), ns.runs)
    res["top10_bottlenecked_24h"] = timed(lambda: store.top_bottlenecked(end - 86400, end, 10), ns.runs)
    res["metric_p95_one_gpu_1h"] = timed(lambda: store.metric("util_gpu_ratio", "host-042", 3, end - 3600, end, "p95", 0), ns.runs)
    res["metric_series_one_host_1h"] = timed(lambda: store.metric("power_watts", "host-042", None, end - 3600, end, "series", 60), ns.runs)
    print(json.dumps(res, indent=1))
    store.close()
    if ns.db is None:
        os.unlink(db)


if __name__ == "__main__":
    main()
