"""What streams sending large batches cost the analyzer's memory.

    python bench/stream_memory.py [--streams 12] [--seconds 30] [--samples 200000] [--env K=V ...]

The byte budget bounds the batches queued for the writer, not what each
stream holds before it gets there: the message it has read (its bytes and
the parsed batch) while it waits for the budget, and what gRPC buffers of
the next. Agents catching up after an outage send batches of up to 8 MiB on
every stream at once. This starts `gpuscope analyzer --insecure` on
loopback (its own DuckDB file in a temporary directory), opens N Ingest
streams from this process, each sending valid batches of `--samples`
samples of one GPU (3 metrics: 36 bytes a sample, 7.2 MB at the default)
back to back for `--seconds`, and reads the resident memory of the
analyzer's main (gRPC) process and of its analysis process every 2 s, then
for 10 s after the streams end. `--env MALLOC_MMAP_THRESHOLD_=1048576` and
the like run the analyzer with that environment, `--analyzer-args
'--memory-limit 200MB'` with those flags.

Prints one line every 2 s and a summary; writes bench/out/stream_memory-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet_grpc import OUT_DIR, free_port, git_tree, wait_ready  # noqa: E402
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb  # noqa: E402


def rss_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def big_batch(host: str, boot: str, seq: int, n: int) -> pb.SampleBatch:
    t0 = time.time() - 30
    b = pb.SampleBatch(host=host, boot_id=boot, seq=seq, count=n,
                       t_f64le=(t0 + np.arange(n) * (20.0 / n)).astype("<f8").tobytes(), gpu_u32le=bytes(4 * n))
    for metric in ("util_gpu_ratio", "util_mem_ratio", "power_watts"):
        b.columns.add(metric=metric, f64le=np.full(n, 0.5).astype("<f8").tobytes())
    b.devices.add(gpu=0, uuid=f"GPU-flood-{host}", name="NVIDIA H200", architecture="hopper")
    return b


def stream(port: int, i: int, seconds: float, n: int, out: dict) -> None:
    host, boot = f"flood-{i:03d}", f"boot-{i}-{time.time_ns()}"
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    stub = analyzer_pb2_grpc.AnalyzerStub(channel)
    end_at, sent, acked = time.time() + seconds, 0, 0

    def batches():
        nonlocal sent
        while time.time() < end_at:
            sent += 1
            yield big_batch(host, boot, sent, n)
    try:
        for _ in stub.Ingest(batches(), timeout=seconds + 60):
            acked += 1
        result = "OK"
    except grpc.RpcError as exc:
        result = exc.code().name
    channel.close()
    out[i] = dict(sent=sent, acked=acked, result=result)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--samples", type=int, default=200_000, help="samples a batch (36 bytes each)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="the analyzer's environment")
    ap.add_argument("--analyzer-args", default="", metavar="ARGS", help="more flags for `gpuscope analyzer`")
    ns = ap.parse_args()
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in ns.env))
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, open(f"{tmp}/analyzer.log", "w") as log:
        analyzer = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "warning", "analyzer",
                                     "--insecure", "--db", f"{tmp}/s.duckdb", "--listen", f"127.0.0.1:{port}",
                                     *shlex.split(ns.analyzer_args)],
                                    env=env, stderr=log)
        try:
            wait_ready(f"127.0.0.1:{port}", None)
            time.sleep(2)
            idle = rss_mb(analyzer.pid)
            results: dict = {}
            threads = [threading.Thread(target=stream, args=(port, i, ns.seconds, ns.samples, results))
                       for i in range(ns.streams)]
            for t in threads:
                t.start()
            trace, t0, after = [], time.time(), 0
            while after < 5:                         # every 2 s, and 10 s more once the streams have ended
                live = any(t.is_alive() for t in threads)
                after += not live
                main_mb, child_mb = rss_mb(analyzer.pid), sum(rss_mb(c) for c in children(analyzer.pid))
                trace.append(dict(t=round(time.time() - t0, 1), main_mb=main_mb, child_mb=child_mb, streaming=live))
                print(f"{trace[-1]['t']:6.1f} s  main {main_mb:5d} MB  analysis {child_mb:5d} MB"
                      f"{'' if live else '  (streams ended)'}", flush=True)
                time.sleep(2)
        finally:
            analyzer.send_signal(signal.SIGTERM)
            try:
                analyzer.wait(20)
            except subprocess.TimeoutExpired:
                analyzer.kill()
    batch_mb = round(ns.samples * 36 / 1e6, 2)
    summary = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=platform.node(),
                   cpus=os.cpu_count(), tree=git_tree(), streams=ns.streams, analyzer_args=ns.analyzer_args, seconds=ns.seconds, batch_mb=batch_mb, env=ns.env,
                   idle_main_mb=idle, peak_main_mb=max(x["main_mb"] for x in trace),
                   peak_child_mb=max(x["child_mb"] for x in trace), after_main_mb=trace[-1]["main_mb"],
                   after_child_mb=trace[-1]["child_mb"],
                   acked=sum(r["acked"] for r in results.values()), sent=sum(r["sent"] for r in results.values()),
                   results=sorted({r["result"] for r in results.values()}), trace=trace)
    summary["per_stream_mb"] = round((summary["peak_main_mb"] - idle) / max(1, ns.streams), 1)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"stream_memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "trace"}, indent=1))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
