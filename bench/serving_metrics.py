"""What one scrape of a serving engine's /metrics costs the agent.

    python bench/serving_metrics.py [--scrapes 300]

Expositions: vLLM 0.32's recorded `/metrics` under load
(../shared/fixtures/vllm-0.32-cpu/metrics_busy.txt, 614 lines, one engine)
and the same with four data-parallel engines (`engine="0".."3"`, as one
vLLM API server with --data-parallel-size 4 exposes them: 1,679 lines).
Each is served over HTTP/1.1 on loopback by a thread of this process,
and every answer moves the counters and histograms on (so each scrape
derives real deltas).

Measured per scrape, CPU time of this process, the server being another:
the agent's path (`EngineScraper.scrape`: GET on a kept-alive connection,
read the values against the lines seen before, derive), what it pays when
the lines changed (`parse` from scratch: pick, drop labels, parse), and, as
the peer, prometheus_client's parser over the whole
exposition (what `text_string_to_metric_families(body)` costs a scraper
that reads everything). Results to bench/out/serving_metrics.json.
"""
from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing
import re
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT.parent / "shared" / "fixtures" / "vllm-0.32-cpu" / "metrics_busy.txt"

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuscope.collectors.serving_metrics import EngineScraper, parse  # noqa: E402

_NUMBER = re.compile(r"(_total|_bucket\{[^}]*\}|_count\{[^}]*\}|_sum\{[^}]*\}|_total\{[^}]*\}) (\d+(?:\.\d+)?)$", re.M)


def four_engines(text: str) -> str:
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            out.extend(line.replace('engine="0"', f'engine="{e}"') for e in "123")
    return "\n".join(out) + "\n"


def _serve(text: str, bodies: int, conn) -> None:
    """Child process: serves `text`, every counter-like number grown by n
    on the n-th request (bodies made up front, so the server never holds
    the agent up)."""
    made = [_NUMBER.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + n}", text).encode() for n in range(bodies)]
    served = [0]

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()       # headers and body are two writes: without this, Nagle adds 40 ms
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self):
            body = made[min(served[0], bodies - 1)]
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    conn.send(httpd.server_port)
    httpd.serve_forever()


def measure(text: str, scrapes: int) -> dict:
    """The agent's CPU per scrape in this process (the server is another);
    peers in the same run: prometheus_client over the whole exposition, and
    what the agent pays when the exposition's lines changed (a first scrape,
    a new series): `parse` from scratch."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(text, scrapes + 2, theirs), daemon=True)
    server.start()
    try:
        port = mine.recv()
        clock = [1000.0]
        scraper = EngineScraper(f"http://127.0.0.1:{port}", clock=lambda: clock[0])
        scraper.scrape()
        c = time.process_time()
        w = time.perf_counter()
        for _ in range(scrapes):
            clock[0] += 5
            values = scraper.scrape()
        ours = (time.process_time() - c) / scrapes
        wall = (time.perf_counter() - w) / scrapes
        scraper.close()
    finally:
        server.kill()
    c = time.process_time()
    for _ in range(scrapes):
        list(text_string_to_metric_families(text))
    peer = (time.process_time() - c) / scrapes
    c = time.process_time()
    for _ in range(scrapes):
        parse(text, 0.0)
    changed = (time.process_time() - c) / scrapes
    return dict(lines=text.count("\n"), bytes=len(text), metrics_derived=len(values),
                agent_ms_per_scrape=round(ours * 1e3, 3), agent_wall_ms=round(wall * 1e3, 3),
                full_parse_ms=round(peer * 1e3, 3), ratio_agent_to_full_parse=round(ours / peer, 3),
                lines_changed_parse_ms=round(changed * 1e3, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=300)
    ns = ap.parse_args()
    one = FIXTURE.read_text()
    out = dict(date=time.strftime("%Y-%m-%d"), scrapes=ns.scrapes,
               vllm_one_engine=measure(one, ns.scrapes), vllm_four_engines=measure(four_engines(one), ns.scrapes))
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "serving_metrics.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
