"""Agent overhead: CPU of our own code per GPU-sample, with a fake NVML whose
calls cost nothing (8 GPUs at 10 Hz), plus the agent's steady RSS.

    python bench/agent_overhead.py [--seconds 30]

Part 1 drives the agent's per-tick work (scrape -> ring -> uplink buffer ->
batch encoding) as fast as it goes and divides process CPU by GPU-samples.
Part 2 runs a real agent at 10 Hz for --seconds, streaming over gRPC to an
analyzer in another process, and reports its CPU per GPU-sample and RSS.
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuscope.collectors.nvml import NvmlCollector  # noqa: E402
from gpuscope.collectors.procstat import ProcStat  # noqa: E402
from gpuscope.daemon.agent import Agent, AgentConfig  # noqa: E402
from gpuscope.daemon.uplink import Uplink, UplinkConfig  # noqa: E402
from tests.fakes.nvml import FakeNvml, h200  # noqa: E402

from agent_loop import HZ, started_agent, tight  # noqa: E402  (bench/, beside this file)

GPUS = 8


def fleet():
    return FakeNvml([h200(util_gpu=90, util_mem=30, processes=[(os.getpid(), 1 << 30)]) for _ in range(GPUS)], frozen=True)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def tight_loop(ticks: int) -> dict:
    fake = fleet()
    agent, up = started_agent(NvmlCollector(nvml=fake, procstat=ProcStat()))
    cpu = tight(agent, up, ticks)
    return dict(ticks=ticks, gpu_samples=ticks * GPUS, cpu_s=round(cpu, 3),
                us_per_gpu_sample=round(cpu / (ticks * GPUS) * 1e6, 2), nvml_calls_per_tick=fake.calls / (ticks + 20))


def live_run(seconds: float) -> dict:
    from tests.conftest import free_port
    port = free_port()
    db = tempfile.mktemp(suffix=".duckdb")
    srv = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--db", db,
                            "--listen", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    time.sleep(2)

    def factory(boot_id, devices):
        return Uplink(UplinkConfig(target=f"127.0.0.1:{port}"), "bench", boot_id, devices)
    agent = Agent(AgentConfig(host="bench", interval_s=1 / HZ), NvmlCollector(nvml=fleet(), procstat=ProcStat()), factory)
    try:
        agent.start()
        time.sleep(3)
        r0, s0, c0 = rss_mb(), agent.samples, time.process_time()
        time.sleep(seconds)
        cpu, n = time.process_time() - c0, agent.samples - s0
        r1 = rss_mb()
        st = agent.uplink.stats()
    finally:
        agent.stop()
        srv.terminate()
        srv.wait()
    return dict(seconds=seconds, gpu_samples=n, us_per_gpu_sample=round(cpu / max(n, 1) * 1e6, 2),
                cpu_pct_of_one_core=round(100 * cpu / seconds, 2), rss_mb_start=round(r0, 1),
                rss_mb_end=round(r1, 1), maxrss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                acked=st["batches_acked"], dropped=st["dropped_samples"], tick_overruns=agent.overruns)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--ticks", type=int, default=3000)
    ns = ap.parse_args()
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               python=platform.python_version(), gpus=GPUS, hz=HZ,
               tight=tight_loop(ns.ticks), live=live_run(ns.seconds))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
