"""How closely the ranks of a coordinated capture start (`gpuscope capture
--job`), on loopback: N real jax.distributed ranks on the CPU (gloo), each
serving JAX's profiler, split over agents of 4 ranks each (real agents,
their GPUs from the fake NVML), one analyzer; the capture asked through
the analyzer's CaptureJob as the CLI asks it.

    python bench/coordinated_capture.py [--ranks 16] [--repeats 3] [--duration-ms 1000]

The skew is the spread of the `profile_start_time` each rank's trace
records (every agent here shares one clock, so this is what the command
path and the profiler add, not clock error). Prints JSON: per repeat the
spread, the captures that came back, and the straggler the traces name
(rank 1 does 30 ms of host work a step).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gpuscope.analyzers.programs import ProgramsConfig  # noqa: E402
from gpuscope.daemon import clients  # noqa: E402
from tests.helpers import AnalyzerServer, capturing_agent, wait_for  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration-ms", type=int, default=3000)
    ap.add_argument("--pace", type=float, default=0.0,
                    help="seconds each rank sleeps per step (0: every rank busy, the 2 cores oversubscribed)")
    args = ap.parse_args()
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "jobs" / "jax_ranks.py")],
        env=dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_PROCESS_ID=str(r), JAX_NUM_PROCESSES=str(args.ranks), SLOW_RANK="1", STEPS="100000",
                 STEP_SLEEP=str(args.pace),
                 GPUSCOPE_PROFILER_PORT=str(free_port())),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in range(args.ranks)]
    tmp = Path(tempfile.mkdtemp())
    srv = AnalyzerServer(tmp / "c.duckdb", window_s=5.0, fleet_check_s=0, programs=ProgramsConfig(lag_s=0.0))
    agents, repeats = [], []
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for a in range(0, args.ranks, 4):
            host = f"node-{a // 4:02d}"
            agents.append(capturing_agent([p.pid for p in procs[a:a + 4]], srv.target, host, tmp / host))
        wait_for(lambda: len(srv.analyzer.commands.hosts) == len(agents), timeout=60)
        wait_for(lambda: srv.analyzer.store.count("processes") >= 2 * args.ranks, timeout=60)
        time.sleep(1.0)
        srv.analyzer.run_fleet_checks(time.time()).result(timeout=120)
        (job,) = clients.dist_jobs(srv.target)
        for _ in range(args.repeats):
            asked = clients.capture_job(srv.target, job["job"], args.duration_ms)
            deadline = asked["start_at"] + args.duration_ms / 1e3 + 90
            result = clients.job_skew(srv.target, asked["group"])
            while len(result["captures"]) < args.ranks and time.time() < deadline:
                time.sleep(1.0)
                result = clients.job_skew(srv.target, asked["group"])
            ids = {c["id"] for c in result["captures"]}
            starts = [json.loads(r["summary"])["start_unix"] for r in srv.analyzer.store.captures(limit=10_000)
                      if r["id"] in ids and r["summary"]]
            repeats.append(dict(captures=len(result["captures"]), ok=sum(c["status"] == "ok" for c in result["captures"]),
                                start_spread_ms=round((max(starts) - min(starts)) * 1e3, 2) if starts else None,
                                collectives=result["collectives"], straggler=result["straggler"]))
    finally:
        for agent, listener in agents:
            listener.stop()
            agent.stop()
        srv.stop()
        for p in procs:
            p.kill()
    print(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} CPUs",
                          ranks=args.ranks, agents=len(agents), duration_ms=args.duration_ms, pace_s=args.pace,
                          repeats=repeats),
                     indent=1))


if __name__ == "__main__":
    main()
