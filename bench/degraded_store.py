"""`gpuscope degraded` as the analyzer answers it: the inputs gathered from
the store (Store.degraded_inputs: devices, each GPU's current calibration,
the SM clock at the power limit over the last hour of samples) and the peer
analysis over them, for a fleet of GPUs in one DuckDB file.

    python bench/degraded_store.py [--gpus 10000] [--minutes 60] [--every 5] [--runs 3]

Samples: one per GPU every `--every` seconds over `--minutes` (an agent's
1 Hz stored at 5 s is what a week of retention rolls into; 1 Hz for an
hour is `--every 1`), sm_clock_hertz, power_watts and power_limit_watts,
60 % of them at the power limit; every 997th GPU planted slow at the limit,
and the next one with a weak HBM ceiling (both must be found). Prints JSON: rows stored, the time to
load them (not the target), and per run the inputs query and the analysis.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers.degraded import find_degraded  # noqa: E402
from gpuscope.analyzers.store import CALIBRATION_COLUMNS, Store, StoreConfig  # noqa: E402


PLANT = 997           # every 997th GPU slow at the power limit, the next one's HBM weak


def build(store: Store, gpus: int, minutes: float, every: float, now: float, rng: np.random.Generator) -> int:
    hosts = [f"node-{i // 8:05d}" for i in range(gpus)]
    idx = [i % 8 for i in range(gpus)]
    uuids = [f"GPU-{i:08d}" for i in range(gpus)]
    store.upsert_devices([(h, g, u, "NVIDIA H200", "hopper", 150_754_820_096, 700.0, 5, 16, True, False, "nvml (GPM)",
                           5, 16, "570.124.06", now) for h, g, u in zip(hosts, idx, uuids)])
    t = np.arange(now - minutes * 60, now, every)
    n = len(t)
    total = 0
    for lo in range(0, gpus, 1000):             # appended in slices: one Arrow table of 36 M rows is 1.4 GB
        part = range(lo, min(gpus, lo + 1000))
        k = len(part) * n
        clock = 1.83e9 * (1 + rng.normal(0, 0.01, len(part)))
        clock[[j for j, i in enumerate(part) if i % PLANT == 1]] *= 0.8       # planted: 20 % slower at the limit
        clock = np.repeat(clock, n)
        at_limit = rng.random(k) < 0.6
        store.append("samples", pa.table({
            "host": np.repeat([hosts[i] for i in part], n), "gpu": np.repeat([idx[i] for i in part], n).astype(np.int32),
            "t": np.tile(t, len(part)), "sm_clock_hertz": np.where(at_limit, clock, 1.2e9),
            "power_watts": np.where(at_limit, 690.0, 400.0), "power_limit_watts": np.full(k, 700.0)}))
        total += k
    cals, ceilings = [], []
    for i in range(gpus):
        cid = f"cal-{i:08d}"
        cals.append(tuple({"id": cid, "host": hosts[i], "gpu": idx[i], "uuid": uuids[i], "model": "NVIDIA H200",
                           "driver": "570.124.06", "platform": "gpu", "started_at": now - 86400,
                           "received": now - 86400, "quick": True, "forced": False}.get(c) for c in CALIBRATION_COLUMNS))
        for name, unit, v in (("hbm_triad", "bytes_per_second", 4.25e12), ("matmul_bf16", "flop_per_second", 7.8e14),
                              ("h2d", "bytes_per_second", 5.3e10)):
            weak = 0.8 if name == "hbm_triad" and i % PLANT == 2 else 1.0     # planted: a weak HBM
            ceilings.append((cid, uuids[i], hosts[i], idx[i], name, unit, v * weak * (1 + rng.normal(0, 0.02))))
    store.append("calibrations", pa.table({c: [r[j] for r in cals] for j, c in enumerate(CALIBRATION_COLUMNS)}))
    store.append("ceilings", pa.table({c: [r[j] for r in ceilings] for j, c in enumerate(
        ("calibration_id", "uuid", "host", "gpu", "name", "unit", "value"))}))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(os.path.join(tmp, "bench.duckdb"), memory_limit="4GB"))
        t0 = time.perf_counter()
        rows = build(store, a.gpus, a.minutes, a.every, now, np.random.default_rng(1))
        load_s = time.perf_counter() - t0
        runs = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            inputs = store.degraded_inputs(now - a.minutes * 60, now)
            t1 = time.perf_counter()
            found = find_degraded(duckdb.connect(), inputs)
            planted = 2 * len(range(1, a.gpus, PLANT))
            runs.append(dict(inputs_s=round(t1 - t0, 3), analysis_s=round(time.perf_counter() - t1, 3),
                             gpus=inputs.num_rows, found=len(found), planted=planted))
        store.close()
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=platform.node(),
                          cpus=os.cpu_count(), load=os.getloadavg()[0], gpus=a.gpus, samples=rows,
                          load_s=round(load_s, 1), runs=runs,
                          median_total_s=round(statistics.median(r["inputs_s"] + r["analysis_s"] for r in runs), 3)),
                     indent=1))


if __name__ == "__main__":
    main()
