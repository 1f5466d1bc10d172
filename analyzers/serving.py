"""A serving engine's numbers beside a GPU's verdict: the words a window's
summary gains when the GPU runs vLLM, SGLang or TensorRT-LLM (its /metrics,
collectors/serving_metrics.py), so that "memory-bound" reads with "40
requests waiting, KV cache 96 % full, TTFT p99 0.80 s"."""
from __future__ import annotations

from typing import Callable


def _ms_or_s(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


# (feature, words), in the order an on-call reader wants them
_PARTS: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("serving_requests_running", lambda v: f"{v:.0f} running"),
    ("serving_requests_waiting", lambda v: f"{v:.0f} waiting"),
    ("serving_kv_cache_usage_ratio", lambda v: f"KV cache {100 * v:.0f} % full"),
    ("serving_generation_tokens_per_second", lambda v: f"{v:,.0f} tokens/s generated"),
    ("serving_prompt_tokens_per_second", lambda v: f"{v:,.0f} prompt tokens/s"),
    ("serving_preemptions_per_second", lambda v: f"{v:.2g} preemptions/s" if v > 0 else ""),
    ("serving_ttft_p99_seconds", lambda v: f"TTFT p99 {_ms_or_s(v)}"),
    ("serving_itl_p99_seconds", lambda v: f"ITL p99 {_ms_or_s(v)}"),
)


SERVING_WORDS = "; serving: "


def serving_words(get: Callable[[str], float | None]) -> str:
    """"; serving: ..." from a window's features (`get`: name -> value or
    None), or "" for a GPU without a serving engine."""
    if get("serving_requests_running") is None and get("serving_generation_tokens_per_second") is None:
        return ""
    words = [w for name, say in _PARTS if (v := get(name)) is not None and (w := say(v))]
    return SERVING_WORDS + ", ".join(words) if words else ""
