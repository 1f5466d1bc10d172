"""The program check of one fleet check (analyzers/program_check.py) over a
fleet of GPUs in one DuckDB file: the new samples, processes and windows
since the last check made into runs, every run judged against its program's
earlier runs, the runs written.

    python bench/programs.py [--gpus 10000] [--minutes 5] [--programs 200] [--history 20]

The fleet: one process per GPU (as torchrun and multi-process JAX start
them), `--programs` distinct command lines each on an equal share of the
GPUs, `--history` earlier runs of each program already in the store, and
`--minutes` of 1 Hz samples (the interval between two checks at the default
5m) with their processes and 5 s windows. Every 500th GPU's run is planted
with DRAM activity 40 % under its program's: those, and only those, must be
found. Two checks run: the first makes the runs, the second extends them
with the next `--minutes`. Prints JSON: rows, and each check's time split
into collect (reads), judge and apply (the writer's share).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers import programs as pg  # noqa: E402
from gpuscope.analyzers.program_check import CURSOR, ProgramCheck  # noqa: E402
from gpuscope.analyzers.store import Store, StoreConfig  # noqa: E402

PLANT = 500


def command(p: int) -> str:
    return f"python3 /srv/job-{p}/train.py --model m{p} --seed 7 --output-dir /ckpt/{p}"


def history(store: Store, programs: int, runs: int, now: float, rng: np.random.Generator) -> None:
    rows = []
    for p in range(programs):
        for k in range(runs):
            r = pg.new_run(f"old-{k}", 1000 + p, command(p), now - 86400 * (k + 1), {})
            dram = 0.7 * (1 + rng.normal(0, 0.02))
            r.update(end=r["start"] + 3600, sampled_s=3600.0, gpus=[0],
                     signature={"gpm_dram_bw_util_ratio": [dram * 3600, 3600], "util_gpu_ratio": [3600.0, 3600]},
                     verdicts={"memory-bound": 720})
            rows.append(pg.run_row(r))
    store.upsert_program_runs(rows)


def samples(store: Store, gpus: int, programs: int, lo: float, seconds: int, rng: np.random.Generator) -> int:
    t = lo + np.arange(seconds, dtype=np.float64)
    for start in range(0, gpus, 2000):
        part = np.arange(start, min(gpus, start + 2000))
        hosts = np.repeat([f"node-{i // 8:05d}" for i in part], seconds)
        gpu = np.repeat(part % 8, seconds).astype(np.int32)
        tt = np.tile(t, len(part))
        dram = np.where(part % PLANT == 7, 0.42, 0.7) * (1 + rng.normal(0, 0.02, len(part)))
        store.append("samples", pa.table({"host": hosts, "gpu": gpu, "t": tt,
                                          "gpm_dram_bw_util_ratio": np.repeat(dram, seconds),
                                          "util_gpu_ratio": np.ones(len(tt))}))
        cmds = [command(i % programs) for i in part]
        store.append("processes", pa.table({"host": hosts, "gpu": gpu, "t": tt,
                                            "pid": np.repeat(100_000 + part, seconds).astype(np.int64),
                                            "command": np.repeat(cmds, seconds)}))
        w = np.arange(0, seconds, 5)
        store.append("windows", pa.table({
            "host": np.repeat([f"node-{i // 8:05d}" for i in part], len(w)),
            "gpu": np.repeat(part % 8, len(w)).astype(np.int32),
            "start": np.tile(lo + w, len(part)), "end": np.tile(lo + w + 5, len(part)),
            "verdict": np.full(len(part) * len(w), "memory-bound")}))
    return gpus * seconds


def one_check(check: ProgramCheck, store: Store, now: float) -> tuple[dict, list[dict]]:
    t0 = time.perf_counter()
    runs, cursor, _ = check.collect(now)
    t1 = time.perf_counter()
    found = check.judge(runs, {})
    t2 = time.perf_counter()
    check.apply(runs, cursor)
    t3 = time.perf_counter()
    return dict(runs=len(runs), collect_s=round(t1 - t0, 3), judge_s=round(t2 - t1, 3), apply_s=round(t3 - t2, 3),
                total_s=round(t3 - t0, 3)), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--history", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    seconds = int(args.minutes * 60)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(os.path.join(tmp, "programs.duckdb"), memory_limit="4GB"))
        now = 1_800_000_000.0
        config = pg.ProgramsConfig(min_run_s=args.minutes * 60 * 0.9, lag_s=0.0)
        check = ProgramCheck(store, config)
        t = time.perf_counter()
        history(store, args.programs, args.history, now, rng)
        rows = samples(store, args.gpus, args.programs, now, seconds, rng)
        store.set_meta(CURSOR, now - 1)
        load_s = time.perf_counter() - t
        checks = []
        first, found = one_check(check, store, now + seconds)
        checks.append(first)
        rows += samples(store, args.gpus, args.programs, now + seconds, seconds, rng)
        second, found2 = one_check(check, store, now + 2 * seconds)
        checks.append(second)
        planted = {(f"node-{i // 8:05d}", i % 8) for i in range(args.gpus) if i % PLANT == 7}
        got = {(f["host"], f["gpu"]) for f in found2}
        store.close()
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d"), machine=f"{platform.node()} {os.cpu_count()} CPUs",
                          gpus=args.gpus, programs=args.programs, history_runs=args.programs * args.history,
                          sample_rows=rows, load_s=round(load_s, 1), checks=checks,
                          planted=len(planted), found=len(got), found_planted=len(got & planted)), indent=1))


if __name__ == "__main__":
    main()
