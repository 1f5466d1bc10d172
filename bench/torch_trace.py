"""Reading and summarizing a large torch-profiler (Kineto) trace.

    python bench/torch_trace.py [--copies 10] [--runs 2]

The trace: vLLM 0.32's worker trace (../shared/fixtures/vllm-0.32-cpu/
traces/rank0.*.pt.trace.json.gz, 225 k events, 4.2 MB gzip) repeated
`--copies` times one after another in time (each copy's `ts` moved past the
previous copy's end), in Kineto's own layout: 10 copies make the ~40 MB
gzip / ~670 MB JSON / 2.25 M events of a 2 s capture of a loaded server.

Each measurement runs in a fresh process (wall time and peak RSS of that
process): gpuscope's `parse_trace` + `summarize` (what the analyzer runs on
a capture), and, as the peer, a plain `gzip` + `json.load` of the same file,
which builds Python objects and nothing else. `--gpu` moves every other
CPU op onto GPU 0 as a kernel, as a worker's trace on a GPU holds them.
Results to bench/out/torch_trace[-gpu].json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = next((ROOT.parent / "shared" / "fixtures" / "vllm-0.32-cpu" / "traces").glob("rank0.*.pt.trace.json.gz"))

# VmHWM: this process's peak (ru_maxrss would keep the bench's own peak, inherited across fork)
PEAK = """
def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
"""
GPUSCOPE = PEAK + """
import sys, time
from gpuscope.collectors.trace_files import parse_trace
from gpuscope.analyzers.trace_analysis import summarize
t = time.perf_counter()
s = summarize(parse_trace(open(sys.argv[1], 'rb').read(), sys.argv[1]))
print(time.perf_counter() - t, peak(), s["verdict"])
"""
PEER = PEAK + """
import sys, time, gzip, json
t = time.perf_counter()
with gzip.open(sys.argv[1], 'rb') as f:
    doc = json.load(f)
print(time.perf_counter() - t, peak(), len(doc["traceEvents"]))
"""


KERNELS = ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coo", "void at::native::vectorized_elementwise_kernel<4, "
           "at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, "
           "at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "flash_fwd_splitkv_kernel",
           "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, long, float, int, int)")
GPU_META = """
  {"ph": "M", "name": "process_name", "ts": TS, "pid": 0, "tid": 0, "args": {"name": "python"}},
  {"ph": "M", "name": "process_labels", "ts": TS, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
  {"ph": "M", "name": "thread_name", "ts": TS, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},"""
_CPU_OP = re.compile(r'"cat": "cpu_op",\n    "name": "[^"]*",\n    "pid": \d+,\n    "tid": \d+,')


def on_gpu(text: str) -> str:
    """Every other CPU op becomes a kernel on GPU 0's stream 7 (the layout of
    an H200's torch trace, tests/data/h200-torch-2.11): a vLLM worker on a
    GPU launches about one kernel per op."""
    n = [0]

    def swap(m: re.Match) -> str:
        n[0] += 1
        if n[0] % 2:
            return m.group(0)
        return f'"cat": "kernel",\n    "name": "{KERNELS[n[0] // 2 % len(KERNELS)]}",\n    "pid": 0,\n    "tid": 7,'
    text = _CPU_OP.sub(swap, text)
    text = text.replace('"deviceProperties": [],', '"deviceProperties": [{"id": 0, "name": "NVIDIA H200", '
                        '"computeMajor": 9, "computeMinor": 0, "numSms": 132}],', 1)
    first = re.search(r'"ts": ([0-9.]+)', text).group(1)      # where the copies are placed from
    return text.replace('"traceEvents": [', '"traceEvents": [' + GPU_META.replace("TS", first), 1)


def build(copies: int, path: Path, gpu: bool = False) -> dict:
    text = gzip.decompress(FIXTURE.read_bytes()).decode()
    if gpu:
        text = on_gpu(text)
    head, sep, rest = text.partition('"traceEvents": [')
    body, end, tail = rest.rpartition("\n  ]")
    ts = [float(x) for x in re.findall(r'"ts": ([0-9.]+)', body)]
    span = max(ts) - min(ts) + 1000.0
    parts = [body.rstrip().rstrip(",")]
    for k in range(1, copies):
        shift = k * span
        parts.append(re.sub(r'"ts": ([0-9.]+)', lambda m: f'"ts": {float(m.group(1)) + shift:.3f}', body)
                     .rstrip().rstrip(","))
    doc = head + sep + ",".join(parts) + end + tail
    data = gzip.compress(doc.encode(), compresslevel=6)
    path.write_bytes(data)
    return dict(copies=copies, events=len(ts) * copies, json_mb=round(len(doc) / 1e6, 1), gzip_mb=round(len(data) / 1e6, 1))


def run(script: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    seconds, rss, what = out.stdout.split()[:3]
    return dict(seconds=round(float(seconds), 2), peak_rss_mb=round(int(rss) / 2**20), result=what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--gpu", action="store_true", help="every other CPU op moved to GPU 0 as a kernel")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.pt.trace.json.gz"
        out = dict(date=time.strftime("%Y-%m-%d"), trace=build(ns.copies, path, ns.gpu), gpuscope=[], json_load=[])
        for _ in range(ns.runs):
            out["gpuscope"].append(run(GPUSCOPE, path))
            out["json_load"].append(run(PEER, path))
    best = lambda k: min(out[k], key=lambda r: r["seconds"])  # noqa: E731
    out["ratio_seconds"] = round(best("gpuscope")["seconds"] / best("json_load")["seconds"], 3)
    out["ratio_peak_rss"] = round(best("gpuscope")["peak_rss_mb"] / best("json_load")["peak_rss_mb"], 3)
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / f"torch_trace{'-gpu' if ns.gpu else ''}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
