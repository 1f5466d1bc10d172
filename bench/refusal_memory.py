"""What refused batches leave in the analyzer's memory.

    python bench/refusal_memory.py [--refusals 200] [--mb 6] [--default-gc]

`gpuscope analyzer --engine thread` runs in a subprocess (loopback,
--insecure, its own DuckDB file; bench/fleet_grpc.py's AnalyzerProcess). This process pushes one batch of about
`--mb` MB, refused for an over-long boot_id after the whole batch was
parsed, `--refusals` times, one after another, and reports the analyzer's
RSS growth from before the first to 2 s after the last. `--default-gc` runs
the analyzer with Python's default collector thresholds instead of the
analyzer's own (engine.GC_THRESHOLDS). Writes bench/out/refusal_memory-<time>.json.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fleet_grpc import AnalyzerProcess, OUT_DIR, git_tree, proc_rss, wait_ready  # noqa: E402

ENTRY = """import sys
import gpuscope.analyzers.engine as engine
if {default_gc!r}:
    engine.GC_THRESHOLDS = (700, 10, 10)
from gpuscope.daemon.cli import main
sys.exit(main())
"""


def refused_batch(mb: float):
    from gpuscope.collectors.records import DeviceInfo, GpuSample
    from gpuscope.daemon.convert import encode_batch
    b = encode_batch("flooder", "boot", 1, [GpuSample(0, time.time() - 1, {"power_watts": 1.0})], [DeviceInfo(gpu=0)])
    b.boot_id = "b" * 100                       # over its 64-byte limit
    for _ in range(int(mb * 1e6 / 4010)):
        b.health.add(gpu=0, t=time.time(), code=1, detail="d" * 4000)
    return b


def main() -> int:
    import grpc
    from gpuscope.v1 import analyzer_pb2_grpc
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--refusals", type=int, default=200)
    ap.add_argument("--mb", type=float, default=6.0)
    ap.add_argument("--default-gc", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        entry = Path(tmp) / "entry.py"
        entry.write_text(ENTRY.format(default_gc=args.default_gc))
        os.environ["FLEET_GRPC_ANALYZER_ENTRY"] = str(entry)      # AnalyzerProcess runs it instead of the CLI
        an = AnalyzerProcess(Path(tmp), 5.0, 10_000, None, extra="--engine thread")
        try:
            wait_ready(an.target, None)
            stub = analyzer_pb2_grpc.AnalyzerStub(
                grpc.insecure_channel(an.target, options=[("grpc.max_send_message_length", 64 << 20)]))
            batch = refused_batch(args.mb)
            time.sleep(2.0)
            before = proc_rss(an.proc.pid)[0]
            codes: dict[str, int] = {}
            for _ in range(args.refusals):
                try:
                    stub.Push(batch, timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                codes[code] = codes.get(code, 0) + 1
            time.sleep(2.0)
            after = proc_rss(an.proc.pid)[0]
        finally:
            an.stop()
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=platform.node(), tree=git_tree(),
               refusals=args.refusals, batch_mb=round(batch.ByteSize() / 1e6, 2),
               gc="default" if args.default_gc else "analyzer", codes=codes,
               rss_before_mb=round(before / 2**20), rss_growth_mb=round((after - before) / 2**20))
    print(json.dumps(out))
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / f"refusal_memory-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
