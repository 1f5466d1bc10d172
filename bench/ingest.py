"""Ingest: end-to-end gRPC -> DuckDB from 16 concurrent agents, against a raw
DuckDB Arrow append of the same rows in the same run.

    python bench/ingest.py [--agents 16] [--batch 1000] [--seconds 20]

The analyzer runs as `gpuscope analyzer` in its own process; the agents are
threads of this process streaming pre-encoded batches (8 GPUs, every
catalogue metric an agent on an H200 sends) over the real Ingest stream and
waiting for acks. Ratios: end-to-end samples/s over each raw append's samples/s.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers.ingest import decode  # noqa: E402
from gpuscope.analyzers.store import Store, StoreConfig  # noqa: E402
from gpuscope.collectors import catalogue as cat  # noqa: E402
from gpuscope.collectors.records import DeviceInfo, GpuSample  # noqa: E402
from gpuscope.daemon.convert import encode_batch  # noqa: E402
from gpuscope.v1 import analyzer_pb2_grpc  # noqa: E402
from tests.conftest import free_port  # noqa: E402

FAST = [m.name for m in cat.METRICS if not m.slow and m.kind is not cat.Kind.COUNTER or m.name.startswith(("pcie", "throttle_sw"))]


def batches(host: str, n_batches: int, size: int, t0: float) -> list:
    rng = np.random.default_rng(abs(hash(host)) % 2**32)
    devices = [DeviceInfo(gpu=g, name="NVIDIA H200") for g in range(8)]
    out = []
    for b in range(n_batches):
        samples = []
        for i in range(size):
            vals = {m: float(rng.random()) for m in FAST}
            samples.append(GpuSample(i % 8, t0 + b * size / 8 + i // 8 * 0.001, vals))
        out.append(encode_batch(host, "boot", b + 1, samples, devices))
    return out


def raw_append(all_batches, one_transaction: bool) -> float:
    """The same rows appended straight into DuckDB from Arrow, same schema and
    settings: a transaction per batch, or everything in one append."""
    import pyarrow as pa
    tables = [decode(b).samples for b in all_batches]
    if one_transaction:
        tables = [pa.concat_tables(tables)]
    path = tempfile.mktemp(suffix=".duckdb")
    store = Store(StoreConfig(path))
    t0 = time.perf_counter()
    for tbl in tables:
        store.begin()
        store.append("samples", tbl)
        store.commit()
    dt = time.perf_counter() - t0
    n = sum(t.num_rows for t in tables)
    store.close()
    os.unlink(path)
    return n / dt


def end_to_end(agents: int, per_agent: list[list], port: int) -> tuple[float, int]:
    done = []

    def agent(bs):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            acks = list(analyzer_pb2_grpc.AnalyzerStub(ch).Ingest(iter(bs)))
            done.append(len(acks))
    threads = [threading.Thread(target=agent, args=(bs,)) for bs in per_agent]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t0
    n = sum(b.count for bs in per_agent for b in bs)
    return n / dt, sum(done)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1000, help="GPU-samples per batch")
    ap.add_argument("--batches", type=int, default=40, help="batches per agent")
    ns = ap.parse_args()
    t0 = time.time() - 2 * ns.batches * ns.batch / 8
    per_agent = [batches(f"host-{a:03d}", ns.batches, ns.batch, t0) for a in range(ns.agents)]
    port = free_port()
    db = tempfile.mktemp(suffix=".duckdb")
    srv = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--db", db, "--listen",
                            f"127.0.0.1:{port}", "--window", "60"], stderr=subprocess.DEVNULL)
    try:
        grpc.channel_ready_future(grpc.insecure_channel(f"127.0.0.1:{port}")).result(timeout=30)
        cpu0 = _cpu(srv.pid)
        e2e, acks = end_to_end(ns.agents, per_agent, port)
        analyzer_cpu = _cpu(srv.pid) - cpu0
    finally:
        srv.terminate()
        srv.wait()
    n_rows = duckdb.connect(db, read_only=True).execute("SELECT count(*) FROM samples").fetchone()[0]
    flat = [b for bs in per_agent for b in bs]
    raw = raw_append(flat, one_transaction=False)
    raw_one = raw_append(flat, one_transaction=True)
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               agents=ns.agents, batch_samples=ns.batch, metrics_per_sample=len(FAST),
               samples=sum(b.count for bs in per_agent for b in bs), stored=n_rows, acks=acks,
               end_to_end_samples_per_s=round(e2e),
               analyzer_cpu_us_per_sample=round(analyzer_cpu / sum(b.count for bs in per_agent for b in bs) * 1e6, 2), raw_arrow_append_per_batch_samples_per_s=round(raw),
               raw_arrow_append_one_transaction_samples_per_s=round(raw_one),
               ratio_vs_per_batch=round(e2e / raw, 3), ratio_vs_one_transaction=round(e2e / raw_one, 3))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
