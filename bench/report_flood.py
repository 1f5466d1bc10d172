"""Many older agents' capture reports at once: what they cost the analyzer's memory.

    python bench/report_flood.py [--calls 30] [--mb 29] [--rounds 2]

`gpuscope analyzer` runs in a subprocess (loopback, --insecure, its own
DuckDB file). Another process makes `--calls` concurrent `ReportCapture`
calls (the unary method agents older than `UploadCapture` use), each
carrying a trace of `--mb` MiB of random bytes (not a trace: each that is
admitted is refused once read, as INVALID_ARGUMENT, after the limits this
measures). This process samples the analyzer's RSS (with its analysis
process) every 50 ms. Reports the peak above the idle RSS and how the calls
ended, by status code. Writes bench/out/report_flood-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fleet_grpc import AnalyzerProcess, OUT_DIR, git_tree, proc_rss, wait_ready  # noqa: E402

CLIENT = r"""
import collections, json, os, sys
import grpc
import time
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb
target, calls, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ch = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
stub = analyzer_pb2_grpc.AnalyzerStub(ch)
rec = pb.CaptureRecord(id="flood", host="flooder", target="127.0.0.1:9012", pid=461, gpus=[0], start=time.time() - 5,
                       end=time.time() - 4, duration_ms=500, status="ok", trigger="on-call")
data = os.urandom(mb << 20)
futs = []
for i in range(calls):
    rec.id = f"flood{i}"
    futs.append(stub.ReportCapture.future(apb.CaptureReport(record=rec, xspace=data), timeout=120))
codes = collections.Counter()
for f in futs:
    try:
        f.result()
        codes["OK"] += 1
    except grpc.RpcError as exc:
        codes[exc.code().name] += 1
print(json.dumps(codes))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--mb", type=int, default=29)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        an = AnalyzerProcess(Path(tmp), 5.0, 10_000, None)
        try:
            wait_ready(an.target, None)
            for _ in range(args.rounds):
                time.sleep(2.0)
                idle = proc_rss(an.proc.pid)[0]
                t0 = time.monotonic()
                client = subprocess.Popen([sys.executable, "-c", CLIENT, an.target, str(args.calls), str(args.mb)],
                                          stdout=subprocess.PIPE, text=True, cwd=ROOT)
                peak = idle
                while client.poll() is None:
                    peak = max(peak, proc_rss(an.proc.pid)[0])
                    time.sleep(0.05)
                codes = json.loads(client.stdout.read() or "{}")
                rounds.append(dict(idle_rss_mb=round(idle / 2**20), peak_rss_mb=round(peak / 2**20),
                                   peak_above_idle_mb=round((peak - idle) / 2**20),
                                   seconds=round(time.monotonic() - t0, 1), codes=codes))
                print(json.dumps(rounds[-1]), flush=True)
        finally:
            an.stop()
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=platform.node(), tree=git_tree(), calls=args.calls,
               mb=args.mb, rounds=rounds)
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"report_flood-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
