"""Retention: DB bytes per GPU-day, raw and rolled up, and the pause one
retention chunk imposes on ingest.

    python bench/retention.py [--hosts 2] [--gpus 8] [--days 1] [--db PATH]

Fills a DuckDB file through the analyzer's own Store with hosts x GPUs x days
of 1 Hz samples made of the real H200 recording (`default_recording()`: its
35 metric columns, NULL where the GPU reported nothing; rows cycled with a
different phase per GPU, counters kept increasing, timestamps on a 1 s cadence
with millisecond jitter), appended as the writer appends them (Arrow, time
order, all GPUs interleaved). Then, each after a CHECKPOINT:

1. bytes per GPU-day of raw samples, then of the windows the live analysis
   writes (5 s) and of the processes rows (one training process per GPU, sent
   every tick) (used blocks, less an empty store's);
2. retention through the analyzer's own code (`Retention.chunk` on the
   writer thread): every chunk one hour of the fleet's data, timed — the
   pause it imposes on ingest — and then an adaptive pass over the rest;
3. bytes per GPU-day once everything is rolled up to per-minute means;
4. the same amount of raw data again: whether freed blocks are reused;
5. what an analyzer start costs on the filled file (counting rows, each
   GPU's newest sample and window): without the gpu_state snapshot (a file
   from before it, scanned whole) and with it.
"""
import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig  # noqa: E402
from gpuscope.analyzers.retention import Retention  # noqa: E402
from gpuscope.analyzers.store import Store, StoreConfig  # noqa: E402
from gpuscope.collectors import catalogue as cat  # noqa: E402
from gpuscope.collectors.recording import default_recording, read_recording  # noqa: E402

DAY = 86400.0


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def recording_columns() -> dict[str, np.ndarray]:
    """The recording's metric columns (each 1-D, NaN = not reported)."""
    rec = read_recording(default_recording())
    return {k: v for k, v in rec.metrics.items() if k in cat.BY_NAME}


def hour_table(cols: dict[str, np.ndarray], hosts: int, gpus: int, start: float, hour: int,
               rng: np.random.Generator) -> pa.Table:
    """One hour of 1 Hz samples of every GPU, interleaved in time order."""
    n_rec = len(next(iter(cols.values())))
    sec = np.arange(3600) + hour * 3600
    n = 3600 * hosts * gpus
    t = np.repeat(start + sec + 0.5, hosts * gpus) + rng.normal(0, 0.002, n)
    host_idx = np.tile(np.repeat(np.arange(hosts), gpus), 3600)
    gpu = np.tile(np.arange(gpus, dtype=np.int32), 3600 * hosts)
    phase = (host_idx * gpus + gpu) * 97
    row = (np.repeat(sec, hosts * gpus) + phase) % n_rec
    cycle = (np.repeat(sec, hosts * gpus) + phase) // n_rec
    out = {"host": pa.array([f"bench-host-{h:02d}" for h in range(hosts)])
           .take(pa.array(host_idx)), "gpu": gpu, "t": t}
    for name, v in cols.items():
        x = v[row]
        if cat.BY_NAME[name].kind is cat.Kind.COUNTER:       # keep counters increasing across cycles
            span = np.nanmax(v) - np.nanmin(v) if np.isfinite(v).any() else 0.0
            x = x + cycle * span
        out[name] = pa.array(x, from_pandas=True)             # NaN -> NULL, as ingest stores it
    return pa.table(out)


VERDICTS = ("compute-bound", "memory-bound", "host-bound", "idle")


def hour_windows(hosts: int, gpus: int, start: float, hour: int, window_s: float,
                 rng: np.random.Generator) -> pa.Table:
    """The windows the live analysis writes for that hour: a row per GPU and window."""
    per_hour = int(3600 / window_s)
    w0 = start + hour * 3600 + np.arange(per_hour) * window_s
    n = per_hour * hosts * gpus
    st = np.repeat(w0, hosts * gpus)
    host_idx = np.tile(np.repeat(np.arange(hosts), gpus), per_hour)
    gpu = np.tile(np.arange(gpus, dtype=np.int32), per_hour * hosts)
    episode = ((st - start) // 600 + host_idx * 7 + gpu * 3).astype(int) % len(VERDICTS)   # 10-min episodes
    util, mem = rng.integers(40, 100, n), rng.integers(5, 95, n)
    summary = [f"GPU busy {u}% of the time but memory only {m}% (tensor pipes {u - 5}% busy)"
               for u, m in zip(util.tolist(), mem.tolist())]
    return pa.table({"host": pa.array([f"bench-host-{h:02d}" for h in range(hosts)]).take(pa.array(host_idx)),
                     "gpu": gpu, "start": st, "end": st + window_s,
                     "verdict": pa.array(VERDICTS).take(pa.array(episode)),
                     "confidence": np.round(0.6 + 0.4 * rng.random(n), 3), "flags": ["[]"] * n,
                     "summary": summary})


def hour_processes(samples: pa.Table, rng: np.random.Generator) -> pa.Table:
    """One training process per GPU, a row per sample (the agent sends the
    GPU's processes every tick)."""
    n = samples.num_rows
    gpu = samples["gpu"].to_numpy()
    return pa.table({"host": samples["host"], "gpu": samples["gpu"], "t": samples["t"],
                     "pid": (4000 + gpu * 13).astype(np.int64),
                     "used_memory_bytes": samples["mem_used_bytes"].to_numpy(zero_copy_only=False).astype(np.int64),
                     "cpu_cores": np.round(samples["procs_cpu_cores"].to_numpy(zero_copy_only=False)
                                           + rng.normal(0, 0.01, n), 4),
                     "command": pa.array(["python train.py --config configs/llama-70b.yaml --nodes 16"] * n)})


def sizes(store: Store, path: str) -> dict:
    store._con.execute("CHECKPOINT").fetchall()
    total, used, free, block = store._con.execute(
        "SELECT total_blocks, used_blocks, free_blocks, block_size FROM pragma_database_size()").fetchall()[0]
    return dict(file_bytes=os.path.getsize(path), used_bytes=int(used) * int(block), free_bytes=int(free) * int(block))


def fill(store: Store, cols, hosts: int, gpus: int, start: float, hours: int, seed: int,
         tables=("samples", "windows", "processes")) -> float:
    """Hour by hour, a transaction each, as the writer appends them."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for h in range(hours):
        samples = hour_table(cols, hosts, gpus, start, h, np.random.default_rng(seed * 100_003 + h))
        store.begin()
        if "samples" in tables:
            store.append("samples", samples)
        if "windows" in tables:
            store.append("windows", hour_windows(hosts, gpus, start, h, 5.0, rng))
        if "processes" in tables:
            store.append("processes", hour_processes(samples, rng))
        store.commit()
    return time.perf_counter() - t0


def devices_and_snapshot(store: Store, hosts: int, gpus: int, last_seen: float, snapshot: bool) -> None:
    store.upsert_devices([(f"bench-host-{h:02d}", g, f"GPU-{h}-{g}", "NVIDIA H200", "hopper", None, None, None,
                           None, True, False, "nvml (GPM)", None, None, "", last_seen)
                          for h in range(hosts) for g in range(gpus)])
    store.upsert_agents([(f"bench-host-{h:02d}", "boot", 1, last_seen, 0, "1-1") for h in range(hosts)])
    if snapshot:
        store.upsert_gpu_state([(f"bench-host-{h:02d}", g, "compute-bound", 0.9, "[]", last_seen - 5, last_seen,
                                 last_seen, last_seen) for h in range(hosts) for g in range(gpus)])


def analyzer_start(path: str, now: float) -> float:
    t0 = time.perf_counter()
    a = Analyzer(AnalyzerConfig(path, window_s=5.0), clock=Clock(now))
    dt = time.perf_counter() - t0
    a.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--timed-chunks", type=int, default=12, help="one-hour chunks to time one by one")
    ap.add_argument("--db", default=None)
    ns = ap.parse_args()
    cols = recording_columns()
    hours = int(round(ns.days * 24))
    gpu_days = ns.hosts * ns.gpus * hours / 24
    tmp = Path(tempfile.mkdtemp(prefix="gpuscope-retention-"))
    try:
        measure(ns, cols, hours, gpu_days, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(ns, cols, hours: int, gpu_days: float, tmp: Path) -> None:
    path = ns.db or str(tmp / "r.duckdb")
    end = math.floor(time.time() / 3600) * 3600 - 20 * DAY
    start = end - hours * 3600

    empty_path = str(tmp / "empty.duckdb")
    empty = Store(StoreConfig(empty_path))
    base = sizes(empty, empty_path)
    empty.close()

    store = Store(StoreConfig(path))
    fill_s = fill(store, cols, ns.hosts, ns.gpus, start, hours, seed=1, tables=("samples",))
    raw = sizes(store, path)
    fill_s += fill(store, cols, ns.hosts, ns.gpus, start, hours, seed=1, tables=("windows",))
    with_windows = sizes(store, path)
    fill_s += fill(store, cols, ns.hosts, ns.gpus, start, hours, seed=1, tables=("processes",))
    with_processes = sizes(store, path)
    rows = store.count("samples")
    devices_and_snapshot(store, ns.hosts, ns.gpus, end, snapshot=False)
    store.close()

    # An analyzer start on the filled file: first without a gpu_state snapshot
    # (a file from before it: windows and samples scanned whole), then with one.
    start_full = analyzer_start(path, end + 60)
    store = Store(StoreConfig(path))
    devices_and_snapshot(store, ns.hosts, ns.gpus, end, snapshot=True)
    store.close()
    start_snapshot = analyzer_start(path, end + 60)

    a = Analyzer(AnalyzerConfig(path, window_s=5.0), clock=Clock(end + 14 * DAY + 60))
    a.writer.start()
    ret: Retention = a.retention
    timed = []
    for _ in range(ns.timed_chunks):          # fixed one-hour chunks: the pause each imposes
        ret.chunk_s = 3600.0
        r = a.writer.call(ret.chunk).result(timeout=600)
        if not r["more"]:
            break
        if r["samples_deleted"]:
            timed.append(r)
    t0 = time.perf_counter()
    rest = a.run_retention(breather=False)    # adaptive from here on
    rest_wall = time.perf_counter() - t0
    rolled_rows = a.store.count("samples_1m")
    left = a.store.count("samples")
    rolled = sizes(a.store, path)

    # The same amount again, newer: are the freed blocks reused?
    fill(a.store, cols, ns.hosts, ns.gpus, end, hours, seed=2)
    refilled = sizes(a.store, path)
    a.close()

    per_chunk_rows = [r["samples_deleted"] for r in timed]
    chunk_s = [r["seconds"] for r in timed]
    per_day = lambda a, b: round((a["used_bytes"] - b["used_bytes"]) / gpu_days)   # noqa: E731
    raw_per_gpu_day = (raw["used_bytes"] - base["used_bytes"]) / gpu_days
    all_per_gpu_day = (with_processes["used_bytes"] - base["used_bytes"]) / gpu_days
    rollup_per_gpu_day = (rolled["used_bytes"] - base["used_bytes"]) / gpu_days
    out = dict(
        date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
        hosts=ns.hosts, gpus_per_host=ns.gpus, days=hours / 24, gpu_days=gpu_days, samples=rows,
        metric_columns_filled=sum(1 for v in cols.values() if np.isfinite(v).any()),
        fill_seconds=round(fill_s, 1), empty_store=base,
        raw=dict(with_processes, samples_bytes_per_gpu_day=round(raw_per_gpu_day),
                 bytes_per_sample=round(raw_per_gpu_day / 86400, 1),
                 windows_bytes_per_gpu_day=per_day(with_windows, raw),
                 processes_bytes_per_gpu_day=per_day(with_processes, with_windows),
                 all_bytes_per_gpu_day=round(all_per_gpu_day)),
        rolled_up=dict(rolled, rows=rolled_rows, raw_rows_left=left, bytes_per_gpu_day=round(rollup_per_gpu_day),
                       ratio_vs_samples=round(rollup_per_gpu_day / raw_per_gpu_day, 4),
                       ratio_vs_all=round(rollup_per_gpu_day / all_per_gpu_day, 4)),
        refilled_same_amount=refilled,
        one_hour_chunk=dict(chunks_timed=len(timed), rows_per_chunk=per_chunk_rows[0] if per_chunk_rows else 0,
                            p50_s=round(statistics.median(chunk_s), 4) if chunk_s else None,
                            max_s=round(max(chunk_s), 4) if chunk_s else None,
                            us_per_sample=round(statistics.median(chunk_s) / per_chunk_rows[0] * 1e6, 3)
                            if per_chunk_rows and per_chunk_rows[0] else None),
        adaptive_pass=dict(chunks=rest.chunks, writer_seconds=round(rest.seconds, 3),
                           longest_chunk_s=round(rest.longest_chunk_s, 4), wall_seconds=round(rest_wall, 2),
                           final_chunk_s=ret.chunk_s),
        analyzer_start_s=dict(without_snapshot=round(start_full, 3), with_snapshot=round(start_snapshot, 3)),
        steady_state_bytes_per_gpu=round(14 * all_per_gpu_day + 365 * rollup_per_gpu_day),
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
