"""Serving engines' /metrics: real expositions (vLLM 0.32's recorded
/metrics) and real prometheus_client servers in each engine's names across
versions, scraped over HTTP."""
import http.server
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuscope.collectors import serving_metrics as sm
from gpuscope.collectors.serving_sampler import ServingSampler
from tests.serving_engines import FakeEngine

VLLM = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "vllm-0.32-cpu"


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_real_vllm_exposition_reads_as_recorded():
    idle, busy, after = (sm.parse((VLLM / f"metrics_{n}.txt").read_text(), t)
                         for n, t in (("idle", 0.0), ("busy", 10.0), ("after", 11.0)))
    assert (busy.engine, busy.model) == ("vllm", "tiny-llama")
    assert busy.gauges["running"] == 20 and busy.gauges["waiting"] == 0
    assert busy.histograms["ttft"][1][-1] == 21          # 21 first tokens seen while 20 ran
    d = sm.derive(busy, after)                            # the 20 requests finished in that second
    assert d["serving_requests_per_second"] == pytest.approx(20.0)
    assert d["serving_requests_running"] == 0 and "serving_ttft_p50_seconds" not in d   # no first token in it
    assert d["serving_itl_p50_seconds"] < d["serving_itl_p99_seconds"] < 0.05
    assert sm.derive(idle, busy)["serving_prompt_tokens_per_second"] == pytest.approx(29.5)


@pytest.mark.parametrize("flavour,series,tp", [
    ("vllm-0.32", 2, 1), ("vllm-0.6", 1, 1), ("sglang", 2, 1), ("sglang-old", 1, 1), ("trtllm", 1, 1),
    ("trtllm-dynamo", 1, 1),
    ("sglang", 1, 4),     # --enable-metrics-for-all-schedulers: 4 tensor-parallel ranks report the same requests
    ("sglang", 2, 2),     # and 2 data-parallel ranks, each of 2 tensor-parallel ranks
])
def test_each_engine_and_version_over_http(flavour, series, tp):
    """Data-parallel ranks serve other requests and add up; the
    tensor-parallel ranks of one engine count the same ones, once."""
    engine = FakeEngine(flavour, series=series, tp=tp)
    clock = Clock()
    scraper = sm.EngineScraper(engine.url, clock=clock)
    try:
        engine.load(prompt=100, generation=50, requests=5, preemptions=1, ttft=[0.03] * 10, itl=[0.5], queue=[0.5],
                    e2e=[0.5])
        assert scraper.scrape() == {}                      # the first scrape is the baseline
        # 100 first tokens in (0.04, 0.06], 100 inter-token gaps in (0.01, 0.02]
        engine.load(running=7, waiting=40, kv=0.96, requests=10, prompt=2000, generation=500, preemptions=4,
                    ttft=[0.05] * 100, itl=[0.015] * 100, queue=[0.7] * 10, e2e=[2.0] * 10)
        clock.t += 5
        d = scraper.scrape()
        assert scraper.last.engine == flavour.split("-")[0].replace("trtllm", "tensorrt-llm")
        assert d["serving_requests_running"] == 7 * series and d["serving_requests_waiting"] == 40 * series
        assert d["serving_kv_cache_usage_ratio"] == pytest.approx(0.96)          # the fullest engine, not a sum
        assert d["serving_prompt_tokens_per_second"] == pytest.approx(2000 * series / 5)
        assert d["serving_generation_tokens_per_second"] == pytest.approx(100 * series)
        assert d["serving_requests_per_second"] == pytest.approx(2 * series)
        assert d["serving_ttft_p50_seconds"] == pytest.approx(0.05)            # 0.04 + 0.02 x 0.5
        assert d["serving_ttft_p99_seconds"] == pytest.approx(0.0598)          # the 10 early ones are not in it
        assert d["serving_itl_p99_seconds"] == pytest.approx(0.0199)
        assert d["serving_e2e_p99_seconds"] == pytest.approx(1.0 + 1.5 * 0.99)
        if engine.preempt is not None:
            assert d["serving_preemptions_per_second"] == pytest.approx(0.8 * series)
        else:
            assert "serving_preemptions_per_second" not in d
        assert ("serving_queue_time_p99_seconds" in d) == (engine.queue is not None)
    finally:
        scraper.close()
        engine.stop()


def test_ranks_of_one_sglang_engine_are_read_once_and_data_parallel_ranks_add_up():
    """SGLang's schedulers label their series as scheduler_metrics_mixin.py
    does (tp_rank, pp_rank, moe_ep_rank, dp_rank when data-parallel): two
    data-parallel ranks of tensor parallelism 2 are 2 engines' worth, not
    4; the lowest rank is read even where the others lag or a label value
    holds a rank label's text."""
    def series(dp, tp, extra=""):
        return (f'model_name="m{extra}",engine_type="unified",tp_rank="{tp}",pp_rank="0",moe_ep_rank="{tp}",'
                f'dp_rank="{dp}"')
    text = "# TYPE sglang:num_running_reqs gauge\n"
    text += "".join(f"sglang:num_running_reqs{{{series(dp, tp)}}} {3 + dp + (tp > 9)}\n"
                    for dp in (0, 1) for tp in (10, 9))
    text += "# TYPE sglang:num_retracted_requests_total counter\n"
    text += "".join(f"sglang:num_retracted_requests_total{{{series(dp, tp)}}} {100 - tp}\n"
                    for dp in (0, 1) for tp in (9, 10))
    text += "# TYPE sglang:queue_time_seconds histogram\n"
    text += "".join(f'sglang:queue_time_seconds_bucket{{{series(dp, tp, extra)},le="{le}"}} {n}\n'
                    for dp, tp, extra in ((0, 0, ',tp_rank=\\"7\\"'), (0, 1, ""), (1, 0, ""), (1, 1, ',tp_rank='))
                    for le, n in (("0.1", 1), ("+Inf", 2 + tp)))
    r = sm.parse(text, 0)
    assert r.gauges == {"running": 3 + 4}                       # rank 9 of each data-parallel rank, not 10
    assert r.counters == {"preemptions": 91 * 2}
    assert r.histograms["queue_time"] == ((0.1, float("inf")), [2.0, 4.0])


def test_a_renamed_family_beside_its_new_name_is_read_once():
    text = ("# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.2\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n")
    assert sm.parse(text, 0).gauges == {"kv_cache": 0.9}
    assert sm.parse(text.replace("vllm:kv", "vllm:zz"), 0).gauges == {"kv_cache": 0.2}


def test_a_restarted_engine_gives_no_rates_for_the_interval_it_restarted_in():
    engine = FakeEngine("vllm-0.32")
    clock = Clock()
    scraper = sm.EngineScraper(engine.url, clock=clock)
    try:
        engine.load(prompt=1000, generation=500, requests=9, ttft=[0.05] * 50)
        scraper.scrape()
        engine.stop()
        engine = FakeEngine("vllm-0.32", port=engine.server.server_port)     # counters from zero
        engine.load(running=3, prompt=10, ttft=[0.05])
        clock.t += 5
        d = scraper.scrape()
        assert d == {"serving_requests_running": 3, "serving_requests_waiting": 0, "serving_kv_cache_usage_ratio": 0}
    finally:
        scraper.close()
        engine.stop()


class _Answer(http.server.BaseHTTPRequestHandler):
    status, body = 404, b'{"detail":"Not Found"}'

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def _server(status: int, body: bytes):
    handler = type("H", (_Answer,), dict(status=status, body=body))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_port}"


@pytest.mark.parametrize("status,body,words", [
    (404, b'{"detail":"Not Found"}', "HTTP 404 (SGLang serves metrics only with --enable-metrics)"),
    (200, b"<html>a dashboard</html>", "no vLLM, SGLang or TensorRT-LLM metrics"),
    (200, b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{x=\"1} 3\n",
     "prometheus_client could not parse"),
    (500, b"oops", "HTTP 500"),
])
def test_what_is_not_an_engine_exposition_is_named(status, body, words):
    srv, url = _server(status, body)
    try:
        with pytest.raises((OSError, sm.ExpositionError)) as err:
            sm.EngineScraper(url).scrape()
        assert words in str(err.value) and url in str(err.value) or words in str(err.value)
    finally:
        srv.shutdown()


def test_an_engine_that_is_gone_is_an_error_not_a_hang():
    engine = FakeEngine("sglang")
    url = engine.url
    engine.stop()
    with pytest.raises(OSError) as err:
        sm.EngineScraper(url, timeout_s=1.0).scrape()
    assert url in str(err.value)
    with pytest.raises(ValueError):
        sm.EngineScraper("127.0.0.1:8000")


def test_the_sampler_gives_every_gpu_of_an_engine_its_numbers_and_follows_discovery():
    a, b = FakeEngine("vllm-0.32"), FakeEngine("sglang")
    found = [(a.url, [0, 1]), (a.url + "/", [2]), (b.url, [5])]
    mono = Clock(0.0)
    sampler = ServingSampler(lambda: list(found), rediscover_s=30, monotonic=mono)
    try:
        first = sampler.scrape()
        assert sampler.engines == {a.url: [0, 1, 2], b.url: [5]} and first.samples == [] and not first.errors
        a.load(running=4, generation=100)
        b.load(waiting=9)
        second = sampler.scrape()
        assert sorted(s.gpu for s in second.samples) == [0, 1, 2, 5]
        by_gpu = {s.gpu: s.values for s in second.samples}
        assert by_gpu[1]["serving_requests_running"] == 4 and by_gpu[5]["serving_requests_waiting"] == 9
        b.stop()
        third = sampler.scrape()
        assert sorted(s.gpu for s in third.samples) == [0, 1, 2]
        assert any(b.url in k for k in third.errors)
        found[:] = [(a.url, [0])]                            # the engine moved: rediscovered after 30 s
        mono.t += 31
        sampler.scrape()
        assert sampler.engines == {a.url: [0]}
    finally:
        sampler.close()
        a.stop()


# -- found in a trial ------------------------------------------------------------------------
def test_a_brace_never_closed_costs_linear_time_not_a_frozen_agent():
    import time as _t
    line = 'vllm:num_requests_running{engine="0" 1\n'
    c = _t.process_time()
    with pytest.raises(sm.ExpositionError):
        sm.parse("# TYPE vllm:num_requests_running gauge\n" + line * 16_000, 0)
    assert _t.process_time() - c < 2.0          # was 217 s: the label regex ran on through the text
    with pytest.raises(sm.ExpositionError, match="a line of"):
        sm.parse("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{" + "{" * 100_000 + "} 1\n", 0)


@pytest.mark.parametrize("series,value,drop", [
    ("vllm:prompt_tokens_total{", "+Inf", "serving_prompt_tokens_per_second"),
    ("vllm:num_requests_waiting{", "2e9", "serving_requests_waiting"),
    ('vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"', "NaN", "serving_ttft_p99_seconds"),
])
def test_values_no_engine_could_have_are_dropped_not_sent(series, value, drop):
    """The analyzer refuses a batch with a value past its ceiling, and every
    GPU's samples in it with it: such a value never leaves the agent."""
    import re
    base = (VLLM / "metrics_busy.txt").read_text()
    odd = re.sub(r"^(" + re.escape(series) + r"[^\n]*\}) \S+$", lambda m: f"{m.group(1)} {value}", base, flags=re.M)
    assert odd != base
    d = sm.derive(sm.parse(base, 0), sm.parse(odd, 5))
    assert drop not in d and all(0 <= v < 1e9 for v in d.values()) and len(d) >= 5


def test_garbage_in_one_histogram_names_the_url_and_spares_other_engines():
    good = FakeEngine("sglang")
    srv, url = _server(200, b'# TYPE vllm:time_to_first_token_seconds histogram\n'
                            b'vllm:time_to_first_token_seconds_bucket{engine="0,le=",le="abc"} 1\n')
    sampler = ServingSampler(lambda: [(url, [0]), (good.url, [1])])
    try:
        sampler.scrape()
        good.load(running=3)
        second = sampler.scrape()
        assert [s.gpu for s in second.samples] == [1]
        assert any(url in k and "could not parse" in k for k in second.errors)
    finally:
        sampler.close()
        srv.shutdown()
        good.stop()


def test_a_server_that_trickles_its_answer_is_cut_at_the_deadline():
    import socket
    import time as _t
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def trickle():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(20):
            _t.sleep(0.4)
            try:
                conn.sendall(b"#")
            except OSError:
                return
        conn.close()
    threading.Thread(target=trickle, daemon=True).start()
    t0 = _t.monotonic()
    with pytest.raises(OSError, match="no whole answer within 1 s"):
        sm.EngineScraper(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1.0).scrape()
    assert _t.monotonic() - t0 < 3
    listener.close()


def test_trtllm_serve_is_read_at_its_prometheus_path():
    """trtllm-serve answers /metrics with JSON iteration stats and serves
    Prometheus text at /prometheus/metrics."""
    engine = FakeEngine("trtllm")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            import urllib.request
            if self.path == "/metrics":
                body = b'[{"gpuMemUsage": 1, "iter": 3}]'
            elif self.path == "/prometheus/metrics":
                body = urllib.request.urlopen(engine.url + "/metrics").read()
            else:
                body = b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    clock = Clock()
    scraper = sm.EngineScraper(f"http://127.0.0.1:{srv.server_port}", clock=clock)
    try:
        engine.load(running=1, e2e=[0.5])
        scraper.scrape()
        engine.load(running=5)
        clock.t += 5
        assert scraper.scrape()["serving_requests_running"] == 5 and scraper._path == "/prometheus/metrics"
    finally:
        scraper.close()
        srv.shutdown()
        engine.stop()


def test_readings_prometheus_would_give_for_odd_but_legal_expositions():
    only_inf = ('# TYPE vllm:time_to_first_token_seconds histogram\n'
                'vllm:time_to_first_token_seconds_bucket{le="+Inf"} %d\n')
    assert "serving_ttft_p50_seconds" not in sm.derive(sm.parse(only_inf % 1, 0), sm.parse(only_inf % 9, 5))
    openmetrics_counter = "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total %d\n"
    d = sm.derive(sm.parse(openmetrics_counter % 100, 0), sm.parse(openmetrics_counter % 600, 5))
    assert d == {"serving_generation_tokens_per_second": 100.0}
    untyped_gauge = "vllm:num_requests_waiting 7\n"
    assert sm.parse(untyped_gauge, 0).gauges == {"waiting": 7.0}


def _expositions() -> list[str]:
    from prometheus_client import generate_latest
    texts = [(VLLM / f"metrics_{n}.txt").read_text() for n in ("idle", "busy", "after")]
    for flavour, series, tp in (("sglang", 2, 2), ("trtllm", 1, 1), ("vllm-0.6", 1, 1)):
        engine = FakeEngine(flavour, series=series, tp=tp)
        try:
            engine.load(running=3, waiting=2, kv=0.5, requests=4, prompt=100, generation=50, preemptions=1,
                        ttft=[0.05] * 7, itl=[0.015] * 9, queue=[0.7] * 3, e2e=[2.0] * 3)
            texts.append(generate_latest(engine.registry).decode())
        finally:
            engine.stop()
    return texts


_BASES = _expositions()


def _moved(line: str, factor: float) -> str:
    head, _, value = line.rpartition(" ")
    try:
        return f"{head} {float(value) * factor + 1}" if head and not line.startswith("#") else line
    except ValueError:
        return line


def _mutate(text: str, rnd, kind: str) -> str:
    """One change a real engine's next answer could bring (or a broken one)."""
    lines = text.split("\n")
    samples = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")]
    i = rnd.choice(samples)
    head, _, value = lines[i].rpartition(" ")
    if kind == "values":
        return "\n".join(_moved(ln, rnd.choice((1, 2, 1.5))) for ln in lines)
    if kind == "drop":
        del lines[i]
    elif kind == "new series":
        lines.insert(i + 1, head.replace('="', '="x', 1) + " " + value if "{" in head else head + "_x 1")
    elif kind == "swap":
        j = rnd.choice(samples)
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "retype":
        t = [k for k, ln in enumerate(lines) if ln.startswith("# TYPE")]
        k = rnd.choice(t)
        lines[k] = lines[k].rpartition(" ")[0] + " " + rnd.choice(("gauge", "counter", "histogram", "untyped"))
    elif kind == "timestamp":
        lines[i] += " 1700000000000"
    elif kind == "tab":
        lines[i] = head + "\t" + value
    elif kind == "garbage":
        lines[i] = head + " " + rnd.choice(("1_0", "abc", "", "0x10", "+Inf", "NaN", "-1"))
    elif kind == "blank":
        lines.insert(i, "")
    return "\n".join(lines)


@example(base=0, seed=73374, kinds=["drop", "swap", "swap"])    # found by CI: a sample moved past a TYPE line
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.integers(0, len(_BASES) - 1), seed=st.integers(0, 2**32 - 1),
       kinds=st.lists(st.sampled_from(("values", "values", "drop", "new series", "swap", "retype", "timestamp",
                                       "tab", "garbage", "blank")), min_size=1, max_size=6))
def test_reading_scrape_after_scrape_is_what_parsing_each_afresh_gives(base, seed, kinds):
    """The agent reads an engine's next exposition against the lines it saw
    before; whatever changed, the reading is the one a fresh parse gives,
    error or not."""
    import random
    rnd = random.Random(seed)
    reader, text = sm.Exposition(), _BASES[base]
    for n, kind in enumerate(["values", *kinds]):
        text = _mutate(text, rnd, kind) if n else text
        try:
            want = sm.parse(text, n)
        except sm.ExpositionError as exc:
            want = type(exc)
        try:
            got = reader.read(text, n)
        except sm.ExpositionError as exc:
            got = type(exc)
        assert got == want, (kind, n)
