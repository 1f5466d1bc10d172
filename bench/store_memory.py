"""What DuckDB's cap (the analyzer's --memory-limit) does to the analysis
process's memory while it stores a fleet's samples, and what it costs.

    python bench/store_memory.py [--agents 2000] [--rounds 24] [--memory-limit 300MB]
                                 [--threads 2] [--checkpoint-threshold 64MB]

The batches of bench/fleet_grpc.py (8 GPUs of the bundled H200 recording, 5 s
of 1 Hz samples each, every agent at its own offset), decoded by the
analyzer's own `ingest.decode` a round at a time and stored through the
writer's own commit path (`Writer._store_safely`, groups of 256), on this
thread, with no live analysis. The process's RSS is read every 10 ms:
reported are its median and maximum over the last four fifths of the run, the
samples more than 50 MB over the median (DuckDB's checkpoint peaks), a coarse
series, and the wall time of the stores. Run it once per setting and compare.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) >> 10
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=24, help="batches per agent (5 s of samples each)")
    ap.add_argument("--memory-limit", default="300MB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--checkpoint-threshold", default="64MB")
    ns = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    import fleet_grpc
    from gpuscope.analyzers.engine import tune_runtime
    from gpuscope.analyzers.ingest import decode
    from gpuscope.analyzers.store import Store, StoreConfig
    from gpuscope.analyzers.writer import Writer
    from gpuscope.v1 import samples_pb2 as pb

    tune_runtime()
    workdir = tempfile.mkdtemp()
    store = Store(StoreConfig(os.path.join(workdir, "m.duckdb"), memory_limit=ns.memory_limit, threads=ns.threads,
                              checkpoint_threshold=ns.checkpoint_threshold))
    writer = Writer(store, lambda _batches: None)
    rss: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss.append(_rss_mb())
            time.sleep(0.01)
    threading.Thread(target=sample, daemon=True).start()
    bodies = fleet_grpc.build_bodies(5, 12)
    random.seed(1)
    t0 = np.floor(time.time() / 5) * 5 - ns.rounds * 5 - 20       # within the decoder's accepted ages
    agents = [dict(host=f"sim-{i:05d}", boot=os.urandom(8).hex(), seq=0, offset=random.randrange(len(bodies)))
              for i in range(ns.agents)]
    stored_s = 0.0
    for r in range(ns.rounds):
        batches = []
        for g in agents:
            g["seq"] += 1
            wire = fleet_grpc.batch_bytes(bodies, 5, g["host"], g["boot"], g["seq"], g["offset"], t0 + r * 5 + 5)
            batches.append(decode(pb.SampleBatch.FromString(wire)))
        c = time.perf_counter()
        for i in range(0, len(batches), 256):
            writer._store_safely([(b, Future()) for b in batches[i:i + 256]])
        stored_s += time.perf_counter() - c
    done.set()
    steady = np.array(rss[len(rss) // 5:])
    median = float(np.median(steady))
    print(json.dumps(dict(
        date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
        memory_limit=ns.memory_limit, threads=ns.threads, checkpoint_threshold=ns.checkpoint_threshold,
        agents=ns.agents, batches=ns.agents * ns.rounds, stored_s=round(stored_s, 1),
        rss_median_mb=int(median), rss_max_mb=int(steady.max()),
        samples_50mb_over_median=int((steady - median > 50).sum()),
        rss_series_mb=[int(x) for x in np.array(rss)[::max(1, len(rss) // 12)]]), indent=1))
    store.close()


if __name__ == "__main__":
    main()
