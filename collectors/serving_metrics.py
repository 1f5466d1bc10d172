"""Serving engines' Prometheus metrics: vLLM (`vllm:`), SGLang (`sglang:`,
with `--enable-metrics`) and TensorRT-LLM (`trtllm_`, `trtllm:` behind
Dynamo), read from the engine's `/metrics` and turned into what a GPU's
bottleneck is judged beside: request and token rates, queue depth,
KV-cache usage, preemption rate, and TTFT, inter-token, queue-time and
end-to-end latency percentiles from histogram deltas.

Each quantity lists the family names that carry it, across engines and
versions (vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc` and
`time_per_output_token_seconds` to `inter_token_latency_seconds`; SGLang
the latter too). The first family present wins.

Series of one family are combined by what their labels say they count:
- data-parallel ranks (vLLM's `engine`, SGLang's `dp_rank`) serve other
  requests: added up;
- the ranks of one engine (SGLang's `tp_rank`, `pp_rank`, `moe_ep_rank`:
  every scheduler reports with --enable-metrics-for-all-schedulers) see the
  same requests: one is read, the lowest, so that tensor parallelism of 8
  does not read as 8 times the traffic;
- any other label (`finished_reason` on request counters, `model_name`)
  splits requests: added up;
- KV-cache usage is not a count: the fullest engine is the pressure.

Parsing is prometheus_client's parser over only the lines of the families
used, each sample's labels but those rank labels and a bucket's `le`
dropped (regex passes in C; `model_name` is read once on its own): the
parser costs ~15 us a line in Python, most of it in labels, and a vLLM
exposition is ~600 lines of which ~110 matter. An engine's next
expositions are read against the lines the parser saw (`Exposition`):
only the numbers change between scrapes (docs/benchmarks.md, "Serving
metrics").
"""
from __future__ import annotations

import math
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from . import catalogue as cat
from .http_get import KeptAliveGet

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

# Labels that say which part of an engine a series comes from. Data-parallel ranks serve other requests;
# the model-parallel ranks of one engine (SGLang labels every scheduler's series with them) the same ones.
DATA_PARALLEL = ("engine", "dp_rank")
MODEL_PARALLEL = ("tp_rank", "pp_rank", "moe_ep_rank")

_FAMILY_OF: dict[str, str] = {f: q for q, (_, fams) in QUANTITIES.items() for f in fams}
# the lines of the families used: TYPE lines, gauge and counter samples, histogram buckets (HELP,
# `_created`, `_sum`, `_count` and every other family dropped)
_LINE = re.compile(
    r"(?:# TYPE )?(?:" + "|".join(re.escape(f) for f in sorted(_FAMILY_OF, key=len, reverse=True))
    + r")(?:_total|_bucket)?[ {]")
_MODEL = re.compile(r'[{,]model_name="((?:[^"\\\n]|\\.)*)"')
# within one line (a brace never closed must not make the search run on through the text)
_LABELS = re.compile(r'\{((?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*)\}')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"')
_LE = re.compile(r'(?:^|,)\s*le="([^"\\\n]*)"')
_MODEL_PARALLEL_LABEL = re.compile(r'[{,]\s*(' + "|".join(MODEL_PARALLEL) + r')\s*=\s*"([^"\\\n]*)"')
_KEPT_NAMES = ("le", *DATA_PARALLEL, *MODEL_PARALLEL)
MAX_LINE = 4096               # a sample line is ~100 characters; one past this is not an exposition's
_ACCEPTS = {GAUGE: {"gauge", "counter", "untyped", "unknown"}, COUNTER: {"counter", "untyped", "unknown", "gauge"},
            HISTOGRAM: {"histogram"}}      # a gauge or counter under the wrong TYPE still reads as itself


class ExpositionError(ValueError):
    """The text is not a Prometheus exposition prometheus_client can read."""


@dataclass
class Reading:
    """One scrape of one engine, its series combined (module docstring)."""
    t: float
    engine: str = ""                   # vllm, sglang, tensorrt-llm ("" when no family is known)
    model: str = ""
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[tuple[float, ...], list[float]]] = field(default_factory=dict)  # bounds, cumulative


def parse(text: str, t: float) -> Reading:
    """The quantities an exposition carries; raises ExpositionError when the
    parser refuses the lines used."""
    return Exposition().read(text, t)


class _Family(NamedTuple):
    name: str
    type: str
    samples: list


class Exposition:
    """Reads one engine's expositions, scrape after scrape. The first is
    parsed whole (lines picked, labels dropped, prometheus_client's parser);
    what each line turned into is kept, keyed by the line up to its value.
    While every line of the next exposition is one already seen, and only
    the numbers moved (an engine's series are fixed once it has served a
    few requests), its values are read against those keys: ~4x cheaper
    than picking and parsing again. Any other line (a new series, a
    changed TYPE, a timestamp, a tab) parses the whole exposition again."""

    def __init__(self) -> None:
        self._lines: dict[str, tuple] | None = None     # line up to its value -> what it is
        self._families: list[tuple[str, str]] = []      # (name, type), in the parser's order
        self._model = ""

    def read(self, text: str, t: float) -> Reading:
        if self._lines is not None:
            families = self._known(text)
            if families is not None:
                return _reading(families, t, self._model)
        return self._parse(text, t)

    def _known(self, text: str) -> list[_Family] | None:
        known, fams = self._lines, self._families
        samples: list[list] = [[] for _ in fams]
        last_k = -1
        for line in text.split("\n"):
            if not line:
                continue
            head, _, last = line.rpartition(" ")
            what = known.get(head) if head else None
            if what is None:
                return None
            if what is _SKIP:
                continue
            if what[0] is _TYPE:
                # TYPE lines start the parser's families: they keep their place among the samples too
                if last != what[1] or what[2] <= last_k:
                    return None
                last_k = what[2]
                continue
            k, i, name, labels = what
            if k <= last_k:                   # out of order: the parser would group the lines otherwise
                return None
            last_k = k
            if "_" in last:               # prometheus_client refuses `1_000`, float() does not
                return None
            try:
                value = float(last)
            except ValueError:
                return None
            samples[i].append(Sample(name, labels, value))
        return [_Family(n, typ, s) for (n, typ), s in zip(fams, samples)]

    def _parse(self, text: str, t: float) -> Reading:
        self._lines = None
        raw = [ln for ln in text.split("\n") if ln]
        used = [i for i, ln in enumerate(raw) if _LINE.match(ln)]
        long = next((len(raw[i]) for i in used if len(raw[i]) > MAX_LINE), None)
        if long is not None:
            raise ExpositionError(f"a line of {long} characters (at most {MAX_LINE}): not a Prometheus exposition")
        m = _MODEL.search(text)
        model = m.group(1) if m else ""
        picked = "\n".join(raw[i] for i in used)
        drop = _kept_labels if _several_ranks(picked) else _only_le
        kept = [_LABELS.sub(drop, raw[i]) for i in used]
        try:
            families = [_Family(f.name, f.type, f.samples) for f in text_string_to_metric_families("\n".join(kept) + "\n")]
        except Exception as exc:  # the parser raises ValueError, and others on some garbage
            raise ExpositionError(f"prometheus_client could not parse it: {str(exc)[:200]}") from None
        reading = _reading(families, t, model)
        self._remember(raw, used, kept, families, model)
        return reading

    def _remember(self, raw: list[str], used: list[int], kept: list[str], families: list[_Family],
                  model: str) -> None:
        """Keys each line by its text up to the value. Kept only when the
        parser's samples pair one to one, in order, with the lines used that
        are samples, each without a timestamp."""
        flat = [(i, s) for i, f in enumerate(families) for s in f.samples]
        lines: dict[str, tuple] = {}
        samples = iter(flat)
        used_set = set(used)
        for j, (line, kept_line) in enumerate(zip((raw[i] for i in used), kept)):
            body = kept_line.strip()
            head = line.rpartition(" ")[0]
            if not head:
                return
            if body.startswith("#"):
                parts = body.split()
                if len(parts) == 4 and parts[1] == "TYPE" and line.endswith(" " + parts[3]):
                    if head in lines:
                        return
                    lines[head] = (_TYPE, parts[3], j)
                    continue
                lines[head] = _SKIP
                continue
            nxt = next(samples, None)
            if nxt is None or nxt[1].timestamp is not None or head in lines:
                return
            i, s = nxt
            lines[head] = (j, i, s.name, s.labels)
        if next(samples, None) is not None:
            return
        for i, line in enumerate(raw):
            if i not in used_set:
                head = line.rpartition(" ")[0]
                if not head or lines.get(head, _SKIP) is not _SKIP:
                    return               # an unused line that reads as a used one: never take the shortcut
                lines[head] = _SKIP
        self._lines, self._model = lines, model
        self._families = [(f.name, f.type) for f in families]


_SKIP = object()
_TYPE = object()


def _reading(families: list[_Family], t: float, model: str) -> Reading:
    r = Reading(t, model=model)
    seen: dict[str, str] = {}            # quantity -> the family that gave it
    try:
        for fam in families:
            _read(r, fam, seen)
    except Exception as exc:  # a bucket bound that is not a number, and others on some garbage
        raise ExpositionError(f"prometheus_client could not parse it: {str(exc)[:200]}") from None
    r.engine = next((e for e, p in ENGINE_PREFIXES if any(f.startswith(p) for f in seen.values())), "")
    if not seen:
        raise ExpositionError("no vLLM, SGLang or TensorRT-LLM metrics in it (is this a serving engine's "
                              "/metrics? SGLang needs --enable-metrics)")
    return r


def _read(r: Reading, fam, seen: dict[str, str]) -> None:
    name = fam.name
    q = _FAMILY_OF.get(name)
    if q is None and name.endswith("_total"):       # `x_total` under `# TYPE x counter` reads untyped
        name = name[:-6]
        q = _FAMILY_OF.get(name)
    if q is None:
        return
    kind, names = QUANTITIES[q]
    if fam.type not in _ACCEPTS[kind] or not fam.samples:   # declared, no series yet: as if absent
        return
    if q in seen and names.index(seen[q]) < names.index(name):
        return                            # a newer name of the same quantity is already read
    if kind == HISTOGRAM:
        h = _histogram(fam.samples)
        if h is not None:
            r.histograms[q] = h
            seen[q] = name
        return
    values = [s for s in fam.samples if s.name in (name, name + "_total") and math.isfinite(s.value)]
    if not values:
        return
    seen[q] = name
    if q == "kv_cache":
        r.gauges[q] = max(s.value for s in values)
        return
    by_series: dict[tuple, float] = {}
    for s in values:
        key = _series(s.labels)
        by_series[key] = by_series.get(key, 0.0) + s.value
    (r.gauges if kind == GAUGE else r.counters)[q] = math.fsum(_one_rank_each(by_series).values())


def _series(labels: dict[str, str]) -> tuple[tuple[str, ...], tuple]:
    """(data-parallel rank, model-parallel ranks) of a sample; ranks
    compared as numbers ("10" after "9")."""
    if not labels or len(labels) == 1 and "le" in labels:
        return _NO_RANKS            # the usual case (_several_ranks): ~100 samples a scrape, so it is cheap
    return (tuple(labels.get(k, "") for k in DATA_PARALLEL),
            tuple((0, int(v), "") if v.isdecimal() else (1, 0, v) for v in (labels.get(k, "") for k in MODEL_PARALLEL)))


_NO_RANKS = (("",) * len(DATA_PARALLEL), ((1, 0, ""),) * len(MODEL_PARALLEL))


def _one_rank_each(by_series: dict[tuple, object]) -> dict[tuple, object]:
    """Each data-parallel rank's value, read from its lowest model-parallel
    rank: the others count the same requests."""
    first: dict[tuple, tuple] = {}
    for dp, ranks in by_series:
        if dp not in first or ranks < first[dp]:
            first[dp] = ranks
    return {dp: by_series[dp, ranks] for dp, ranks in first.items()}


def _several_ranks(text: str) -> bool:
    """Whether more than one model-parallel rank of an engine reports (SGLang
    with --enable-metrics-for-all-schedulers, or data-parallel attention):
    only then are the ranks kept through the parser, which pays for every
    character of a label (with one rank each, every series is added up)."""
    if "_rank" not in text:           # vLLM, TensorRT-LLM: a substring search, 50 times faster than the regex
        return False
    found = set(_MODEL_PARALLEL_LABEL.findall(text))
    return len({name for name, _ in found}) < len(found)


def _only_le(m: re.Match) -> str:
    """A sample's labels, all but a bucket's `le` dropped: the series are
    added up (or the fullest taken), and the parser spends most of its time
    in labels, character by character."""
    labels = m.group(1)
    le = _LE.search(labels)
    if le is not None and "\\" not in labels and labels.count('"', 0, le.start()) % 2 == 0:
        return '{le="%s"}' % le.group(1)      # the usual case: `le` found outside any quoted value
    le = next((v for k, v in _LABEL.findall(labels) if k == "le"), None)
    return '{le="%s"}' % le if le is not None else ""


def _kept_labels(m: re.Match) -> str:
    """A sample's labels, all but the ranks (DATA_PARALLEL, MODEL_PARALLEL)
    and a bucket's `le` dropped, for an engine with several ranks (label
    by label: a quoted value may hold `,tp_rank="1"`)."""
    kept = [f'{k}="{v}"' for k, v in _LABEL.findall(m.group(1)) if k in _KEPT_NAMES]
    return "{" + ",".join(kept) + "}" if kept else ""


def _histogram(samples) -> tuple[tuple[float, ...], list[float]] | None:
    """Cumulative bucket counts by upper bound, the series combined as the
    module docstring says; None when a bound or a count is not a number."""
    by_series: dict[tuple, dict[float, float]] = {}
    for s in samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels.get("le", "nan"))          # ValueError on garbage: the caller names it
            if math.isnan(le) or not math.isfinite(s.value):
                return None
            by_le = by_series.setdefault(_series(s.labels), {})
            by_le[le] = by_le.get(le, 0.0) + s.value
    total: dict[float, float] = {}
    for by_le in _one_rank_each(by_series).values():
        for le, count in by_le.items():
            total[le] = total.get(le, 0.0) + count
    bounds = tuple(sorted(total))
    return (bounds, [total[b] for b in bounds]) if bounds else None


def quantile(q: float, bounds: tuple[float, ...], cumulative: list[float]) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the
    rank; the lowest bucket starts at 0; a rank in +Inf is the highest finite
    bound. None without observations."""
    if not bounds or not cumulative or cumulative[-1] <= 0:
        return None
    total = cumulative[-1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, (b, c) in enumerate(zip(bounds, cumulative)):
        if c >= rank:
            if math.isinf(b):
                return prev_bound if i else None     # only +Inf: Prometheus says NaN, and so do we
            if c == prev_count:
                return b
            lo = prev_bound if prev_bound <= b else 0.0
            return lo + (b - lo) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = b, c
    return prev_bound


def derive(prev: Reading, cur: Reading) -> dict[str, float]:
    """Catalogue values for the interval between two readings: gauges as
    now, counters as rates, percentiles of the observations made in the
    interval. As Prometheus' rate(), a series needs both readings: one that
    went down (the engine restarted) or was not there before gives nothing
    for the interval. A value no engine could have (past the catalogue's
    ceiling for its unit) is dropped, not sent."""
    out: dict[str, float] = {}
    for metric, q in GAUGES.items():
        if q in cur.gauges:
            out[metric] = min(cur.gauges[q], 1.0) if q == "kv_cache" else cur.gauges[q]
    dt = cur.t - prev.t
    if dt > 0:
        for metric, q in RATES.items():
            if q in cur.counters and q in prev.counters and cur.counters[q] >= prev.counters[q]:
                out[metric] = (cur.counters[q] - prev.counters[q]) / dt
        for metric, (q, p) in PERCENTILES.items():
            now, before = cur.histograms.get(q), prev.histograms.get(q)
            if now is None or before is None or now[0] != before[0]:
                continue                   # other buckets: the engine restarted with other bounds
            delta = [a - b for a, b in zip(now[1], before[1])]
            if any(d < 0 for d in delta):
                continue
            v = quantile(p, now[0], delta)
            if v is not None:
                out[metric] = v
    return {k: v for k, v in out.items() if 0 <= v <= _CEILING[k]}      # NaN fails too


_CEILING = {m: cat.ceiling(cat.BY_NAME[m]) for m in METRICS}


class EngineScraper:
    """One engine's metrics over a kept-alive HTTP connection (http_get.py); each scrape
    returns the values for the interval since the previous one (nothing for
    the first). Where: `/metrics` (vLLM, SGLang, TensorRT-LLM behind
    Dynamo), else `/prometheus/metrics` (trtllm-serve, whose `/metrics` is
    JSON iteration stats); the one that answered is kept. Every error names
    the URL; a scrape never takes longer than `timeout_s` in all."""

    MAX_BYTES = 4 << 20          # a vLLM exposition is ~50 KB; a runaway one is refused, not read whole
    PATHS = ("/metrics", "/prometheus/metrics")

    def __init__(self, base_url: str, timeout_s: float = 2.0, clock=time.time) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"serving URL {base_url!r}: expected http://HOST:PORT")
        self.base_url = base_url.rstrip("/")
        self._http = KeptAliveGet(base_url, timeout_s, self.MAX_BYTES,
                                  {404: " (SGLang serves metrics only with --enable-metrics)"})
        self._clock = clock
        self._path: str | None = None          # the path that answered with an exposition
        self._prev: Reading | None = None
        self._exposition = Exposition()
        self.last: Reading | None = None

    def scrape(self) -> dict[str, float]:
        """Raises OSError (unreachable, HTTP error, too slow) or ExpositionError."""
        cur = self._read(self._clock())
        self.last = cur
        prev, self._prev = self._prev, cur
        return {} if prev is None else derive(prev, cur)

    def _read(self, t: float) -> Reading:
        if self._path is not None:
            return self._parse(self._path, self._http.get(self._path), t)
        first: Exception | None = None
        for path in self.PATHS:
            try:
                body = self._http.get(path)
                reading = self._parse(path, body, t)
            except (OSError, ExpositionError) as exc:
                first = first or exc
                continue
            self._path = path
            return reading
        raise first

    def _parse(self, path: str, body: str, t: float) -> Reading:
        try:
            return self._exposition.read(body, t)
        except ExpositionError as exc:
            raise ExpositionError(f"{self.base_url}{path}: {exc}") from None

    def close(self) -> None:
        self._http.close()
