"""What one batch costs the analyzer's Python, stage by stage, in process.

    python bench/analysis_cost.py [--agents 500] [--seconds 60] [--flush 5] [--slow 1]
                                  [--group N] [--default-gc]

The same batches as bench/fleet_grpc.py (8 GPUs of the bundled H200
recording, each agent at its own offset, `--flush` seconds of 1 Hz samples a
batch), without gRPC and on one thread. Each is decoded (`ingest.decode`),
then committed by the writer's own path (`Writer._commit`, in groups of
`--group`, by default the writer's largest, as it forms them when behind),
which stores it and runs the live analysis. Reported: CPU per batch for
decode, for storing, and for the live analysis. The analysis is also given
per GPU-window, broken down by its parts (wall time of each, nested parts
included in their parents). The process runs with the analyzer's collector
thresholds (`engine.tune_runtime`) unless `--default-gc`.

`--loop` runs the writer's own thread instead (its commit thread storing
group N+1 while group N is analysed), fed a steady backlog, and reports the
wall time and batches per second: what the overlap buys on this machine.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PARTS = [("analyzers.live", "LiveWindows", "add"), ("analyzers.live", "LiveWindows", "close_pending"),
         ("analyzers.live", None, "feature_matrix"), ("analyzers.live", None, "compute_windows"),
         ("analyzers.live", None, "classify_many"), ("analyzers.live", None, "stack"),
         ("analyzers.analyzer", "Analyzer", "_record"), ("analyzers.analyzer", "Analyzer", "_persist_findings"),
         ("analyzers.findings", "FindingsTracker", "observe"), ("analyzers.detector", "Detector", "observe"),
         ("analyzers.detector", "Detector", "_compare"),
         ("analyzers.store", "Store", "commit")]


def _time_parts(totals: collections.Counter) -> None:
    import importlib
    for mod, cls, name in PARTS:
        owner = importlib.import_module(f"gpuscope.{mod}")
        owner = getattr(owner, cls) if cls else owner
        f = getattr(owner, name)
        label = f"{cls + '.' if cls else ''}{name}"

        def timed(*a, _f=f, _label=label, **k):
            c = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                totals[_label] += time.perf_counter() - c
        setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=500)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--flush", type=int, default=5)
    ap.add_argument("--slow", type=int, default=1, help="as bench/fleet_grpc.py --slow: phases last N times longer")
    ap.add_argument("--group", type=int, default=0, help="batches a group (default: the writer's MAX_GROUP)")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the writer's path into FILE")
    ap.add_argument("--loop", action="store_true", help="the writer's own threads, wall time (see above)")
    ap.add_argument("--default-gc", action="store_true",
                    help="Python's default collector thresholds, not the analyzer's (engine.tune_runtime)")
    ns = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parts: collections.Counter = collections.Counter()
    _time_parts(parts)
    import fleet_grpc
    from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
    from gpuscope.analyzers.engine import settle_heap, tune_runtime
    from gpuscope.analyzers.ingest import decode
    from gpuscope.analyzers.writer import MAX_GROUP
    from gpuscope.v1 import samples_pb2 as pb

    bodies = fleet_grpc.build_bodies(ns.flush, ns.slow)
    if not ns.default_gc:
        tune_runtime()
    a = Analyzer(AnalyzerConfig(os.path.join(tempfile.mkdtemp(), "cost.duckdb")))
    if not ns.default_gc:
        settle_heap()
    random.seed(1)
    t0 = np.floor(time.time() / 5) * 5 - ns.seconds - 20
    agents = [dict(host=f"sim-{i:05d}", boot=os.urandom(8).hex(), seq=0, offset=random.randrange(len(bodies)),
                   phase=random.random()) for i in range(ns.agents)]

    def message(g: dict, t: float) -> pb.SampleBatch:
        g["seq"] += 1
        return pb.SampleBatch.FromString(
            fleet_grpc.batch_bytes(bodies, ns.flush, g["host"], g["boot"], g["seq"], g["offset"], t))

    msgs = [message(g, t0 + s + g["phase"] + ns.flush) for s in range(0, ns.seconds, ns.flush) for g in agents]
    c = time.process_time()
    decoded = [decode(m) for m in msgs]
    decode_s = time.process_time() - c
    if ns.loop:
        _loop(a, decoded, ns)
        return
    analysis = [0.0]
    commit_analysis = a.writer._after_commit

    def analyse(batches):
        c0 = time.process_time()
        commit_analysis(batches)
        analysis[0] += time.process_time() - c0
    a.writer._after_commit = analyse
    prof = None
    if ns.profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    c = time.process_time()
    group = ns.group or MAX_GROUP
    for i in range(0, len(decoded), group):
        a.writer._commit([(b, Future()) for b in decoded[i:i + group]])
    writer_s = time.process_time() - c
    if prof is not None:
        prof.disable()
        prof.dump_stats(ns.profile)
    windows = a.store.count("windows")
    n = len(decoded)
    out = dict(date=time.strftime("%Y-%m-%d"), gc="default" if ns.default_gc else "tuned", group=group,
               agents=ns.agents, seconds=ns.seconds, flush_s=ns.flush, slow=ns.slow, batches=n,
               gpu_windows=windows, decode_us_per_batch=round(decode_s / n * 1e6),
               store_us_per_batch=round((writer_s - analysis[0]) / n * 1e6),
               analysis_us_per_batch=round(analysis[0] / n * 1e6),
               analysis_us_per_window=round(analysis[0] / max(windows, 1) * 1e6, 1),
               parts_us_per_window={k: round(v / max(windows, 1) * 1e6, 1) for k, v in parts.most_common()})
    print(json.dumps(out, indent=1))
    a.close()


def _loop(a, decoded, ns) -> None:
    a.writer.start()
    c, w = time.process_time(), time.perf_counter()
    futs = []
    for i in range(0, len(decoded), 512):       # a steady backlog of at most ~1,000 batches, as under load
        futs += [a.writer.submit(b) for b in decoded[i:i + 512]]
        while len(futs) > 1024 and not futs[-1024].done():
            time.sleep(0.002)
    a.writer.call(lambda _s: None).result(600)
    wall = time.perf_counter() - w
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d"), agents=ns.agents, seconds=ns.seconds, flush_s=ns.flush,
                          slow=ns.slow, batches=len(decoded), wall_s=round(wall, 2),
                          cpu_s=round(time.process_time() - c, 2), batches_per_s=round(len(decoded) / wall),
                          committed=a.writer.batches), indent=1))
    a.close()


if __name__ == "__main__":
    main()
