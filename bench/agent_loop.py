"""The agent's tight loop, as the overhead benchmarks time it: scrape ->
ring -> uplink buffer -> batch encoding, a batch a second at 10 Hz, with an
uplink that is never started (no I/O)."""
from __future__ import annotations

import time

from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.uplink import Uplink, UplinkConfig

HZ = 10


def started_agent(collector, warm_ticks: int = 20) -> tuple[Agent, Uplink]:
    """An agent on `collector`, started and warmed up (every process seen,
    read and cached), and its uplink."""
    agent = Agent(AgentConfig(host="bench", interval_s=1 / HZ), collector)
    agent.collector.start()
    up = Uplink(UplinkConfig(target="127.0.0.1:1"), "bench", "b", agent.devices)
    for _ in range(warm_ticks):
        agent._handle(agent.collector.scrape())
    return agent, up


def tight(agent: Agent, up: Uplink, ticks: int) -> float:
    """CPU seconds spent on `ticks` ticks."""
    c0 = time.process_time()
    for i in range(ticks):
        s = agent.collector.scrape()
        agent._handle(s)
        up.submit(s.samples)
        if i % HZ == HZ - 1:        # one batch a second, as the flusher does
            up.flush()
            up._unacked.clear()
            up._unacked_samples = 0
    return time.process_time() - c0
