"""One bad client against good agents: does it slow their acks?

    python bench/bad_neighbour.py [--agents 20] [--phase 30] [--mb 50] [--kind name|unknown|health|padded]

`gpuscope analyzer` runs in a subprocess (loopback, --insecure, its own
DuckDB file); `--agents` simulated agents (bench/fleet_grpc.py's load
generator, another process: 8 GPUs, one batch a second each) push real
recording rows. After a baseline phase, this process opens one Ingest stream
and writes invalid batches of about `--mb` MB back to back, each as soon as
the previous one is answered, for another phase. The kinds of invalid batch:

- name:    8 devices whose names are `--mb`/8 MB each (limit: 256 bytes)
- health:  one health event whose detail is `--mb` MB (limit: 4,096 bytes)
- unknown: a valid batch followed by an unknown field of `--mb` MB
- padded:  `name`'s over-long names behind 131,072 empty processes, which
           raise what the counts alone allow past the batch's size

Reports the good agents' ack latency (sample time -> ack) p50/p99 in each
phase and the ratio, how many bad batches were answered and how (REJECTED,
an error status), and the analyzer's RSS. Writes bench/out/bad_neighbour-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from fleet_grpc import AnalyzerProcess, LoadGenProcess, Monitor, OUT_DIR, git_tree, wait_ready  # noqa: E402


_BUILT: dict = {}


def bad_batch(kind: str, mb: float, seq: int, boot: str) -> bytes:
    """Built once, then only its seq changes: the client's own CPU is the
    analyzer's machine's too."""
    from gpuscope.v1 import samples_pb2 as pb
    if (kind, mb) not in _BUILT:
        _BUILT[(kind, mb)] = _build(pb, kind, mb, boot)
    b, tail = _BUILT[(kind, mb)]
    b.seq = seq
    return b.SerializeToString() + tail


def _build(pb, kind: str, mb: float, boot: str):
    size = int(mb * 2**20)
    now = time.time()
    b = pb.SampleBatch(host="bad-neighbour", boot_id=boot, seq=1, count=1,
                       t_f64le=np.array([now], "<f8").tobytes(), gpu_u32le=np.array([0], "<u4").tobytes())
    b.devices.add(gpu=0, uuid="GPU-bad", name="NVIDIA H200")
    if kind == "padded":
        for k in range(131_072):
            b.processes.add(sample=0, pid=1 + k)
    if kind in ("name", "padded"):
        for g in range(1, 8):
            b.devices.add(gpu=g, uuid=f"GPU-bad{g}")
        for d in b.devices:
            d.name = "N" * (size // 8)
    elif kind == "health":
        b.health.add(gpu=0, t=now, kind=pb.HEALTH_KIND_XID, detail="x" * size)
    tail = b""
    if kind == "unknown":       # field 99, length-delimited: protobuf keeps it as an unknown field
        n, head = size, bytearray(b"\x9a\x06")
        while n >= 0x80:
            head.append(n & 0x7F | 0x80)
            n >>= 7
        head.append(n)
        tail = bytes(head) + b"u" * size
    return b, tail


class BadClient:
    """One Ingest stream, one invalid batch in flight at a time."""

    def __init__(self, target: str, kind: str, mb: float):
        import grpc
        from gpuscope.v1 import samples_pb2 as pb
        self.pb, self.kind, self.mb = pb, kind, mb
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 512 << 20)])
        self.answers: dict[str, int] = {}
        self.latency: list[float] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import grpc
        import queue
        seq = 0
        while not self.stop_event.is_set():
            q: queue.SimpleQueue = queue.SimpleQueue()
            call = self.channel.stream_stream("/gpuscope.v1.Analyzer/Ingest", request_serializer=None,
                                              response_deserializer=self.pb.BatchAck.FromString)(iter(q.get, None))
            try:
                while not self.stop_event.is_set():
                    seq += 1
                    t0 = time.monotonic()
                    q.put(bad_batch(self.kind, self.mb, seq, "badbad0000000001"))
                    ack = next(call)
                    self.latency.append(time.monotonic() - t0)
                    key = self.pb.BatchAck.Status.Name(ack.status)
                    self.answers[key] = self.answers.get(key, 0) + 1
            except grpc.RpcError as exc:
                key = exc.code().name
                self.answers[key] = self.answers.get(key, 0) + 1
                time.sleep(0.01)        # an attacker reopens at once; this only yields the GIL
            finally:
                q.put(None)
                call.cancel()

    def start(self):
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        self.thread.join(30)
        self.channel.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--phase", type=float, default=30.0, help="seconds of each phase (baseline, bad client)")
    ap.add_argument("--mb", type=float, default=50.0, help="size of each bad batch, MiB")
    ap.add_argument("--kind", choices=("name", "health", "unknown", "padded"), default="name")
    ap.add_argument("--analyzer-args", default="")
    ns = ap.parse_args()
    res: dict = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {platform.machine()}",
                     tree=git_tree(), agents=ns.agents, phase_s=ns.phase, mb=ns.mb, kind=ns.kind)
    with tempfile.TemporaryDirectory(prefix="gpuscope-badn-") as tmp:
        an = AnalyzerProcess(Path(tmp), 10.0, 1000, None, ns.analyzer_args)
        gen = mon = bad = None
        try:
            wait_ready(an.target, None)
            gen = LoadGenProcess(an.target, None)
            mon = Monitor(an.target, None, an.proc.pid, gen.proc.pid)
            gen.call("agents", ns.agents, 2.0)
            time.sleep(10)
            phases = {}
            for name in ("baseline", "bad_client"):
                if name == "bad_client":
                    bad = BadClient(an.target, ns.kind, ns.mb)
                    bad.start()
                gen.call("mark")
                t0 = time.time()
                time.sleep(ns.phase)
                t1 = time.time()
                time.sleep(3)      # acks of the phase's last batches
                rep = gen.call("report", t1, expect="report")[1]
                phases[name] = dict(ack_p50_s=rep["ack_p50_s"], ack_p99_s=rep["ack_p99_s"], ack_max_s=rep["ack_max_s"],
                                    batches=rep["batches_measured"], unacked=rep["unacked"],
                                    stream_errors=rep["stream_errors"], **{k: v for k, v in mon.window(t0, t1, 10.0).items()
                                                                          if k in ("rss_max_mb", "analyzer_cpu_pct",
                                                                                   "GetStatus_p95_s")})
            bad.stop()
            lat = bad.latency
            res.update(phases=phases, bad_answers=bad.answers,
                       bad_answer_p50_s=round(float(np.median(lat)), 3) if lat else None,
                       ratio_p50=_ratio(phases, "ack_p50_s"), ratio_p99=_ratio(phases, "ack_p99_s"))
        finally:
            if bad is not None:
                bad.stop()
            if mon is not None:
                mon.stop()
            if gen is not None:
                gen.stop()
            res["analyzer_rc"] = an.stop()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"bad_neighbour-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    print(f"wrote {out}")


def _ratio(phases: dict, key: str) -> float | None:
    a, b = phases["baseline"].get(key), phases["bad_client"].get(key)
    return round(b / a, 2) if a and b else None


if __name__ == "__main__":
    main()
