"""DCGM collector overhead: CPU of our own code per GPU-sample with fake DCGM
bindings whose calls cost (almost) nothing, against the NVML collector with
the fake NVML in the same run, as a ratio.

    python bench/dcgm_overhead.py [--ticks 2000] [--rounds 3]

Both drive the agent's per-tick work as bench/agent_overhead.py's tight
loop does (scrape -> ring -> uplink buffer -> batch encoding, one batch a
second at 10 Hz) for 8 H200s, each with one GPU process whose /proc is
read. The DCGM side reads every device and profiling field in one
dcgmEntitiesGetLatestValues call and the processes through NVML (GPM off);
the NVML side makes its usual 88 calls a tick, GPM included. A third
variant drops the process path (shared by both) to show what DCGM's part
costs alone. Rounds alternate the variants so that a noisy neighbour hurts
all alike; the best round of each is reported, and every round.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuscope.collectors.dcgm import DcgmCollector, DcgmConfig  # noqa: E402
from gpuscope.collectors.nvml import NvmlCollector, NvmlConfig  # noqa: E402
from gpuscope.collectors.procstat import ProcStat  # noqa: E402
from tests.fakes import fake_dcgm  # noqa: E402
from tests.fakes.nvml import FakeNvml, h200  # noqa: E402

from agent_loop import HZ, started_agent, tight  # noqa: E402  (bench/, beside this file)

GPUS = 8


def fake_nvml() -> FakeNvml:
    return FakeNvml([h200(util_gpu=90, util_mem=30, processes=[(os.getpid(), 1 << 30)]) for _ in range(GPUS)],
                    frozen=True)


def nvml_collector():
    return NvmlCollector(nvml=fake_nvml(), procstat=ProcStat()), None


def dcgm_collector():
    eng = fake_dcgm.engine([fake_dcgm.h200(values={203: 90, 204: 30}, prof={1002: 0.9, 1004: 0.8})
                            for _ in range(GPUS)], frozen=True)
    processes = NvmlCollector(NvmlConfig(gpm=False), nvml=fake_nvml(), procstat=ProcStat())
    return DcgmCollector(DcgmConfig(), fake_dcgm.bindings, processes=processes), eng


def dcgm_without_processes():
    """The DCGM side alone: what the collector adds beyond the process path both share."""
    eng = fake_dcgm.engine([fake_dcgm.h200(values={203: 90, 204: 30}, prof={1002: 0.9, 1004: 0.8})
                            for _ in range(GPUS)], frozen=True)
    return DcgmCollector(DcgmConfig(processes=False), fake_dcgm.bindings), eng


def tight_loop(make, ticks: int) -> dict:
    collector, eng = make()
    agent, up = started_agent(collector)
    metrics = len(agent.collector.scrape().samples[0].values)
    cpu = tight(agent, up, ticks)
    agent.collector.close()
    out = dict(us_per_gpu_sample=round(cpu / (ticks * GPUS) * 1e6, 2), metrics_per_sample=metrics)
    if eng is not None:
        out["dcgm_calls_per_tick"] = round(eng.calls / (ticks + 21), 2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    kinds = {"nvml": nvml_collector, "dcgm": dcgm_collector, "dcgm_without_processes": dcgm_without_processes}
    runs = {k: [] for k in kinds}
    for _ in range(ns.rounds):
        for kind, make in kinds.items():
            runs[kind].append(tight_loop(make, ns.ticks))
    best = {k: min(v, key=lambda r: r["us_per_gpu_sample"]) for k, v in runs.items()}
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               python=platform.python_version(), gpus=GPUS, hz=HZ, ticks=ns.ticks,
               best=best, ratio_dcgm_to_nvml=round(best["dcgm"]["us_per_gpu_sample"]
                                                   / best["nvml"]["us_per_gpu_sample"], 2),
               rounds={k: [r["us_per_gpu_sample"] for r in v] for k, v in runs.items()})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
