"""What one scrape of an agent's Prometheus /metrics costs: rendering 8
GPUs' every catalogue metric, their verdicts (the agent judges each GPU's
newest 5 s with the analyzer's rules) and the agent's health.

    python bench/exporter.py [--gpus 8] [--scrapes 500]

In process, CPU time per `generate_latest` of the agent's registry, the
agent sampling a fake NVML (every metric present, GPM and slow path too).
Peer, in the same run: prometheus_client rendering the same number of
series held in ordinary Gauge objects (what an exporter that keeps its own
metric objects pays). Results to bench/out/exporter.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Gauge, generate_latest  # noqa: E402

from gpuscope.collectors.nvml import NvmlCollector  # noqa: E402
from gpuscope.daemon.agent import Agent, AgentConfig  # noqa: E402
from gpuscope.analyzers.offline import judge_newest  # noqa: E402
from gpuscope.daemon import exporter  # noqa: E402
from gpuscope.daemon.exporter import AgentCollector, registry  # noqa: E402
from tests.fakes.nvml import FakeNvml, h200  # noqa: E402


def per_call(fn, n: int) -> float:
    fn()
    c = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=500)
    ns = ap.parse_args()
    agent = Agent(AgentConfig(host="bench", interval_s=0.1, slow_interval_s=0.2),
                  NvmlCollector(nvml=FakeNvml([h200() for _ in range(ns.gpus)])))
    agent.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all("energy_joules_total" in agent.latest.get(g, {})
                                                  for g in range(ns.gpus)):
        time.sleep(0.1)
    while time.monotonic() < deadline and len(agent.recent(5.0, gpu=0)) < 50:
        time.sleep(0.1)                # a full 5 s window at 10 Hz for the verdicts: the most they read
    agent.stop()                       # the numbers stay; the sampler no longer competes for the CPU
    now = time.time()                  # ... and stay fresh: the exporter leaves out a GPU quiet for 3 ticks
    exporter.time = type("Frozen", (), {"time": staticmethod(lambda: now)})
    reg = registry(AgentCollector(agent, judge_newest))
    text = generate_latest(reg)
    assert b"gpuscope_gpu_verdict{" in text and b"gpuscope_gpu_sm_active_ratio{" in text
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    ours = per_call(lambda: generate_latest(reg), ns.scrapes)
    peer_reg = CollectorRegistry()
    gauges = [Gauge(f"peer_{i}", "peer", ["gpu", "uuid", "model"], registry=peer_reg)
              for i in range(max(1, series // ns.gpus))]
    for g in gauges:
        for gpu in range(ns.gpus):
            g.labels(str(gpu), f"GPU-{gpu}", "NVIDIA H200").set(1.0)
    peer = per_call(lambda: generate_latest(peer_reg), ns.scrapes)
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), gpus=ns.gpus, series=series, bytes=len(text),
               ms_per_scrape=round(ours * 1e3, 3), peer_ms_per_scrape=round(peer * 1e3, 3),
               ratio=round(ours / peer, 2))
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "exporter.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
