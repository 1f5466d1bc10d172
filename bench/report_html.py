"""How long `gpuscope report --html` takes, end to end and by part.

    python bench/report_html.py [--runs 3] [--hosts 10]

Cases:
- `recording`: the bundled H200 recording (90 s, one GPU, 904 samples at
  10 Hz) pushed over gRPC to a real analyzer at its own timestamps and
  judged live, with its three traces reported as captures;
- `host 2h`, `host 24h`: one host of 8 GPUs over 2 h and 24 h at 1 Hz;
  `fleet 24h`: --hosts hosts of 8 GPUs over 24 h, reported fleet-wide (16
  GPUs drawn). Their samples are the recording's per-second means, tiled with
  an offset per GPU, and their windows and findings the recording's own
  verdicts (offline, 5 s windows) tiled the same way: a verdict change every
  ~15 s, the most a lane has to draw.

Each case runs `gpuscope report ... --html` as a subprocess against
`gpuscope analyzer` (its analysis in its own process, the default) and
reports the wall time (median of --runs), then the parts in this process:
the RangeReport RPC, the timeline, the roofline, the page; and the file's size.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT.parent / "shared" / "fixtures" / "h200-run1"
GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]
CAPTURES = (("traces/matmul_bf16", "matmul_bf16"), ("traces/hbm_stream", "hbm_stream"), ("remote", "decode_gemv"))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _analyzer(db: str) -> tuple[subprocess.Popen, str]:
    from gpuscope.daemon import clients
    port = _free_port()
    proc = subprocess.Popen(GPUSCOPE + ["--log-level", "warning", "analyzer", "--db", db, "--insecure",
                                        "--listen", f"127.0.0.1:{port}", "--memory-limit", "2GB"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"
    for _ in range(300):
        try:
            clients.status(target)
            return proc, target
        except clients.ClientError:
            time.sleep(0.2)
    raise RuntimeError("the analyzer did not start")


def _report_captures(target: str, host: str, phases: dict, shift: float = 0.0) -> None:
    from gpuscope.daemon import clients
    from gpuscope.v1 import samples_pb2 as pb
    for where, phase in CAPTURES:
        path = next((FIXTURE / where).glob("plugins/profile/*/*.xplane.pb"))
        t = (phases[phase]["start"] + phases[phase]["end"]) / 2 + shift
        rec = pb.CaptureRecord(id=f"cap-{phase}-{int(t)}", host=host, gpus=[0], start=t, end=t + 0.5,
                               duration_ms=500, path=str(path), status="ok", kind="jax", trigger="on-call")
        clients.report_capture(target, rec, path.read_bytes())


def _phases() -> dict:
    rows = [json.loads(x) for x in (FIXTURE / "phases.jsonl").read_text().splitlines() if x.strip()]
    return {r["phase"]: r for r in rows if "start" in r}


def recording_case(tmp: str) -> tuple[str, dict]:
    """A fresh analyzer file holding the recording, judged live."""
    import grpc
    from gpuscope.collectors.recording import read_recording
    from gpuscope.collectors.records import DeviceInfo, GpuSample
    from gpuscope.daemon.convert import encode_batch
    from gpuscope.v1 import analyzer_pb2_grpc
    db = os.path.join(tmp, "recording.duckdb")
    proc, target = _analyzer(db)
    rec = read_recording(FIXTURE / "samples.csv")
    devices = [DeviceInfo(gpu=g, name="NVIDIA H200") for g in rec.gpus()]
    names = list(rec.metrics)
    with grpc.insecure_channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        edges = np.arange(rec.t[0], rec.t[-1] + 1.0, 1.0)
        for seq, (lo, hi) in enumerate(zip(edges, edges[1:]), 1):
            idx = np.flatnonzero((rec.t >= lo) & (rec.t < hi))
            samples = [GpuSample(int(rec.gpu[i]), float(rec.t[i]),
                                 {n: float(rec.metrics[n][i]) for n in names if rec.metrics[n][i] == rec.metrics[n][i]},
                                 rec.processes[i]) for i in idx]
            stub.Push(encode_batch("h200", "b", seq, samples, devices), timeout=30)
    time.sleep(3)
    _report_captures(target, "h200", _phases())
    proc.terminate()
    proc.wait(30)
    return db, dict(start=float(rec.t[0]) - 5, end=float(rec.t[-1]) + 5, host="h200")


def generated_case(tmp: str, name: str, hours: float, hosts: int, end: float) -> tuple[str, dict]:
    """`hosts` x 8 GPUs over `hours` at 1 Hz, the recording's seconds and verdicts tiled."""
    import pyarrow as pa
    from gpuscope.analyzers.offline import classify_recording
    from gpuscope.analyzers.store import FINDING_COLUMNS, Store, StoreConfig
    from gpuscope.collectors.recording import read_recording
    rec = read_recording(FIXTURE / "samples.csv")
    t0 = float(rec.t[0])
    sec = np.floor(rec.t - t0).astype(int)
    period = int(sec.max()) + 1
    metrics = [m for m in ("gpm_sm_util_ratio", "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio", "util_gpu_ratio",
                           "util_mem_ratio", "gpm_pcie_rx_bytes_per_second", "gpm_pcie_tx_bytes_per_second",
                           "procs_cpu_cores", "power_watts") if m in rec.metrics]
    per_sec = {m: np.array([np.nanmean(rec.metrics[m][sec == s]) if (sec == s).any() else np.nan
                            for s in range(period)]) for m in metrics}
    windows = classify_recording(rec, 5.0)
    verdicts = [(w.start - t0, w.verdict) for w in sorted(windows, key=lambda w: w.start)]
    db = os.path.join(tmp, f"{name.replace(' ', '-')}.duckdb")
    st = Store(StoreConfig(db, memory_limit="2GB"))
    start = end - hours * 3600
    n = int(hours * 3600)
    base = pa.table({"s": np.arange(period), **{m: per_sec[m] for m in metrics}})
    st._con.register("tile", base)
    st._con.register("tile_w", pa.table({"k": list(range(len(verdicts))), "verdict": [v[1] for v in verdicts]}))
    cols = ", ".join(f'"{m}"' for m in metrics)
    st._con.execute(f"""INSERT INTO samples (host, gpu, t, {cols})
        SELECT 'host-' || lpad(h::VARCHAR, 3, '0'), g, {start} + r3.i, {', '.join(f'tile."{m}"' for m in metrics)}
        FROM range({hosts}) r1(h), range(8) r2(g), range({n}) r3(i)
        JOIN tile ON tile.s = (r3.i + 11 * g + 7 * h) % {period} ORDER BY r3.i""")
    st._con.execute(f"""INSERT INTO windows
        SELECT 'host-' || lpad(h::VARCHAR, 3, '0'), g, {start} + w * 5, {start} + w * 5 + 5, tile_w.verdict, 0.9,
               '[]', '' FROM range({hosts}) r1(h), range(8) r2(g), range({n // 5}) r3(w)
        JOIN tile_w ON tile_w.k = (w + g + h) % {len(verdicts)} ORDER BY w""")
    st._con.execute(f"""INSERT INTO devices (host, gpu, name) SELECT 'host-' || lpad(h::VARCHAR, 3, '0'), g,
        'NVIDIA H200' FROM range({hosts}) r1(h), range(8) r2(g)""")
    # findings: the windows' non-idle runs, as the tracker would have opened and closed them
    runs = st._con.execute("""
        WITH w AS (SELECT host, gpu, start, "end", verdict, lag(verdict) OVER (PARTITION BY host, gpu ORDER BY start)
                   IS DISTINCT FROM verdict AS new FROM windows),
             g AS (SELECT *, sum(new::INT) OVER (PARTITION BY host, gpu ORDER BY start) AS run FROM w)
        SELECT host, gpu, verdict, min(start), max("end"), count(*) FROM g WHERE verdict <> 'idle'
        GROUP BY host, gpu, verdict, run""").fetchall()
    rows = [tuple(dict(id=f"{i:012x}", host=h, gpu=g, verdict=v, start=s, end=e, confidence=0.9, windows=k,
                       evidence="{}", flags="[]", summary=f"{v} (generated)", alternatives="[]",
                       decided_by="counters").get(c) for c in FINDING_COLUMNS)
            for i, (h, g, v, s, e, k) in enumerate(runs)]
    st.append("findings", pa.table({c: [r[j] for r in rows] for j, c in enumerate(FINDING_COLUMNS)}))
    sizes = dict(samples=st.count("samples"), windows=st.count("windows"), findings=len(rows))
    st.close()
    proc, target = _analyzer(db)
    _report_captures(target, "host-000", _phases(), shift=end - 3600 - t0)
    proc.terminate()
    proc.wait(30)
    return db, dict(start=start, end=end, host="host-000" if hosts == 1 else "",
                    **{f"stored_{k}": v for k, v in sizes.items()})


def measure(db: str, case: dict, runs: int, tmp: str) -> dict:
    from gpuscope.daemon import clients, report_html as rh
    proc, target = _analyzer(db)
    try:
        out = os.path.join(os.environ.get("REPORT_BENCH_KEEP", tmp), "r.html")
        args = ["report", "--server", target, "--insecure", "--start", str(case["start"]), "--end", str(case["end"]),
                "--html", out] + (["--host", case["host"]] if case["host"] else [])
        walls = []
        for _ in range(runs):
            t = time.perf_counter()
            r = subprocess.run(GPUSCOPE + args, capture_output=True, text=True, timeout=600)
            walls.append(time.perf_counter() - t)
            assert r.returncode == 0, r.stderr
        parts = {}
        t = time.perf_counter()
        rep = clients.range_report(target, case["start"], case["end"], case["host"])
        parts["rpc_s"] = time.perf_counter() - t
        t = time.perf_counter()
        timeline = rh.timeline_png(rep)
        parts["timeline_s"] = time.perf_counter() - t
        t = time.perf_counter()
        roofline = rh.roofline_png(rep)
        parts["roofline_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rh.page(rep, title="bench", timeline=timeline, roofline=roofline)
        parts["page_s"] = time.perf_counter() - t
        return dict(wall_s=statistics.median(walls), walls=[round(w, 2) for w in walls],
                    **{k: round(v, 3) for k, v in parts.items()}, html_bytes=os.path.getsize(out),
                    gpus=len(rep["gpus"]), runs_drawn=len(rep["lanes"]["runs"]), findings=len(rep["findings"]),
                    captures=len(rep["captures"]), points=sum(len(s["t"]) for s in rep["counters"]["series"]),
                    notes=rep["notes"])
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--cases", default="recording,host 2h,host 24h,fleet 24h")
    ns = ap.parse_args()
    wanted = ns.cases.split(",")
    end = time.time() - 60
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               load=os.getloadavg()[0])
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            if name == "recording":
                db, case = recording_case(tmp)
            else:
                hours = float(name.split()[1].rstrip("h"))
                db, case = generated_case(tmp, name, hours, 1 if name.startswith("host") else ns.hosts, end)
            out[name] = dict(case, **measure(db, case, ns.runs, tmp))
            print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
            os.unlink(db)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
