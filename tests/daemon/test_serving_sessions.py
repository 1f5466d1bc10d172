"""Captures of a serving engine never leave it profiling.

A real HTTP server on loopback reproduces what vLLM 0.32 was measured to do
(../shared/fixtures/vllm-0.32-cpu/README.md): a start blocks while a previous
stop is still writing and then starts anyway; a stop answers only after the
traces are written and post-processed, long after the file is complete; the
API server's trace and a key-averages table come with the worker's trace.
Every test ends by asking the engine whether a session still runs."""
from __future__ import annotations

import gzip
import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpuscope.collectors.serving_profiler import PendingStops, TorchProfilerHttp, complete
from gpuscope.collectors.xla_profiler import ProfilerError
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner

TRACE = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": "execute_model", "pid": 1, "tid": 1,
                                                   "ts": 0, "dur": 5}]}).encode())


class VllmLike:
    """start_block_s: how long a start blocks (a previous stop still writing);
    write_s: when the traces are on disk after a stop; answer_s: when the stop
    answers after that; stop_never: the stop never writes nor answers."""

    def __init__(self, trace_dir: Path, start_block_s=0.0, write_s=0.1, answer_s=0.0, stop_never=False,
                 worker_trace=TRACE, worker_after_s=0.0):
        """worker_after_s: the API server's trace is written that long before
        the worker's (a real vLLM 0.32 CPU build: about a minute)."""
        self.worker_after_s = worker_after_s
        self.trace_dir = trace_dir
        self.worker_trace = worker_trace
        trace_dir.mkdir(parents=True, exist_ok=True)
        self.start_block_s, self.write_s, self.answer_s, self.stop_never = start_block_s, write_s, answer_s, stop_never
        self.active = False
        self.starts = self.stops = 0
        self.start_status = 200
        self.written: list[str] = []
        self._lock = threading.Lock()
        self._writing = threading.Lock()      # vLLM: a start waits for a stop still writing
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code):
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_GET(self):
                self._answer(200 if self.path == "/health" else 404)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                if self.path == "/start_profile":
                    time.sleep(engine.start_block_s)
                    with engine._writing, engine._lock:
                        if engine.start_status != 200:
                            engine.active = engine.start_status >= 500      # a proxy's 502: it did start
                            return self._answer(engine.start_status)
                        if engine.active:
                            return self._answer(409)
                        engine.active, engine.starts = True, engine.starts + 1
                    return self._answer(200)
                if self.path == "/stop_profile":
                    with engine._lock:
                        if not engine.active:
                            return self._answer(400)
                        engine.stops += 1
                    if engine.stop_never:
                        time.sleep(3600)
                    with engine._writing:
                        with engine._lock:
                            if not engine.active:             # a stop before ours ended the session
                                return self._answer(400)
                        time.sleep(engine.write_s)
                        stamp = time.time_ns()
                        if engine.worker_after_s:
                            (engine.trace_dir / f"host_1.async_llm.{stamp}.pt.trace.json.gz").write_bytes(TRACE)
                            time.sleep(engine.worker_after_s)
                        (engine.trace_dir / f"rank0.{stamp}.pt.trace.json.gz").write_bytes(engine.worker_trace)
                        (engine.trace_dir / f"host_1.async_llm.{stamp}.pt.trace.json.gz").write_bytes(TRACE)
                        (engine.trace_dir / "profiler_out_0.txt").write_text(f"Name  Self CPU % {stamp}\n")
                        engine.written.append(f"rank0.{stamp}.pt.trace.json.gz")
                        with engine._lock:
                            engine.active = False
                    time.sleep(engine.answer_s)          # post-processing, after the files are whole
                    return self._answer(200)
                self._answer(404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stops():
    p = PendingStops(retry_s=0.1, give_up_s=20, stop_timeout_s=5)
    yield p
    p.wait(10)


def _client(engine, stops, **kw):
    kw.setdefault("stop_timeout_s", 1.0)
    kw.setdefault("stop_s_per_capture_s", 0.0)
    return TorchProfilerHttp(engine.url, engine.trace_dir, pending=stops, poll_s=0.2, **kw)


def test_the_workers_trace_is_awaited_when_the_api_servers_comes_first(tmp_path, stops):
    """Against a real vLLM 0.32 (CPU build), short captures came back with the
    API server's trace alone: it was whole on disk a minute before the
    worker's, and the capture took it while the stop was still pending."""
    worker = gzip.compress(gzip.decompress(TRACE) + b" ")
    engine = VllmLike(tmp_path / "engine", write_s=0.1, worker_after_s=1.5, answer_s=3.0, worker_trace=worker)
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h")
    rec, data = runner.capture(engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=30))
    assert rec.status == "ok" and data == worker, "the worker's trace, not the API server's"
    assert Path(rec.path).name.startswith("rank0.")
    assert stops.wait(10) and not engine.active
    engine.close()


def test_a_capture_while_the_last_stop_is_still_pending_is_busy_without_a_start(tmp_path, stops):
    """Against a real vLLM: a start sent while the previous capture's stop
    was still writing blocked for up to 90 s; the agent answers busy at once."""
    engine = VllmLike(tmp_path / "engine", write_s=0.1, answer_s=3.0)
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h")
    first, _ = runner.capture(engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=30))
    assert first.status == "ok" and stops.pending() == [engine.url]       # its stop has not answered yet
    t0 = time.monotonic()
    second, _ = runner.capture(engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=30))
    assert second.status == "busy" and "earlier capture's /stop_profile has not answered yet" in second.error
    assert time.monotonic() - t0 < 1.0 and engine.starts == 1
    assert stops.wait(10) and not engine.active
    engine.close()


def test_the_trace_is_taken_when_whole_on_disk_while_the_stop_still_answers(tmp_path, stops):
    engine = VllmLike(tmp_path / "engine", write_s=0.2, answer_s=4.0)
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h")
    t0 = time.monotonic()
    rec, data = runner.capture(engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=30))
    took = time.monotonic() - t0
    assert rec.status == "ok" and data == TRACE
    assert took < 3.0                                 # not the 4 s the stop took to answer
    kept = json.loads((Path(rec.path).parent / "capture.json").read_text())
    assert kept["end"] > kept["start"] > 0
    assert any("async_llm" in f for f in kept["other_files"]) and "profiler_out_0.txt" in kept["other_files"]
    assert stops.wait(10) and not engine.active
    engine.close()


def test_a_worker_trace_over_the_size_bound_is_named_and_the_sessions_other_files_are_kept(tmp_path, stops):
    """A trace over max_trace_bytes cannot travel to the analyzer; the API
    server's trace and the tables of the same session still can be read
    on the host, so they are kept, and what was left out is said."""
    big = gzip.compress(os.urandom(20_000))               # does not compress: ~20 KB on disk
    engine = VllmLike(tmp_path / "engine", worker_trace=big)
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps", max_trace_bytes=8192), "h")
    rec, data = runner.capture(engine.url, 100, kind="torch-http", client=_client(engine, stops))
    worker = engine.written[-1]
    assert rec.status == "partial" and data == b"" and rec.path == "" and rec.size_bytes == 0
    assert worker in rec.error and "more than the" in rec.error
    kept = json.loads((tmp_path / "caps" / rec.id / "capture.json").read_text())
    assert kept["status"] == "partial"
    assert kept["skipped_files"] == [dict(name=worker, size_bytes=len(big), reason=kept["skipped_files"][0]["reason"])]
    assert sorted(kept["other_files"]) == sorted(f.name for f in (tmp_path / "caps" / rec.id).iterdir()
                                                 if f.name != "capture.json")
    assert any("async_llm" in f for f in kept["other_files"]) and "profiler_out_0.txt" in kept["other_files"]
    assert not (tmp_path / "caps" / rec.id / worker).exists()
    assert stops.wait(10) and not engine.active
    engine.close()


def test_a_start_that_times_out_is_followed_by_a_stop(tmp_path, stops):
    """vLLM blocks a start while a previous stop writes, then starts it: the
    capture gives up on the start, and the session it caused is stopped."""
    engine = VllmLike(tmp_path / "engine", start_block_s=1.5)
    client = _client(engine, stops, start_timeout_s=0.3)
    rec, _ = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h").capture(engine.url, 100, kind="torch-http",
                                                                          client=client)
    assert rec.status == "slow" and "pending" in rec.error
    assert stops.wait(15)
    assert engine.starts == 1 and not engine.active


def test_a_stop_past_its_deadline_is_slow_not_unreachable_and_stays_pending(tmp_path, stops):
    """...and when the engine has written the trace, the capture is completed
    with it (found in a trial: a `slow` capture stayed slow and empty while
    its trace lay on disk)."""
    engine = VllmLike(tmp_path / "engine", write_s=3.0)
    late = []
    rec, _ = CaptureRunner(CaptureConfig(tmp_path / "caps", margin_s=0.0), "h").capture(
        engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=0.5),
        on_late=lambda r, data: late.append((r.status, r.path, data, r.error)))
    assert rec.status == "slow" and "/health answers" in rec.error and not rec.path
    assert stops.wait(15) and not engine.active         # the stop sent went through in the end
    deadline = time.monotonic() + 10
    while not late and time.monotonic() < deadline:
        time.sleep(0.05)
    [(status, path, data, error)] = late
    assert status == "ok" and data == TRACE and Path(path).parent == tmp_path / "caps" / rec.id
    assert "after the capture answered slow" in error and rec.status == "ok"       # the same record, completed
    assert json.loads((tmp_path / "caps" / rec.id / "capture.json").read_text())["status"] == "ok"


def test_an_engine_killed_during_the_stop_is_unreachable(tmp_path, stops):
    engine = VllmLike(tmp_path / "engine", stop_never=True)
    threading.Timer(0.8, engine.close).start()
    rec, _ = CaptureRunner(CaptureConfig(tmp_path / "caps", margin_s=0.0), "h").capture(
        engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=1.5))
    assert rec.status == "unreachable" and "/health does not answer" in rec.error


def test_agent_shutdown_stops_the_sessions_it_started(tmp_path, stops):
    engine = VllmLike(tmp_path / "engine")
    client = _client(engine, stops)
    outcome = []

    def capture():
        try:
            client.capture(30_000, tmp_path, "s")
        except ProfilerError as exc:        # the stop it would have sent found the session already stopped
            outcome.append(exc)
    th = threading.Thread(target=capture, daemon=True)
    th.start()
    deadline = time.monotonic() + 5
    while not engine.active and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.active
    stops.shutdown(timeout_s=5)
    assert not engine.active


def test_completeness_of_a_gzip_trace(tmp_path):
    whole = tmp_path / "a.pt.trace.json.gz"
    whole.write_bytes(gzip.compress(b"{" + b"x" * 300_000 + b"}"))
    cut = tmp_path / "b.pt.trace.json.gz"
    cut.write_bytes(whole.read_bytes()[:-9])
    assert complete(whole) and not complete(cut) and not complete(tmp_path / "missing.gz")


def test_the_agent_answers_before_its_callers_deadline_with_the_capture_id(tmp_path):
    """Through the real agent API: the engine's stop takes 30 s, the caller
    gives 8 s; the agent sizes its waits to that and answers 'slow', with
    the capture id, and the stop goes on being followed."""
    from gpuscope.collectors.serving_profiler import PENDING_STOPS
    from gpuscope.daemon import clients
    from gpuscope.daemon.serve import shutdown

    engine = VllmLike(tmp_path / "engine", write_s=30.0)
    server, port, health = _agent_server(tmp_path, engine)
    try:
        t0 = time.monotonic()
        rec, data = clients.capture(f"127.0.0.1:{port}", engine.url, None, 100, timeout_s=8)
        assert time.monotonic() - t0 < 8
        assert rec["status"] == "slow" and rec["id"] and not data
        assert engine.url in PENDING_STOPS.pending()          # the session is still followed
        assert PENDING_STOPS.wait(40) and not engine.active
    finally:
        shutdown(server, health)
        engine.close()


def test_a_capture_behind_a_previous_stop_takes_its_own_trace_and_leaves_nothing_running(tmp_path, stops):
    """Capture 1 answers 'slow' while vLLM still writes its trace; capture 2,
    asked at once, is busy without a start (vLLM would block it behind the
    write); capture 3, once that stop answered, must not take capture 1's
    files, and every session ends stopped."""
    engine = VllmLike(tmp_path / "engine", write_s=3.0)
    first, _ = CaptureRunner(CaptureConfig(tmp_path / "c1", margin_s=0.0), "h").capture(
        engine.url, 100, kind="torch-http", client=_client(engine, stops, stop_timeout_s=0.5))
    assert first.status == "slow"
    second, _ = CaptureRunner(CaptureConfig(tmp_path / "c2"), "h").capture(
        engine.url, 100, kind="torch-http", client=_client(engine, stops, start_timeout_s=10, stop_timeout_s=10))
    assert second.status == "busy" and engine.starts == 1
    assert stops.wait(20)
    third, data = CaptureRunner(CaptureConfig(tmp_path / "c3"), "h").capture(
        engine.url, 100, kind="torch-http", client=_client(engine, stops, start_timeout_s=10, stop_timeout_s=10))
    assert third.status == "ok", third.error
    assert Path(third.path).name == engine.written[-1] != engine.written[0]
    assert stops.wait(20) and not engine.active


def test_a_start_answered_5xx_is_followed_by_a_stop(tmp_path, stops):
    engine = VllmLike(tmp_path / "engine")
    engine.start_status = 502                 # a proxy in front of vLLM; the session did start
    rec, _ = CaptureRunner(CaptureConfig(tmp_path / "c"), "h").capture(engine.url, 100, kind="torch-http",
                                                                       client=_client(engine, stops))
    assert rec.status == "failed" and "a stop follows" in rec.error
    assert stops.wait(10) and not engine.active


def test_a_follow_up_ends_when_the_engine_is_gone(tmp_path):
    stops = PendingStops(retry_s=0.1, give_up_s=3600)
    engine = VllmLike(tmp_path / "engine", stop_never=True)
    url = engine.url
    engine.close()
    stops.add(url)
    assert stops.wait(5)                      # not an hour of retries against whatever comes up on the port
    assert stops.done[-1] == (url, None)


def test_the_cli_refuses_a_timeout_shorter_than_the_capture(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "capture", "--server", "127.0.0.1:1",
                        "--serving", "http://127.0.0.1:2", "--duration-ms", "30000", "--timeout", "20", "--insecure"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--timeout 20" in r.stderr


def test_the_cli_captures_a_serving_engine_by_its_url(tmp_path):
    """`gpuscope capture --serving URL` through a real agent server, and
    `--jax URL` pointed at the flag that takes a URL."""
    import json
    import subprocess
    import sys

    from gpuscope.daemon.serve import shutdown

    engine = VllmLike(tmp_path / "engine")
    server, port, health = _agent_server(tmp_path, engine)
    cli = [sys.executable, "-m", "gpuscope.daemon.cli", "capture", "--server", f"127.0.0.1:{port}", "--insecure",
           "--duration-ms", "100"]
    try:
        r = subprocess.run(cli + ["--serving", engine.url, "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["capture"]["status"].startswith("ok") and out["capture"]["kind"] == "torch-http"
        assert not engine.active
        r = subprocess.run(cli + ["--jax", engine.url], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and f"use --serving {engine.url}" in r.stderr
        # for people: the trace's summary as `trace summarize` prints it (it had dropped the engine steps)
        r = subprocess.run(cli + ["--serving", engine.url], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "verdict: none (confidence" in r.stdout and "decided by the trace" in r.stdout
        jobs = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "jobs", "--server", f"127.0.0.1:{port}",
                               "--insecure"], capture_output=True, text=True, timeout=60)
        head, row = jobs.stdout.splitlines()[:2]
        assert head.split()[:3] == ["KIND", "PID", "ADDRESS"] and row.split()[0] == "serving", jobs.stdout
        assert f"traces in {engine.trace_dir}" in row
    finally:
        shutdown(server, health)
        engine.close()


def _agent_server(tmp_path, engine):
    """A real agent's gRPC server, knowing `engine` by configuration."""
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.nvml import NvmlCollector
    from gpuscope.daemon.agent import Agent, AgentConfig
    from gpuscope.daemon.serve import build_server
    from gpuscope.daemon.service import AgentServicer
    from gpuscope.v1 import agent_pb2_grpc
    from tests.fakes.nvml import FakeNvml, h200

    agent = Agent(AgentConfig(host="h", interval_s=0.1, slow_interval_s=1.0), NvmlCollector(nvml=FakeNvml([h200()])))
    agent.captures = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h")
    agent.discovery = JobDiscovery(lambda a: None, serving={engine.url: str(engine.trace_dir)})
    server, port, health = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent), "gpuscope.v1.Agent")])
    server.start()
    return server, port, health


def test_a_trace_directory_that_is_not_there_refuses_before_the_engine_is_disturbed(tmp_path, stops):
    """Found in a trial: with --serving URL=/nonexistent the engine was made
    to profile (and stall) before the capture found nothing to collect."""
    engine = VllmLike(tmp_path / "engine")
    client = TorchProfilerHttp(engine.url, tmp_path / "nowhere" / "traces", pending=stops)
    rec, _ = CaptureRunner(CaptureConfig(tmp_path / "caps"), "h").capture(engine.url, 100, kind="torch-http",
                                                                          client=client)
    assert rec.status == "failed" and "exists on this host; nothing was started" in rec.error
    assert engine.starts == 0 and not engine.active
