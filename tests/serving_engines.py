"""Serving engines' /metrics for tests: real HTTP servers whose expositions
prometheus_client produces with each engine's names, types and labels, as
the engines declare them (vLLM 0.32 and an older vLLM, SGLang new and old,
TensorRT-LLM bare and behind Dynamo)."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Flavour:
    """One engine version's names; None where it has no such metric."""
    running: str
    waiting: str
    kv_cache: str
    requests: str | None
    prompt_tokens: str
    generation_tokens: str
    preemptions: str | None
    ttft: str
    itl: str
    queue_time: str | None
    e2e: str
    labels: tuple[str, ...]


FLAVOURS = {
    "vllm-0.32": Flavour("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens",
                         "vllm:num_preemptions", "vllm:time_to_first_token_seconds",
                         "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
                         "vllm:e2e_request_latency_seconds", ("engine", "model_name")),
    "vllm-0.6": Flavour("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                        "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens",
                        "vllm:num_preemptions", "vllm:time_to_first_token_seconds",
                        "vllm:time_per_output_token_seconds", None, "vllm:e2e_request_latency_seconds",
                        ("model_name",)),
    "sglang": Flavour("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                      "sglang:num_requests", "sglang:prompt_tokens", "sglang:generation_tokens",
                      "sglang:num_retracted_requests", "sglang:time_to_first_token_seconds",
                      "sglang:inter_token_latency_seconds", "sglang:queue_time_seconds",
                      "sglang:e2e_request_latency_seconds", ("model_name", "tp_rank")),
    "sglang-old": Flavour("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                          "sglang:num_requests", "sglang:prompt_tokens", "sglang:generation_tokens", None,
                          "sglang:time_to_first_token_seconds", "sglang:time_per_output_token_seconds", None,
                          "sglang:e2e_request_latency_seconds", ("name",)),
    "trtllm": Flavour("trtllm_num_requests_running", "trtllm_num_requests_waiting", "trtllm_kv_cache_utilization",
                      "trtllm_request_success", "trtllm_prompt_tokens", "trtllm_generation_tokens", None,
                      "trtllm_time_to_first_token_seconds", "trtllm_time_per_output_token_seconds",
                      "trtllm_request_queue_time_seconds", "trtllm_e2e_request_latency_seconds",
                      ("model_name", "engine_type")),
    "trtllm-dynamo": Flavour("trtllm:num_requests_running", "trtllm:num_requests_waiting",
                             "trtllm:kv_cache_utilization", "trtllm:request_success", "trtllm:prompt_tokens",
                             "trtllm:generation_tokens", None, "trtllm:time_to_first_token_seconds",
                             "trtllm:time_per_output_token_seconds", "trtllm:request_queue_time_seconds",
                             "trtllm:e2e_request_latency_seconds", ("model_name",)),
}


class FakeEngine:
    """An engine's metrics, served over HTTP by prometheus_client. `series`
    label sets (vLLM: one per data-parallel engine) each carry the numbers
    given to `load`. Also unrelated families, as real expositions have."""

    def __init__(self, flavour: str, series: int = 1, model: str = "meta-llama/Llama-3.1-8B-Instruct", port: int = 0):
        self.flavour = FLAVOURS[flavour]
        f = self.flavour
        self.registry = r = CollectorRegistry()
        names = f.labels
        self.label_sets = [tuple(model if n in ("model_name", "name") else str(i) if n in ("engine", "tp_rank")
                                 else "trtllm" for n in names) for i in range(series)]
        self.running = Gauge(f.running, "running", names, registry=r)
        self.waiting = Gauge(f.waiting, "waiting", names, registry=r)
        self.kv = Gauge(f.kv_cache, "kv", names, registry=r)
        self.requests = Counter(f.requests, "requests", (*names, "finished_reason"), registry=r) if f.requests else None
        self.prompt = Counter(f.prompt_tokens, "prompt", names, registry=r)
        self.generation = Counter(f.generation_tokens, "generation", names, registry=r)
        self.preempt = Counter(f.preemptions, "preemptions", names, registry=r) if f.preemptions else None
        self.ttft = Histogram(f.ttft, "ttft", names, buckets=LATENCY, registry=r)
        self.itl = Histogram(f.itl, "itl", names, buckets=LATENCY, registry=r)
        self.queue = Histogram(f.queue_time, "queue", names, buckets=LATENCY, registry=r) if f.queue_time else None
        self.e2e = Histogram(f.e2e, "e2e", names, buckets=LATENCY, registry=r)
        noise = Histogram("noise_iteration_tokens_total", "unrelated", names, registry=r)
        Gauge("process_open_fds_total_fake", "unrelated", registry=r).set(3)
        for ls in self.label_sets:
            noise.labels(*ls).observe(4)
            for m in (self.running, self.waiting, self.kv):
                m.labels(*ls).set(0)
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=r)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def load(self, running=0, waiting=0, kv=0.0, requests=0, prompt=0, generation=0, preemptions=0,
             ttft=(), itl=(), queue=(), e2e=()) -> None:
        """Set the gauges and add to the counters and histograms of every series."""
        for ls in self.label_sets:
            self.running.labels(*ls).set(running)
            self.waiting.labels(*ls).set(waiting)
            self.kv.labels(*ls).set(kv)
            if self.requests is not None and requests:
                self.requests.labels(*ls, "stop").inc(requests)
            self.prompt.labels(*ls).inc(prompt)
            self.generation.labels(*ls).inc(generation)
            if self.preempt is not None and preemptions:
                self.preempt.labels(*ls).inc(preemptions)
            for hist, values in ((self.ttft, ttft), (self.itl, itl), (self.queue, queue), (self.e2e, e2e)):
                if hist is not None:
                    for v in values:
                        hist.labels(*ls).observe(v)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
