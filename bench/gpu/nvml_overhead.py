"""On a real GPU: the agent's CPU per tick against the cost of the NVML calls
it makes, and against one core, at the default cadence.

    PYTHONPATH=... python bench/gpu/nvml_overhead.py [--ticks 300] > result.json

`raw` repeats exactly the NVML calls of one fast-path scrape (the same
functions, fields and GPM metrics, nothing else); `agent` is the collector's
scrape plus the agent's per-tick work (ring, uplink buffer, encoding one
batch per second). Both are process CPU, so the ratio says what our code
adds on top of NVML itself (target ≤ 1.2x) and `agent_pct_of_core_per_gpu_at_1hz`
the share of one core per GPU at the default 1 s cadence (target ≤ 0.5 %).
"""
import argparse
import json
import time

import pynvml as N

from gpuscope.collectors.nvml import FAST_FIELDS, GPM_METRICS, NvmlCollector
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.uplink import Uplink, UplinkConfig


def raw_tick(handles, gpm, fields, mgs):
    for i, h in enumerate(handles):
        N.nvmlDeviceGetUtilizationRates(h)
        N.nvmlDeviceGetMemoryInfo(h)
        N.nvmlDeviceGetPowerUsage(h)
        N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)
        N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)
        N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
        N.nvmlDeviceGetCurrentClocksEventReasons(h)
        N.nvmlDeviceGetComputeRunningProcesses(h)
        N.nvmlDeviceGetFieldValues(h, fields)
        if gpm[i] is not None:
            a, b = gpm[i]
            N.nvmlGpmSampleGet(h, b)
            mgs[i].sample1, mgs[i].sample2 = a, b
            N.nvmlGpmMetricsGet(mgs[i])
            gpm[i] = (b, a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=300)
    ns = ap.parse_args()
    N.nvmlInit()
    handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
    fields = [f if s is None else (f, s) for f, s, _ in FAST_FIELDS]
    gpm, mgs = [], []
    for h in handles:
        if N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
            N.nvmlGpmSampleGet(h, a)
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version, mg.numMetrics = N.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
            for j, (mid, _) in enumerate(GPM_METRICS):
                mg.metrics[j].metricId = mid
            gpm.append((a, b))
            mgs.append(mg)
        else:
            gpm.append(None)
            mgs.append(None)
    raw_tick(handles, gpm, fields, mgs)
    c0 = time.process_time()
    for _ in range(ns.ticks):
        raw_tick(handles, gpm, fields, mgs)
    raw = (time.process_time() - c0) / ns.ticks

    agent = Agent(AgentConfig(host="gpu-bench", interval_s=1.0), NvmlCollector())
    agent.collector.start()
    up = Uplink(UplinkConfig(target="127.0.0.1:1"), "gpu-bench", "b", agent.devices)   # never started: no I/O
    for _ in range(3):
        agent._handle(agent.collector.scrape())
    c0 = time.process_time()
    for i in range(ns.ticks):
        s = agent.collector.scrape()
        agent._handle(s)
        up.submit(s.samples)
        up.flush()
        up._unacked.clear()
        up._unacked_samples = 0
    ours = (time.process_time() - c0) / ns.ticks
    sample = agent.collector.scrape().samples[0].values
    slow = agent.collector.scrape_slow()
    n = len(handles)
    print(json.dumps(dict(
        date=time.strftime("%Y-%m-%d %H:%M"), gpus=n, name=N.nvmlDeviceGetName(handles[0]),
        raw_nvml_tick_ms=round(raw * 1e3, 3), agent_tick_ms=round(ours * 1e3, 3),
        ratio_agent_over_raw=round(ours / raw, 3),
        agent_pct_of_core_per_gpu_at_1hz=round(100 * ours / n, 3),
        metrics_on_fast_path=sorted(sample), slow_path=sorted(slow.samples[0].values) if slow.samples else [],
        unsupported={i: sorted(d.unsupported) for i, d in enumerate(agent.collector._devices)},
        errors=slow.errors), indent=1))


if __name__ == "__main__":
    main()
