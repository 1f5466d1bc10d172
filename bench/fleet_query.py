"""Fleet tier: `gpuscope fleet query` over 30 days x 1,000 hosts of per-minute
rollups in Parquet (local files), timed end to end through the CLI.

    python bench/fleet_query.py --dir /tmp/fleet-bench [--hosts 1000] [--days 30] [--gpus 8]

Generates (once; an existing data set of the same shape is reused) what the
publisher leaves after compaction: one segment per table, date, cluster and
host (`part-0000-2400.parquet`), rows as analyzers/store.py's fleet_rows
makes them (every catalogue metric a column). Values: 8 metrics are filled
at the resolution the agents report them (NVML's utilisation in whole
percent, so a minute's mean of 60 samples is a multiple of 1/6000; power
and temperature in whole units; GPM ratios to 0.001); the other 45
(serving engines', counters' totals, ...) are NULL, as on a fleet of
training jobs without serving engines. Jobs last 2 days per host, verdict
episodes 4 hours per GPU.

Then it runs, each as a fresh `gpuscope` process (imports, listing,
DuckDB), three times: top-jobs --since 24h, top-jobs --since 30d,
hosts-changed over 7 days either side of a date, and prints the times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuscope.analyzers import fleet_layout as lay
from gpuscope.collectors import catalogue as cat

VERDICTS = np.array(["compute-bound", "compute-bound", "compute-bound", "compute-bound", "memory-bound",
                     "memory-bound", "host-bound", "launch-bound", "communication-bound", "idle"])
CLUSTERS = 4


def _host_day(args) -> int:
    root, host_i, day_start, gpus = args
    seg = lay.Segment("rollups", lay.date_of(day_start), f"c{host_i % CLUSTERS}", f"gpu-node-{host_i:04d}", 0, 1440)
    path = Path(root) / seg.key
    if path.exists():                                              # a generation cut off resumes
        return path.stat().st_size
    rng = np.random.default_rng(host_i * 100_003 + int(day_start // 86400))
    minutes = 1440
    n = minutes * gpus
    m = np.repeat(np.arange(minutes), gpus)                        # ordered by t, then GPU
    gpu = np.tile(np.arange(gpus, dtype=np.int32), minutes)
    t = day_start + 60.0 * m
    absolute = (day_start // 60 + m).astype(np.int64)
    episode = (absolute // 240) * 131 + gpu * 7 + host_i * 13     # 4-hour verdict episodes per GPU
    verdict = VERDICTS[(episode * 2654435761 % 2**32) % len(VERDICTS)]
    job_slot = (absolute // 2880 + host_i * 17)                    # a host's job runs 2 days
    job_n = job_slot * 40503 % 50
    job = np.char.add(np.char.add("python train_", job_n.astype(str)), ".py")
    pod_n = job_slot * 7919 % 5000
    pod = np.char.add("trainer-", pod_n.astype(str))
    ns = np.char.add("team-", (job_slot % 12).astype(str))
    fid = np.char.add("f-", (episode % 10**8).astype(str))
    cols = {"gpu": pa.array(gpu), "t": pa.array(t), "samples": pa.array(np.full(n, 60, np.int64)),
            "verdict": pa.array(verdict), "job": pa.array(job), "finding_id": pa.array(fid),
            "namespace": pa.array(ns), "pod": pa.array(pod), "slurm_job": pa.nulls(n, pa.string())}
    filled = {"util_gpu_ratio": np.round(rng.uniform(0.3, 1.0, n) * 6000) / 6000,
              "util_mem_ratio": np.round(rng.uniform(0.0, 1.0, n) * 6000) / 6000,
              "power_watts": np.round(rng.uniform(150, 700, n)),
              "temp_celsius": np.round(rng.uniform(40, 80, n)),
              "sm_clock_hertz": 1.98e9 - 1.5e7 * rng.integers(0, 20, n),
              "gpm_sm_util_ratio": np.round(rng.uniform(0, 1, n), 3),
              "gpm_tensor_util_ratio": np.round(rng.uniform(0, 1, n), 3),
              "gpm_dram_bw_util_ratio": np.round(rng.uniform(0, 1, n), 3)}
    for metric in cat.METRICS:
        cols[metric.name] = pa.array(filled[metric.name]) if metric.name in filled else pa.nulls(n, pa.float64())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.table(cols), tmp, compression="zstd")     # as the publisher writes
    tmp.rename(path)
    return path.stat().st_size


def generate(root: Path, hosts: int, days: int, gpus: int, first_day: float, workers: int) -> dict:
    marker = root / "bench.json"
    shape = dict(hosts=hosts, days=days, gpus=gpus, first_day=first_day)
    if marker.exists() and json.loads(marker.read_text()).get("shape") == shape:
        return json.loads(marker.read_text())
    t0 = time.perf_counter()
    # newest day first: the last day's files are what --since 24h reads
    jobs = [(str(root), h, first_day + d * 86400.0, gpus) for d in reversed(range(days)) for h in range(hosts)]
    with ProcessPoolExecutor(workers) as pool:
        size = sum(pool.map(_host_day, jobs, chunksize=64))
    info = dict(shape=shape, rows=hosts * days * gpus * 1440, files=len(jobs), bytes=size,
                generate_seconds=round(time.perf_counter() - t0, 1))
    marker.write_text(json.dumps(info))
    return info


def timed(argv: list[str], repeat: int) -> tuple[list[float], str]:
    times, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {r.stderr}")
        out = r.stdout
    return times, out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ns = p.parse_args()
    root = Path(ns.dir)
    today = time.time() // 86400 * 86400
    first = today - (ns.days - 1) * 86400             # the last day is today: --since 24h has a day of data
    info = generate(root, ns.hosts, ns.days, ns.gpus, first, ns.workers)
    print(f"data: {info['rows']:,} rows in {info['files']:,} files, {info['bytes'] / 1e9:.2f} GB "
          f"(generated in {info['generate_seconds']} s)")
    gpuscope = [sys.executable, "-m", "gpuscope.daemon.cli"]
    mid = lay.date_of(first + ns.days // 2 * 86400)
    questions = {
        "top-jobs --since 24h": ["fleet", "query", "top-jobs", "--since", "24h", "--limit", "10"],
        "top-jobs --since 30d": ["fleet", "query", "top-jobs", "--since", f"{ns.days}d", "--limit", "10"],
        "top-jobs --since 24h --by pod --verdict memory-bound": ["fleet", "query", "top-jobs", "--since", "24h",
                                                                 "--by", "pod", "--verdict", "memory-bound"],
        f"hosts-changed --after {mid} --to memory-bound (7d either side)":
            ["fleet", "query", "hosts-changed", "--after", mid, "--to", "memory-bound", "--limit", "10"],
    }
    results = {}
    for name, args in questions.items():
        times, out = timed(gpuscope + args + ["--from", str(root)], ns.repeat)
        results[name] = times
        print(f"{name}: median {statistics.median(times):.2f} s, all {', '.join(f'{t:.2f}' for t in times)}")
    print(out)
    print(json.dumps(dict(machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                          data=info, seconds=results)))


if __name__ == "__main__":
    main()
