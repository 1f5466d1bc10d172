"""The job-level analysis (analyzers/stragglers.py) for a fleet of
distributed jobs, against the live analysis it sits beside.

    python bench/stragglers.py [--jobs 1000] [--ranks 64] [--repeats 5]

Each job's ranks over one fleet check's span: most communication-bound, in
every 10th job one rank host-bound (planted: found exactly those), SM
activity and clocks with noise. Prints JSON: the analysis time (median of
the repeats), what it found, and that time against the live analysis of
the same GPUs for one window (docs/benchmarks.md: 121 us a GPU-window),
once per window and amortized over a 5-minute check's 60 windows.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers import programs as pg  # noqa: E402
from gpuscope.analyzers.stragglers import find_stragglers  # noqa: E402

GPU_WINDOW_S = 121e-6          # live analysis of one GPU-window (bench/analysis_cost.py, docs/benchmarks.md)


def fleet(jobs: int, ranks: int, rng: np.random.Generator) -> tuple[list[dict], dict[str, dict]]:
    runs, interval = [], {}
    for j in range(jobs):
        for r in range(ranks):
            run = pg.new_run(f"node-{(j * ranks + r) // 8:05d}", 1000 + r, f"python train.py --job {j}", 0.0,
                             {"dist_job": f"slurm:{j}.0", "rank": str(r), "world_size": str(ranks)})
            run["gpus"] = [r % 8]
            runs.append(run)
            slow = j % 10 == 0 and r == 7
            interval[run["id"]] = dict(
                verdicts={"host-bound" if slow else "communication-bound": 60},
                gpm_sm_util_ratio=(0.05 if slow else 0.3) + rng.normal(0, 0.02),
                sm_clock_hertz=1.98e9 * (1 + rng.normal(0, 0.005)), power_watts=450 + rng.normal(0, 10))
    return runs, interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs, interval = fleet(args.jobs, args.ranks, np.random.default_rng(5))
    times, found = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        found = find_stragglers(runs, interval)
        times.append(time.perf_counter() - t)
    gpus = args.jobs * args.ranks
    took = statistics.median(times)
    window = gpus * GPU_WINDOW_S
    planted = {f"slurm:{j}.0 rank 7" for j in range(0, args.jobs, 10)}
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} CPUs",
                          jobs=args.jobs, ranks=args.ranks, gpus=gpus, seconds=[round(x, 3) for x in times],
                          median_s=round(took, 3), found=len(found), found_planted=len({f["job"] for f in found} & planted),
                          planted=len(planted), live_window_s=round(window, 2),
                          ratio_if_every_window=round(took / window, 3),
                          ratio_amortized_over_a_check=round(took / 60 / window, 5)), indent=1))


if __name__ == "__main__":
    main()
