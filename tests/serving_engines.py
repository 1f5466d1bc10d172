"""Serving engines' /metrics for tests: real HTTP servers whose expositions
prometheus_client produces with each engine's names, types and labels, as
the engines declare them (vLLM 0.32 and an older vLLM, SGLang new and old,
TensorRT-LLM bare and behind Dynamo).

Where the series come from, as in the engines: vLLM gives every family an
`engine` label, one series per data-parallel engine. SGLang's tokenizer
(requests, tokens, TTFT, inter-token and end-to-end latency) is one process
that counts every request, labelled by model and engine type only; its
schedulers (running, queued, token usage, retractions, queue time) label
theirs `tp_rank`, `pp_rank`, `moe_ep_rank`, and `dp_rank` when data-parallel
(sglang/srt/managers/scheduler_metrics_mixin.py), and every tensor-parallel
rank reports only with --enable-metrics-for-all-schedulers."""
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
    labels: tuple[str, ...]                  # every family's
    scheduler_labels: tuple[str, ...] = ()   # and the scheduler's families' besides (SGLang's ranks)
    data_parallel: str | None = None         # the label of a data-parallel rank, on the families that carry it


SGLANG_RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")
FLAVOURS = {
    "vllm-0.32": Flavour("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens",
                         "vllm:num_preemptions", "vllm:time_to_first_token_seconds",
                         "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
                         "vllm:e2e_request_latency_seconds", ("engine", "model_name"), (), "engine"),
    "vllm-0.6": Flavour("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                        "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens",
                        "vllm:num_preemptions", "vllm:time_to_first_token_seconds",
                        "vllm:time_per_output_token_seconds", None, "vllm:e2e_request_latency_seconds",
                        ("model_name",)),
    "sglang": Flavour("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                      "sglang:num_requests", "sglang:prompt_tokens", "sglang:generation_tokens",
                      "sglang:num_retracted_requests", "sglang:time_to_first_token_seconds",
                      "sglang:inter_token_latency_seconds", "sglang:queue_time_seconds",
                      "sglang:e2e_request_latency_seconds", ("model_name", "engine_type"), SGLANG_RANKS,
                      "dp_rank"),
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
    """An engine's metrics, served over HTTP by prometheus_client, with
    `series` data-parallel ranks (where the flavour has them; else one series
    carries them all) and `tp` tensor-parallel ranks each reporting (SGLang
    with --enable-metrics-for-all-schedulers). `load` gives every
    data-parallel rank its numbers, and every tensor-parallel rank of it the
    same ones. Also unrelated families, as real expositions have."""

    def __init__(self, flavour: str, series: int = 1, model: str = "meta-llama/Llama-3.1-8B-Instruct", port: int = 0,
                 tp: int = 1):
        self.flavour = f = FLAVOURS[flavour]
        self.series = series
        self.registry = r = CollectorRegistry()
        dp = (f.data_parallel,) if f.data_parallel and series > 1 and f.data_parallel not in f.labels else ()
        common = f.labels
        ranked = (*f.labels, *f.scheduler_labels, *dp)
        values = {"model_name": model, "name": model, "engine_type": "unified" if f.scheduler_labels else "trtllm"}

        def label_sets(names):
            by_dp = range(series) if f.data_parallel in names else (None,)
            by_tp = range(tp) if "tp_rank" in names else (0,)
            return [tuple(str(d) if n == f.data_parallel else str(t) if n == "tp_rank" else values.get(n, "0")
                          for n in names) for d in by_dp for t in by_tp]
        self.label_sets = {names: label_sets(names) for names in (common, ranked)}
        self._names = {}

        def family(cls, name, names, *extra, **kw):
            m = cls(name, name.split(":")[-1], (*names, *extra), registry=r, **kw)
            self._names[m] = names
            return m
        self.running = family(Gauge, f.running, ranked)
        self.waiting = family(Gauge, f.waiting, ranked)
        self.kv = family(Gauge, f.kv_cache, ranked)
        self.requests = family(Counter, f.requests, common, "finished_reason") if f.requests else None
        self.prompt = family(Counter, f.prompt_tokens, common)
        self.generation = family(Counter, f.generation_tokens, common)
        self.preempt = family(Counter, f.preemptions, ranked) if f.preemptions else None
        self.ttft = family(Histogram, f.ttft, common, buckets=LATENCY)
        self.itl = family(Histogram, f.itl, common, buckets=LATENCY)
        self.queue = family(Histogram, f.queue_time, ranked, buckets=LATENCY) if f.queue_time else None
        self.e2e = family(Histogram, f.e2e, common, buckets=LATENCY)
        noise = Histogram("noise_iteration_tokens_total", "unrelated", common, registry=r)
        Gauge("process_open_fds_total_fake", "unrelated", registry=r).set(3)
        for ls in self.label_sets[common]:
            noise.labels(*ls).observe(4)
        for m in (self.running, self.waiting, self.kv):
            for ls in self.label_sets[ranked]:
                m.labels(*ls).set(0)
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=r)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def _each(self, metric, *extra):
        """(series, how many data-parallel ranks' numbers it carries) of a family."""
        names = self._names[metric]
        share = 1 if self.flavour.data_parallel in names else self.series
        return [(metric.labels(*ls, *extra), share) for ls in self.label_sets[names]]

    def load(self, running=0, waiting=0, kv=0.0, requests=0, prompt=0, generation=0, preemptions=0,
             ttft=(), itl=(), queue=(), e2e=()) -> None:
        """Set the gauges and add to the counters and histograms of every
        data-parallel rank (a series without one carries them all)."""
        for m, v in ((self.running, running), (self.waiting, waiting)):
            for s, share in self._each(m):
                s.set(v * share)
        for s, _ in self._each(self.kv):
            s.set(kv)
        for m, v, extra in ((self.requests, requests, ("stop",)), (self.prompt, prompt, ()),
                            (self.generation, generation, ()), (self.preempt, preemptions, ())):
            if m is not None and v:
                for s, share in self._each(m, *extra):
                    s.inc(v * share)
        for hist, values in ((self.ttft, ttft), (self.itl, itl), (self.queue, queue), (self.e2e, e2e)):
            if hist is not None:
                for s, share in self._each(hist):
                    for v in values * share:
                        s.observe(v)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
