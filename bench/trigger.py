"""Detection and trigger benchmarks.

    python bench/trigger.py replay      # 10x replay: anomaly latency, capture start latency
    python bench/trigger.py fleet       # 1,000 simulated hosts at 1 Hz: does the analyzer keep up, does the cap hold
    python bench/trigger.py healthy     # 30 min of steady training: captures started (want 0)
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig  # noqa: E402
from gpuscope.analyzers.detector import Detector, DetectorConfig  # noqa: E402
from gpuscope.analyzers.offline import classify_recording  # noqa: E402
from gpuscope.analyzers.trigger import TriggerConfig, TriggerPolicy  # noqa: E402
from gpuscope.collectors.recording import read_recording  # noqa: E402
from gpuscope.collectors.records import DeviceInfo, GpuSample, ProcessRecord  # noqa: E402
from gpuscope.daemon.convert import encode_batch  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "h200-run1"


def replay(speed: float = 10.0, window_s: float = 1.0) -> dict:
    """The recording through agent (replay at `speed`, recording timebase) ->
    gRPC -> analyzer -> command stream -> agent -> a real JAX job."""
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.replay import ReplayCollector
    from gpuscope.collectors.xla_profiler import XlaProfilerClient
    from gpuscope.daemon import clients
    from gpuscope.daemon.agent import Agent, AgentConfig
    from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
    from gpuscope.daemon.commands import CommandListener
    from gpuscope.daemon.convert import capture_pb
    from gpuscope.daemon.uplink import Uplink, UplinkConfig
    from tests.conftest import free_port
    from tests.helpers import AnalyzerServer

    port = free_port()
    job = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "tests" / "jobs" / "jax_job.py"),
                            "--port", str(port), "--seconds", "300"], stdout=subprocess.PIPE, text=True)
    job.stdout.readline()
    rec = read_recording(FIXTURE / "samples.csv")
    rec.processes = [tuple(ProcessRecord(pid=job.pid, used_memory_bytes=p.used_memory_bytes) for p in procs)
                     for procs in rec.processes]        # the recording's job is our live JAX job
    tmp = Path(tempfile.mkdtemp())
    srv = AnalyzerServer(tmp / "r.duckdb", window_s=window_s,
                         detector=DetectorConfig(baseline_windows=5, warmup_windows=3),
                         trigger=TriggerConfig(host_cooldown_s=0, fleet_fraction=1.0, capture_duration_ms=500,
                                               job_captures_per_hour=100))
    collector = ReplayCollector(rec, speed=speed, timebase="recording")
    agent = Agent(AgentConfig(host="replay", source="replay", interval_s=0.1), collector,
                  lambda boot, devs: Uplink(UplinkConfig(target=srv.target, flush_interval_s=0.1), "replay", boot, devs))
    agent.captures = CaptureRunner(CaptureConfig(tmp / "caps"), "replay")
    agent.discovery = JobDiscovery(lambda a: XlaProfilerClient(a).probe())
    agent.capture_reporter = lambda r, d: clients.report_capture(srv.target, capture_pb(r), d)
    listener = CommandListener(srv.target, "replay", agent.boot_id, agent.run_command)
    listener.start()
    time.sleep(1)
    w0 = time.time()
    agent.start()
    duration = (rec.t[-1] - rec.t[0]) / speed
    time.sleep(duration + 8)
    store = srv.analyzer.store
    anomalies = store.records("anomalies", limit=1000)
    decisions = store.records("decisions", limit=1000)
    captures = store.captures(limit=1000)
    listener.stop()
    agent.stop()
    srv.stop()
    job.kill()
    shift = w0 - (rec.t[-1] - rec.t[0]) - rec.t[0]          # recording time -> sample time
    phases = [json.loads(x) for x in (FIXTURE / "phases.jsonl").read_text().splitlines() if '"start"' in x]
    out = {}
    by_anomaly = {d["anomaly_id"]: d for d in decisions}
    caps = {c["id"]: c for c in captures}
    for p in phases:
        onset = p["start"] + shift
        near = [a for a in anomalies if onset - window_s <= a["t"] <= onset + 3 * window_s]
        if not near:
            out[p["phase"]] = None
            continue
        a = min(near, key=lambda x: x["t"])
        d = by_anomaly.get(a["id"])
        cap = caps.get(d["capture_id"]) if d and d.get("capture_id") else None
        out[p["phase"]] = dict(windows_after_onset=round((a["t"] - onset) / window_s, 2), kinds=a["kinds"],
                               decision=d and d["status"], reason=d and d["reason"][:60],
                               capture_started_s_after_decision=round(cap["start"] - d["t"], 3) if cap else None)
    return dict(speed=speed, window_s=window_s, anomalies=len(anomalies), decisions=len(decisions),
                captures=len(captures), phases=out)


def fleet(hosts: int = 1000, gpus: int = 8, seconds: int = 60, window_s: float = 5.0) -> dict:
    """Simulated hosts at 1 Hz through the analyzer's ingest (decode, group
    commit, live windows, rules, findings, detector, trigger) without gRPC,
    whose per-batch cost the ingest benchmark measures. At second 30 every
    GPU's job changes bottleneck at once: an anomaly storm."""
    tmp = Path(tempfile.mkdtemp())
    a = Analyzer(AnalyzerConfig(str(tmp / "f.duckdb"), window_s=window_s, memory_limit="2GB",
                                detector=DetectorConfig(baseline_windows=4, warmup_windows=2),
                                trigger=TriggerConfig()))
    a.start()
    for h in range(hosts):
        a.commands.subscribe(f"host-{h:04d}", lambda c: True)               # every agent connected (nobody consumes)
    devices = [DeviceInfo(gpu=g, name="NVIDIA H100") for g in range(gpus)]
    busy = {"util_gpu_ratio": 0.95, "util_mem_ratio": 0.2, "gpm_sm_util_ratio": 0.9, "gpm_tensor_util_ratio": 0.88,
            "gpm_dram_bw_util_ratio": 0.15, "power_watts": 650.0}
    memory = dict(busy, util_mem_ratio=0.95, gpm_tensor_util_ratio=0.0, gpm_dram_bw_util_ratio=0.85)
    rng = np.random.default_rng(1)
    t0 = np.floor(time.time() / window_s) * window_s - seconds - 10
    lag = []
    start = time.perf_counter()
    for s in range(seconds):
        sec0 = time.perf_counter()
        futs = []
        for h in range(hosts):
            vals = busy if s < 30 else memory
            samples = [GpuSample(g, t0 + s + 0.01 * g, {k: v * (1 + 0.02 * rng.standard_normal()) if k != "power_watts"
                                                        else v for k, v in vals.items()}, ())
                       for g in range(gpus)]
            futs.append(a.submit(encode_batch(f"host-{h:04d}", "b", s + 1, samples, devices)))
        for f in futs:
            f.result()
        lag.append(time.perf_counter() - sec0)
    a.writer.call(lambda st: None).result()
    total = time.perf_counter() - start
    decisions = a.store.records("decisions", limit=100_000)
    pending = [d for d in decisions if d["status"] == "pending"]
    cap_reasons = sum("fleet cap" in d["reason"] for d in decisions)
    out = dict(hosts=hosts, gpus=hosts * gpus, simulated_seconds=seconds, wall_seconds=round(total, 2),
               realtime_factor=round(seconds / total, 2), worst_second_s=round(max(lag), 3),
               p95_second_s=round(float(np.percentile(lag, 95)), 3),
               anomalies=a.store.count("anomalies"), decisions=len(decisions), captures_started=len(pending),
               fleet_cap=max(1, int(np.ceil(0.05 * hosts))), skipped_by_fleet_cap=cap_reasons,
               samples=a.writer.samples)
    a.close()
    return out


def healthy(minutes: float = 30.0) -> dict:
    from tests.analyzers.test_detector import _healthy
    rec = _healthy(minutes)
    det, pol = Detector(DetectorConfig()), TriggerPolicy(TriggerConfig())
    t0 = time.perf_counter()
    decisions = []
    windows = classify_recording(rec, 5.0)
    for c in windows:
        anomaly = det.observe("healthy", c, "pid:461")
        if anomaly is not None:
            decisions.append(pol.decide(anomaly, 1, True))
    return dict(minutes=minutes, windows=len(windows), anomalies=len(decisions),
                captures_started=sum(d.status == "pending" for d in decisions),
                seconds=round(time.perf_counter() - t0, 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["replay", "fleet", "healthy"])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=60)
    ns = ap.parse_args()
    res = {"replay": replay, "fleet": lambda: fleet(ns.hosts, seconds=ns.seconds), "healthy": healthy}[ns.part]()
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
                          part=ns.part, **res), indent=1, default=str))


if __name__ == "__main__":
    main()
