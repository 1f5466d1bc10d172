"""What the fleet-tier tests share: an analyzer store with a few hours of two
hosts, and a real local S3-compatible server (moto in server mode), so the
S3 path runs through s3fs, botocore and HTTP as it does against S3."""
from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa
import pytest

from gpuscope.analyzers.store import Store, StoreConfig, finding_row

T0 = 1794960000.0            # 2026-11-18 00:00 UTC
HOSTS, GPUS, HOURS = ("node-a", "node-b"), (0, 1), 3


def fill_store(path, hours: int = HOURS) -> Store:
    """1 Hz samples of each host's GPUs for `hours` from T0 (util_gpu_ratio
    = 0.25 on node-a, 0.75 on node-b), a closed memory-bound finding of
    node-a's GPU 0 over the first hour, an open compute-bound one of
    node-b's GPU 1, and a capture."""
    s = Store(StoreConfig(str(path), memory_limit="256MB"))
    n = hours * 3600
    s.begin()
    for host, util in zip(HOSTS, (0.25, 0.75)):
        t = np.repeat(T0 + np.arange(n) + 0.5, len(GPUS))
        s.append("samples", pa.table({"host": [host] * len(t), "gpu": np.tile(np.array(GPUS, np.int32), n),
                                      "t": t, "util_gpu_ratio": np.full(len(t), util)}))
    closed = dict(id="f-closed", host="node-a", gpu=0, job="python train.py", verdict="memory-bound", start=T0,
                  end=T0 + 3600, confidence=0.9, windows=720, evidence={}, flags=[], summary="decode",
                  alternatives=[], decided_by="counters", counters_verdict="memory-bound", trace_verdict=None,
                  captures=[], attribution={"namespace": "ml", "pod": "llm-0"})
    opened = dict(closed, id="f-open", host="node-b", gpu=1, job="python gemm.py", verdict="compute-bound",
                  end=None, attribution={"slurm_job": "81234"})
    s.upsert_findings([finding_row(closed), finding_row(opened)])
    s.upsert_capture(dict(id="c-1", host="node-a", target="127.0.0.1:9999", pid=7, gpus="[0]", job="python train.py",
                          start=T0 + 1800, end=T0 + 1802, duration_ms=2000, path="/x", size_bytes=10, status="ok",
                          error="", trigger="manual", verdict="memory-bound", confidence=0.8,
                          summary='{"verdict": "memory-bound"}', finding_id="f-closed", kind="jax"))
    s.commit()
    return s


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def s3_server(monkeypatch):
    """A moto S3 server on a free loopback port, its address in
    AWS_ENDPOINT_URL as a site would set it for an S3-compatible store, and
    a bucket `fleet`."""
    moto_server = pytest.importorskip("moto.server")
    import logging

    import boto3

    logging.getLogger("werkzeug").setLevel(logging.WARNING)       # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for k, v in dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                     AWS_ENDPOINT_URL=endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="fleet")
    try:
        yield server
    finally:
        server.stop()
