"""On a real GPU: torch-profiler (Kineto) traces of three known workloads
read by our torch trace reader, and the verdict each gets. Expected:
bf16 matmul compute-bound, f32 stream memory-bound, tiny kernels
launch-bound. The gzipped traces are kept beside the result (real GPU
Kineto traces for tests).

    PYTHONPATH=... python bench/gpu/torch_trace_check.py OUTDIR > result.json
"""
import gzip
import json
import os
import shutil
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.trace_files import load_trace


def workloads():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.ones(1 << 28, device="cuda", dtype=torch.float32)
    t = torch.zeros(16, device="cuda")
    return (("matmul_bf16", lambda: a @ a, 40),
            ("stream_f32", lambda: x * 2.0 + 1.0, 40),
            ("launch_tiny", lambda: t.add_(1.0), 3000))


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    for name, fn, n in workloads():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        raw = os.path.join(outdir, f"{name}.pt.trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        t0 = time.perf_counter()
        try:
            s = summarize(load_trace(raw + ".gz"))
        except Exception as exc:       # a check reports what broke and goes on to the next workload
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name] = {k: s.get(k) for k in ("verdict", "confidence", "summary", "busy_fraction", "format")}
        out[name]["read_s"] = time.perf_counter() - t0
        out[name]["trace_bytes_gz"] = os.path.getsize(raw + ".gz")
        out[name]["top_ops"] = [{k: r.get(k) for k in ("kernel", "count", "time_fraction", "bound")}
                                for r in (s.get("ops") or s.get("top_ops") or [])[:3]]
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
