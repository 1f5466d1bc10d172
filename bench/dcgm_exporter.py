"""What the agent pays per GPU-sample when its source is the node's dcgm-exporter.

    python bench/dcgm_exporter.py [--scrapes 2000] [--gpus 8]

The exporter is an HTTP/1.1 server in another process (its cost is not the
agent's), answering what dcgm-exporter answers for 8 H100s running
Kubernetes pods: its default counters plus the profiling (DCP) fields, in
its own line format (tests/fakes/dcgm_exporter.py), one pod on each GPU.
Every answer moves the numbers on (energy, power, the DRAM ratio), so each
scrape reads new values (the exporter run with -c 1000 and scraped every
second); the answers are made up front, so the server never holds the
agent up, and sent chunked, as Go's net/http sends dcgm-exporter's.

Measured in this process, CPU time (user + system: the kernel's share of a
loopback round trip is the agent's too), the median of 5 rounds:
- source: `DcgmExporterCollector.scrape()` (GET on a kept-alive connection,
  the shortcut read, a GpuSample per GPU);
- the same when every answer repeats the one before (the exporter's
  default -c 30000 scraped every second);
- agent: the same plus what the agent does with every scrape (ring, uplink
  buffer, batch encoding once a second at 10 Hz), as bench/agent_overhead.py;
- lines changed: what one scrape costs when the exposition's lines changed
  (a new pod, a new series): the answer read line by line;
- peer, in the same run: prometheus_client's parser over the whole same
  exposition (`text_string_to_metric_families`), alone and after the same GET;
  and the GET alone, ours (collectors/http_get.py) and the standard
  library's http.client on a kept-alive connection.
Results to bench/out/dcgm_exporter.json.
"""
from __future__ import annotations

import argparse
import http.client
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuscope.collectors.dcgm_exporter import DcgmExporterCollector  # noqa: E402
from gpuscope.collectors.http_get import KeptAliveGet  # noqa: E402
from gpuscope.daemon.agent import Agent, AgentConfig  # noqa: E402
from gpuscope.daemon.uplink import Uplink, UplinkConfig  # noqa: E402
from tests.fakes.dcgm_exporter import FakeExporter, Gpu, exposition  # noqa: E402

HZ = 10


def answers(gpus: int, n: int) -> list[bytes]:
    fleet = [Gpu(g, pods=[("llm-serving", f"vllm-decode-7f9c{g}", "vllm")]) for g in range(gpus)]
    out = []
    for i in range(n):
        for g in fleet:
            g.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += 51_200
            g.values["DCGM_FI_DEV_POWER_USAGE"] = 500 + (i * 7 + g.index) % 90 + 0.125
            g.values["DCGM_FI_PROF_DRAM_ACTIVE"] = 0.8 + ((i + g.index) % 10) / 100
        out.append(exposition(fleet, host="ip-10-0-180-136.ec2.internal").encode())
    return out


def _serve(gpus: int, n: int, conn) -> None:
    """Child process: the fake exporter, answering the k-th request with the
    k-th exposition (of n, made up front)."""
    made = [b.decode() for b in answers(gpus, n)]
    served = itertools.count()
    exporter = FakeExporter(lambda: made[next(served) % n])
    conn.send(exporter.port)
    threading.Event().wait()


def cpu_per(fn, runs: int, rounds: int = 5) -> float:
    """CPU per call, the median of `rounds` rounds: the machine is shared, and
    a round that another process crowded out says nothing of ours."""
    per = []
    for _ in range(rounds):
        c = time.process_time()
        for _ in range(max(runs // rounds, 1)):
            fn()
        per.append((time.process_time() - c) / max(runs // rounds, 1))
    return statistics.median(per)


def repeating(gpus: int, scrapes: int) -> float:
    """CPU per scrape when every answer is the one before (dcgm-exporter at
    its default -c 30000, scraped every second: 29 answers in 30)."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(gpus, 1, theirs), daemon=True)
    server.start()
    try:
        source = DcgmExporterCollector(f"http://127.0.0.1:{mine.recv()}/metrics")
        source.start()
        for _ in range(50):
            source.scrape()
        cpu = cpu_per(source.scrape, scrapes)
        source.close()
    finally:
        server.kill()
        server.join()
    return cpu


def measure(gpus: int, scrapes: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(gpus, 64, theirs), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{mine.recv()}/metrics"
        source = DcgmExporterCollector(url)
        source.start()
        for _ in range(50):
            source.scrape()
        w = time.perf_counter()
        ours = cpu_per(source.scrape, scrapes)
        wall = (time.perf_counter() - w) / scrapes
        assert len(source.scrape().samples) == gpus and source._layout.skeleton is not None

        agent = Agent(AgentConfig(host="bench", interval_s=1 / HZ), source)
        up = Uplink(UplinkConfig(target="127.0.0.1:1"), "bench", "b", agent.devices)   # never started: no I/O
        tick = [0]

        def agent_tick():
            s = source.scrape()
            agent._handle(s)
            up.submit(s.samples)
            tick[0] += 1
            if tick[0] % HZ == 0:            # one batch a second, as the flusher does
                up.flush()
                up._unacked.clear()
                up._unacked_samples = 0
        whole = cpu_per(agent_tick, scrapes)

        def lines_changed():
            source._layout = None            # as after a new pod or series: read line by line
            source.scrape()
        changed = cpu_per(lines_changed, max(scrapes // 10, 20))

        get = KeptAliveGet(url.removesuffix("/metrics"), 2.0, 16 << 20)
        body = get.get("/metrics")
        peer_runs = max(scrapes // 20, 20)
        peer_parse = cpu_per(lambda: list(text_string_to_metric_families(body)), peer_runs)
        peer_scrape = cpu_per(lambda: list(text_string_to_metric_families(get.get("/metrics"))), peer_runs)
        http_only = cpu_per(lambda: get.get("/metrics"), scrapes)
        get.close()
        stdlib = http.client.HTTPConnection("127.0.0.1", int(url.split(":")[2].split("/")[0]), timeout=2.0)

        def stdlib_get():
            stdlib.request("GET", "/metrics", headers={"Accept": "text/plain", "Accept-Encoding": "identity"})
            stdlib.getresponse().read().decode()
        stdlib_get()
        http_client = cpu_per(stdlib_get, scrapes)
        stdlib.close()
        source.close()
    finally:
        server.kill()
        server.join()
    same = repeating(gpus, scrapes)
    us = 1e6
    return dict(
        gpus=gpus, lines=body.count("\n"), bytes=len(body), scrapes=scrapes,
        source_us_per_gpu_sample=round(ours * us / gpus, 1), source_us_per_scrape=round(ours * us, 1),
        source_wall_us_per_scrape=round(wall * us, 1),
        source_us_per_gpu_sample_answers_repeat=round(same * us / gpus, 1),
        agent_us_per_gpu_sample=round(whole * us / gpus, 1),
        http_get_us_per_scrape=round(http_only * us, 1), stdlib_http_client_get_us=round(http_client * us, 1),
        lines_changed_us_per_scrape=round(changed * us, 1),
        peer_full_parse_us=round(peer_parse * us, 1), peer_get_and_full_parse_us=round(peer_scrape * us, 1),
        ratio_source_to_peer_scrape=round(ours / peer_scrape, 3),
        ratio_read_to_peer_parse=round((ours - http_only) / peer_parse, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=8)
    ns = ap.parse_args()
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               load=os.getloadavg()[0], python=platform.python_version(), **measure(ns.gpus, ns.scrapes))
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "dcgm_exporter.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
