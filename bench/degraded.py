"""Degraded GPUs fleet-wide (analyzers/degraded.py): precision and recall on
a simulated fleet, and the time the analysis takes over 10,000 GPUs.

    python bench/degraded.py [--hosts 500] [--seeds 10] [--timing-gpus 10000] [--runs 5]

The fleet is tests/analyzers/test_degraded.py's `simulated_fleet`: hosts of
H100 or H200 on one of three drivers, 2-2.5 % noise between healthy GPUs,
20 planted GPUs per dimension 10-30 % under, 12 PCIe links at x8 or Gen4,
and 20 mild ones per dimension 3-5 % under that must not count. Scores are
pooled over `--seeds` fleets, at the documented thresholds and with each
condition alone; then again on a fleet twice as noisy. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.analyzers.test_degraded import simulated_fleet, score  # noqa: E402

from gpuscope.analyzers.degraded import DegradedConfig, clocks_at_power_sql, find_degraded  # noqa: E402

RULES = {"documented": DegradedConfig(),
         "shortfall alone": DegradedConfig(max_z=float("inf")),
         "z alone": DegradedConfig(min_shortfall=float("-inf"))}


def accuracy(hosts: int, seeds: int, noise: float = 1.0) -> dict:
    con = duckdb.connect()
    fleets = [simulated_fleet(hosts, seed=s, noise=noise) for s in range(seeds)]
    out = {}
    for name, config in RULES.items():
        pooled, overall = {}, []
        for table, truth in fleets:
            s = score(find_degraded(con, table, config), truth)
            overall.append(s["all"])
            for dim, v in s.items():
                p = pooled.setdefault(dim, dict(planted=0, found=0, true_positives=0))
                for k in p:
                    p[k] += v[k]
        for p in pooled.values():
            p["precision"] = round(p["true_positives"] / p["found"], 4) if p["found"] else 1.0
            p["recall"] = round(p["true_positives"] / p["planted"], 4) if p["planted"] else 1.0
        out[name] = dict(pooled=pooled, worst_seed_precision=round(min(o["precision"] for o in overall), 4),
                         worst_seed_recall=round(min(o["recall"] for o in overall), 4))
    return out


def timing(gpus: int, runs: int, samples_per_gpu: int) -> dict:
    table, _ = simulated_fleet(gpus // 8, seed=0)
    con = duckdb.connect()
    con.register("fleet", table)
    con.execute("CREATE TABLE gpus AS SELECT * FROM fleet")

    def median_s(fn) -> float:
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
        return round(statistics.median(walls), 4)

    rng = np.random.default_rng(0)
    n = len(table) * samples_per_gpu
    limit = np.full(n, 700.0)
    samples = pa.table({"host": np.repeat(table["host"].to_numpy(zero_copy_only=False), samples_per_gpu),
                        "gpu": np.repeat(table["gpu"].to_numpy(), samples_per_gpu),
                        "t": np.tile(np.arange(samples_per_gpu, dtype=float), len(table)),
                        "sm_clock_hertz": rng.normal(1.8e9, 3e7, n), "power_watts": rng.uniform(300, 700, n),
                        "power_limit_watts": limit})
    con.register("samples_arrow", samples)
    con.execute("CREATE TABLE samples AS SELECT * FROM samples_arrow")
    sql = clocks_at_power_sql("samples", min_samples=5)
    return dict(gpus=len(table), runs=runs, findings=len(find_degraded(con, "gpus")),
                duckdb_table_s=median_s(lambda: find_degraded(con, "gpus")),
                arrow_table_s=median_s(lambda: find_degraded(con, table)),
                clocks_at_power_samples=n, clocks_at_power_s=median_s(lambda: con.execute(sql).fetchall()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--timing-gpus", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--samples-per-gpu", type=int, default=60)
    args = ap.parse_args()
    c = DegradedConfig()
    print(json.dumps(dict(
        machine=dict(cpus=len(os.sched_getaffinity(0)), python=platform.python_version(),
                     duckdb=duckdb.__version__),
        thresholds=dict(min_shortfall=c.min_shortfall, max_z=c.max_z, min_peers=c.min_peers,
                        scale_floor=c.scale_floor),
        fleet=dict(hosts=args.hosts, gpus=args.hosts * 8, seeds=args.seeds),
        accuracy=accuracy(args.hosts, args.seeds),
        # a fleet whose healthy GPUs spread twice as wide (4-5 %): where the z bound earns its keep
        accuracy_noise_x2=accuracy(args.hosts, args.seeds, noise=2.0),
        timing=timing(args.timing_gpus, args.runs, args.samples_per_gpu)), indent=1))


if __name__ == "__main__":
    main()
