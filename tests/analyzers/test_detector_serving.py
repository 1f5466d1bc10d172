"""Serving anomalies: an engine's latency, queue, KV cache and preemptions
against its own baseline, beside an unchanged GPU verdict."""
import pytest

from gpuscope.analyzers.classify import Classification
from gpuscope.analyzers.detector import DEEP_KINDS, Detector, DetectorConfig

CFG = DetectorConfig(baseline_windows=20, warmup_windows=6, confirm_windows=2)
STEADY = dict(serving_ttft_p99_seconds=0.12, serving_itl_p99_seconds=0.020, serving_requests_waiting=2.0,
              serving_kv_cache_usage_ratio=0.55, serving_preemptions_per_second=0.0)


def _window(i: int, **serving) -> Classification:
    return Classification(gpu=0, start=5.0 * i, end=5.0 * i + 5, verdict="memory-bound", confidence=0.8,
                          summary="", evidence=dict(samples=50.0, **serving), activity=0.9, starved=0.0)


def _run(det: Detector, windows: list[dict], start: int = 0) -> list:
    return [a for i, ev in enumerate(windows, start) if (a := det.observe("h", _window(i, **ev), "pid:7 vllm serve"))]


@pytest.mark.parametrize("change,kind,words", [
    (dict(serving_ttft_p99_seconds=0.60), "serving-latency", "TTFT p99 600 ms against a usual 120 ms (5.0x)"),
    (dict(serving_itl_p99_seconds=0.095), "serving-latency", "ITL p99 95 ms against a usual 20 ms"),
    (dict(serving_requests_waiting=40.0), "serving-queue", "40 requests waiting against a usual 2"),
    (dict(serving_kv_cache_usage_ratio=0.97), "serving-kv-cache", "KV cache 97 % full with 2 requests waiting"),
    (dict(serving_preemptions_per_second=0.4), "serving-preemption", "0.4 preemptions/s on an engine that had none"),
])
def test_each_regression_fires_once_after_it_is_confirmed_and_asks_for_a_capture(change, kind, words):
    det = Detector(CFG)
    assert _run(det, [STEADY] * 10) == []
    found = _run(det, [{**STEADY, **change}] * 4, start=10)
    assert len(found) == 1 and found[0].kind == kind and words in found[0].reason
    assert kind in DEEP_KINDS                       # a capture, under the policy's budget
    assert _run(det, [STEADY] * 3, start=14) == []  # back to usual: quiet, and re-armed
    again = _run(det, [{**STEADY, **change}] * 2, start=17)
    assert [a.kind for a in again] == [kind]


def test_one_odd_window_and_small_absolute_rises_are_not_incidents():
    det = Detector(CFG)
    _run(det, [dict(STEADY, serving_itl_p99_seconds=0.004)] * 10)
    assert _run(det, [dict(STEADY, serving_itl_p99_seconds=0.016)] * 3, start=10) == []   # 4x, but only 12 ms more
    assert _run(det, [dict(STEADY, serving_ttft_p99_seconds=2.0)], start=13) == []         # one window
    assert _run(det, [dict(STEADY, serving_requests_waiting=8.0)] * 3, start=14) == []     # 4x, under queue_min


def test_an_engine_that_appears_later_warms_up_its_own_baseline():
    det = Detector(CFG)
    _run(det, [{}] * 10)                                   # the GPU ran something else (no /metrics) first
    assert _run(det, [STEADY] * 4, start=10) == []
    assert _run(det, [dict(STEADY, serving_ttft_p99_seconds=0.9)] * 3, start=14) == []   # 4 windows of baseline < 6
    assert _run(det, [STEADY] * 4, start=17) == []
    assert [a.kind for a in _run(det, [dict(STEADY, serving_ttft_p99_seconds=0.9)] * 2, start=21)] == ["serving-latency"]


def test_gpus_without_an_engine_carry_no_serving_baseline():
    det = Detector(CFG)
    _run(det, [{}] * 30)
    assert det._gpus[("h", 0)].history.serving is None
