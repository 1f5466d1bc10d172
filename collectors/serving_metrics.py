"""Serving engines' Prometheus metrics: vLLM (`vllm:`), SGLang (`sglang:`,
with `--enable-metrics`) and TensorRT-LLM (`trtllm_`, `trtllm:` behind
Dynamo), read from the engine's `/metrics` and turned into what a GPU's
bottleneck is judged beside: request and token rates, queue depth,
KV-cache usage, preemption rate, and TTFT, inter-token, queue-time and
end-to-end latency percentiles from histogram deltas.

Each quantity lists the family names that carry it, across engines and
versions (vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc` and
`time_per_output_token_seconds` to `inter_token_latency_seconds`; SGLang
the latter too). The first family present wins. Series of one family
(vLLM's `engine` and `model_name` labels: one per data-parallel engine;
`finished_reason` on request counters) are added up, except KV-cache usage,
where the fullest engine is the pressure.

Parsing is prometheus_client's parser over only the lines of the families
used, each sample's labels but a bucket's `le` dropped (regex passes in C;
`model_name` is read once on its own): the parser costs ~15 us a line in
Python, most of it in labels, and a vLLM exposition is ~600 lines of which
~110 matter (docs/benchmarks.md, "Serving metrics").
"""
from __future__ import annotations

import http.client
import math
import re
import time
import urllib.parse
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

# quantity -> (type, families that carry it, newest name first per engine)
QUANTITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": (GAUGE, ("vllm:num_requests_running", "sglang:num_running_reqs", "trtllm_num_requests_running",
                        "trtllm:num_requests_running")),
    "waiting": (GAUGE, ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_num_requests_waiting",
                        "trtllm:num_requests_waiting")),
    "kv_cache": (GAUGE, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                         "trtllm_kv_cache_utilization", "trtllm:kv_cache_utilization")),
    "requests": (COUNTER, ("vllm:request_success", "sglang:num_requests", "trtllm_request_success",
                           "trtllm:request_success")),
    "prompt_tokens": (COUNTER, ("vllm:prompt_tokens", "sglang:prompt_tokens", "trtllm_prompt_tokens",
                                "trtllm:prompt_tokens")),
    "generation_tokens": (COUNTER, ("vllm:generation_tokens", "sglang:generation_tokens",
                                    "trtllm_generation_tokens", "trtllm:generation_tokens")),
    "preemptions": (COUNTER, ("vllm:num_preemptions", "sglang:num_retracted_requests")),
    "ttft": (HISTOGRAM, ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds",
                         "trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds")),
    "itl": (HISTOGRAM, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                        "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds",
                        "trtllm_time_per_output_token_seconds", "trtllm:time_per_output_token_seconds")),
    "queue_time": (HISTOGRAM, ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds",
                               "trtllm_request_queue_time_seconds", "trtllm:request_queue_time_seconds")),
    "e2e": (HISTOGRAM, ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
                        "trtllm_e2e_request_latency_seconds", "trtllm:e2e_request_latency_seconds")),
}
ENGINE_PREFIXES = (("vllm", "vllm:"), ("sglang", "sglang:"), ("tensorrt-llm", "trtllm"))

# catalogue metric (collectors/catalogue.py) -> how it is derived
GAUGES = {"serving_requests_running": "running", "serving_requests_waiting": "waiting",
          "serving_kv_cache_usage_ratio": "kv_cache"}
RATES = {"serving_requests_per_second": "requests", "serving_prompt_tokens_per_second": "prompt_tokens",
         "serving_generation_tokens_per_second": "generation_tokens",
         "serving_preemptions_per_second": "preemptions"}
PERCENTILES = {"serving_ttft_p50_seconds": ("ttft", 0.5), "serving_ttft_p99_seconds": ("ttft", 0.99),
               "serving_itl_p50_seconds": ("itl", 0.5), "serving_itl_p99_seconds": ("itl", 0.99),
               "serving_queue_time_p99_seconds": ("queue_time", 0.99), "serving_e2e_p99_seconds": ("e2e", 0.99)}
METRICS = (*GAUGES, *RATES, *PERCENTILES)

_FAMILY_OF: dict[str, str] = {f: q for q, (_, fams) in QUANTITIES.items() for f in fams}
# the lines of the families used: TYPE lines, gauge and counter samples, histogram buckets (HELP,
# `_created`, `_sum`, `_count` and every other family dropped)
_LINES = re.compile(
    r"^(?:# TYPE )?(?:" + "|".join(re.escape(f) for f in sorted(_FAMILY_OF, key=len, reverse=True))
    + r")(?:_total|_bucket)?[ {].*$", re.M)
_MODEL = re.compile(r'[{,]model_name="((?:[^"\\]|\\.)*)"')
_LABELS = re.compile(r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}')
_LE = re.compile(r'(?:^|,)\s*le="([^"]*)"')


class ExpositionError(ValueError):
    """The text is not a Prometheus exposition prometheus_client can read."""


@dataclass
class Reading:
    """One scrape of one engine, summed over its series."""
    t: float
    engine: str = ""                   # vllm, sglang, tensorrt-llm ("" when no family is known)
    model: str = ""
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[tuple[float, ...], list[float]]] = field(default_factory=dict)  # bounds, cumulative


def parse(text: str, t: float) -> Reading:
    """The quantities an exposition carries; raises ExpositionError when the
    parser refuses the lines used."""
    m = _MODEL.search(text)
    kept = _LABELS.sub(_only_le, "\n".join(_LINES.findall(text)))
    r = Reading(t, model=m.group(1) if m else "")
    seen: dict[str, str] = {}            # quantity -> the family that gave it
    try:
        families = list(text_string_to_metric_families(kept + "\n"))
    except Exception as exc:  # the parser raises ValueError, and others on some garbage
        raise ExpositionError(f"prometheus_client could not parse the exposition: {exc}") from None
    for fam in families:
        q = _FAMILY_OF.get(fam.name)
        if q is None:
            continue
        kind, names = QUANTITIES[q]
        if fam.type != kind or not fam.samples:   # declared, no series yet: as if absent
            continue
        if q in seen and names.index(seen[q]) < names.index(fam.name):
            continue                      # a newer name of the same quantity is already read
        seen[q] = fam.name
        if kind == HISTOGRAM:
            r.histograms[q] = _histogram(fam.samples)
        else:
            values = [s.value for s in fam.samples if s.name in (fam.name, fam.name + "_total")]
            if kind == GAUGE:
                r.gauges[q] = max(values) if q == "kv_cache" else math.fsum(values)
            else:
                r.counters[q] = math.fsum(values)
    r.engine = next((e for e, p in ENGINE_PREFIXES if any(f.startswith(p) for f in seen.values())), "")
    if not seen:
        raise ExpositionError("no vLLM, SGLang or TensorRT-LLM metrics in it (is this a serving engine's "
                              "/metrics? SGLang needs --enable-metrics)")
    return r


def _only_le(m: re.Match) -> str:
    """A sample's labels, all but a bucket's `le` dropped: series are added
    up (or the fullest taken) whatever their labels, and the parser spends
    most of its time in labels, character by character."""
    le = _LE.search(m.group(1))
    return '{le="%s"}' % le.group(1) if le else ""


def _histogram(samples) -> tuple[tuple[float, ...], list[float]]:
    """Cumulative bucket counts by upper bound, summed over the series."""
    by_le: dict[float, float] = {}
    for s in samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels.get("le", "nan"))
            if not math.isnan(le):
                by_le[le] = by_le.get(le, 0.0) + s.value
    bounds = tuple(sorted(by_le))
    return bounds, [by_le[b] for b in bounds]


def quantile(q: float, bounds: tuple[float, ...], cumulative: list[float]) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the
    rank; the lowest bucket starts at 0; a rank in +Inf is the highest finite
    bound. None without observations."""
    if not bounds or not cumulative or cumulative[-1] <= 0:
        return None
    total = cumulative[-1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b, c in zip(bounds, cumulative):
        if c >= rank:
            if math.isinf(b):
                return prev_bound
            if c == prev_count:
                return b
            lo = prev_bound if prev_bound <= b else 0.0
            return lo + (b - lo) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = b, c
    return prev_bound


def derive(prev: Reading, cur: Reading) -> dict[str, float]:
    """Catalogue values for the interval between two readings: gauges as
    now, counters as rates, percentiles of the observations made in the
    interval. A series absent before counts from zero (engines create them
    at their first event); one that went down (the engine restarted) gives
    nothing for the interval."""
    out: dict[str, float] = {}
    for metric, q in GAUGES.items():
        if q in cur.gauges and math.isfinite(cur.gauges[q]) and cur.gauges[q] >= 0:
            out[metric] = min(cur.gauges[q], 1.0) if q == "kv_cache" else cur.gauges[q]
    dt = cur.t - prev.t
    if dt <= 0:
        return out
    for metric, q in RATES.items():
        if q in cur.counters and cur.counters[q] >= prev.counters.get(q, 0.0):
            out[metric] = (cur.counters[q] - prev.counters.get(q, 0.0)) / dt
    for metric, (q, p) in PERCENTILES.items():
        now = cur.histograms.get(q)
        if now is None:
            continue
        before = prev.histograms.get(q, (now[0], [0.0] * len(now[1])))
        if now[0] != before[0]:
            continue                       # other buckets: the engine restarted with other bounds
        delta = [a - b for a, b in zip(now[1], before[1])]
        if any(d < 0 for d in delta):
            continue
        v = quantile(p, now[0], delta)
        if v is not None:
            out[metric] = v
    return out


class EngineScraper:
    """One engine's `/metrics` over a kept-alive HTTP connection; each
    scrape returns the values for the interval since the previous one
    (nothing for the first)."""

    MAX_BYTES = 16 << 20         # a vLLM exposition is ~50 KB; a runaway one is refused, not read whole

    def __init__(self, base_url: str, timeout_s: float = 2.0, clock=time.time) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"serving URL {base_url!r}: expected http://HOST:PORT")
        self.base_url = base_url.rstrip("/")
        self._u = u
        self._timeout = timeout_s
        self._clock = clock
        self._conn: http.client.HTTPConnection | None = None
        self._prev: Reading | None = None
        self.last: Reading | None = None

    def scrape(self) -> dict[str, float]:
        """Raises OSError (unreachable, HTTP error) or ExpositionError."""
        t = self._clock()
        cur = parse(self._get(), t)
        self.last = cur
        prev, self._prev = self._prev, cur
        return {} if prev is None else derive(prev, cur)

    def _get(self) -> str:
        path = (self._u.path.rstrip("/") or "") + "/metrics"
        for attempt in (0, 1):            # a kept-alive connection the server closed: once more, fresh
            conn = self._conn or self._connect()
            try:
                conn.request("GET", path, headers={"Accept": "text/plain", "Accept-Encoding": "identity"})
                resp = conn.getresponse()
                body = resp.read(self.MAX_BYTES + 1)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
                continue
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise OSError(f"{self.base_url}/metrics: {exc}") from None
            if resp.status != 200:
                self.close()
                hint = " (SGLang serves metrics only with --enable-metrics)" if resp.status == 404 else ""
                raise OSError(f"{self.base_url}/metrics answered HTTP {resp.status}{hint}")
            if len(body) > self.MAX_BYTES:
                self.close()
                raise OSError(f"{self.base_url}/metrics: more than {self.MAX_BYTES >> 20} MiB")
            return body.decode("utf-8", "replace")
        raise OSError(f"{self.base_url}/metrics: connection closed")

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._u.scheme == "https" else http.client.HTTPConnection
        self._conn = cls(self._u.hostname, self._u.port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
