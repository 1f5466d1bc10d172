"""Windows judged together (the live path at a window boundary) get exactly
the features each gets alone: no reduction leaks across window edges."""
import numpy as np
import pytest

from gpuscope.analyzers.features import Columns, compute_window, compute_windows, stack
from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.counters import rate


def _random_window(rng, gpu):
    n = int(rng.integers(1, 12))
    t = np.sort(rng.uniform(0, 5, n)) + 1.7e9
    names = ["util_gpu_ratio", "gpm_sm_util_ratio", "util_mem_ratio", "power_watts", "procs_cpu_cores",
             "pcie_tx_bytes_total", "pcie_rx_bytes_total", "throttle_sw_thermal_seconds_total",
             "clock_event_reasons", "gpm_dram_bw_util_ratio", "gpm_tensor_util_ratio"]
    names = [n for n in names if rng.random() < 0.8]
    cols = {}
    for name in names:
        if name.endswith("_total"):
            v = np.cumsum(rng.uniform(0, 3e9, n))
            if "pcie" in name:
                v = v % 2 ** 32                      # 32-bit counters wrap
        elif name == "clock_event_reasons":
            v = rng.choice([0, 4, 32, 64, 0x84], n).astype(float)
        else:
            v = rng.uniform(0, 1, n) * (700 if name == "power_watts" else 1)
        v[rng.random(n) < 0.2] = np.nan
        cols[name] = v
    dev = dict(pcie_generation=int(rng.choice([0, 4, 5])) or None, pcie_width=16,
               power_limit_watts=float(rng.choice([0, 700])) or None)
    return gpu, float(t[0]), float(t[0]) + 5, t, Columns.from_dict(cols, n), dev


@pytest.mark.parametrize("seed", range(20))
def test_stacked_windows_equal_windows_alone(seed):
    rng = np.random.default_rng(seed)
    parts = [_random_window(rng, g) for g in range(int(rng.integers(1, 40)))]
    together = compute_windows(stack(parts))
    for part, w in zip(parts, together):
        alone = compute_window(*part[:5], **part[5])
        assert (w is None) == (alone is None)
        if w is not None:
            assert w.samples == alone.samples == len(part[3])
            assert w.features.keys() == alone.features.keys()
            for k, v in w.features.items():
                assert v == pytest.approx(alone.features[k], rel=1e-12, abs=1e-12), k


@pytest.mark.parametrize("seed", range(10))
def test_windows_given_as_the_parts_they_arrived_in_equal_windows_given_whole(seed):
    """The live path hands each window's batches as they came (their own
    metric sets, sometimes out of time order): stacked once, they give what
    the window given whole does."""
    from gpuscope.analyzers.features import stack_columns
    rng = np.random.default_rng(200 + seed)
    whole, split = [], []
    for g in range(int(rng.integers(1, 30))):
        pieces = [_random_window(rng, g) for _ in range(int(rng.integers(1, 4)))]
        if rng.random() < 0.3:
            pieces = pieces[::-1]                 # a resent batch after a newer one
        ts = [p[3] for p in pieces]
        rows = [(p[4].names, p[4].matrix) for p in pieces]
        whole.append((g, pieces[0][1], pieces[0][2], np.concatenate(ts), stack_columns(rows), pieces[0][5]))
        split.append((g, pieces[0][1], pieces[0][2], ts, rows, pieces[0][5]))
    a, b = stack(whole), stack(split)
    assert a.names == b.names
    np.testing.assert_array_equal(a.t, b.t)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.matrix[:, [a.names.index(n) for n in b.names]], b.matrix)
    for x, y in zip(compute_windows(a), compute_windows(b)):
        assert (x is None) == (y is None) and (x is None or x.features == y.features)


@pytest.mark.parametrize("seed", range(10))
def test_counter_rates_follow_the_counter_rule(seed):
    """The stacked rate is collectors.counters.rate, window by window."""
    rng = np.random.default_rng(100 + seed)
    parts = [_random_window(rng, g) for g in range(15)]
    for part, w in zip(parts, compute_windows(stack(parts))):
        if w is None:
            continue
        _, _, _, t, cols, _ = part
        tx, rx = (cols.matrix[:, cols.names.index(n)] if n in cols.names else None
                  for n in ("pcie_tx_bytes_total", "pcie_rx_bytes_total"))
        rates = [rate(t, v, cat.BY_NAME["pcie_tx_bytes_total"].wrap_bits) for v in (tx, rx) if v is not None]
        rates = [r for r in rates if r is not None]
        if rates:
            assert w.features["pcie_bytes_per_second"] == pytest.approx(sum(rates))
        else:
            assert "pcie_bytes_per_second" not in w.features


def test_a_window_without_activity_readings_is_none_among_others():
    t = np.arange(5.0) + 1.7e9
    busy = Columns(("util_gpu_ratio",), np.full((5, 1), 0.9))
    blind = Columns(("power_watts",), np.full((5, 1), 300.0))
    out = compute_windows(stack([(0, t[0], t[0] + 5, t, busy, {}), (1, t[0], t[0] + 5, t, blind, {}),
                                 (2, t[0], t[0] + 5, t, busy, {})]))
    assert [w is None for w in out] == [False, True, False]
    assert out[2].gpu == 2 and out[2].features["util_gpu_ratio"] == pytest.approx(0.9)
    assert "power_watts" not in out[0].features      # NaN-filled for the window that lacked it


def test_samples_out_of_order_in_a_window_are_put_in_time_order():
    """A batch resent after a newer one lands its samples after later ones:
    the window's counter rate is the same as if they had come in order."""
    t = np.arange(6.0) + 1.7e9
    tx = np.arange(6.0) * 1e9                       # 1 GB/s
    cols = {"util_gpu_ratio": np.full(6, 0.5), "pcie_tx_bytes_total": tx, "pcie_rx_bytes_total": tx}
    order = np.array([3, 4, 5, 0, 1, 2])
    in_order = compute_window(0, t[0], t[0] + 6, t, Columns.from_dict(cols, 6))
    shuffled = compute_window(0, t[0], t[0] + 6, t[order], Columns.from_dict({k: v[order] for k, v in cols.items()}, 6))
    assert shuffled.features["pcie_bytes_per_second"] == pytest.approx(2e9)
    assert shuffled.features == in_order.features


def test_the_order_of_a_windows_samples_cannot_move_its_verdict():
    """A mean's last bit depends on the order of the additions; rules judge
    the rounded features, so whole-percent readings at a threshold (0.25,
    0.04, 0.91 average to 0.40, idle's ramp edge) judge the same in any order."""
    import itertools

    from gpuscope.analyzers.classify import classify
    t = np.arange(3.0) + 1.7e9
    util = np.array([0.25, 0.04, 0.91])
    seen = set()
    for order in itertools.permutations(range(3)):
        o = list(order)
        w = compute_window(0, t[0], t[0] + 5, t, Columns.from_dict({"util_gpu_ratio": util[o]}, 3))
        c = classify(w)
        seen.add((w.features["util_gpu_ratio"], c.verdict, c.confidence, c.summary))
    assert len(seen) == 1 and next(iter(seen))[0] == 0.4


def test_a_windows_samples_are_the_gpus_not_the_serving_rows_stored_beside_them():
    """The serving sampler's rows (serving_* metrics only, every 5 s) are
    stored beside the GPU's NVML rows; `samples` in the evidence, which the
    detector's strong_min_samples reads, counts the GPU's."""
    from gpuscope.analyzers.classify import classify
    n_gpu, n_serving = 10, 3
    t = np.concatenate([np.arange(n_gpu) * 0.5, np.arange(n_serving) * 1.6 + 0.2]) + 1.7e9
    nan_g, nan_s = np.full(n_serving, np.nan), np.full(n_gpu, np.nan)
    cols = {"util_gpu_ratio": np.concatenate([np.full(n_gpu, 0.9), nan_g]),
            "power_watts": np.concatenate([np.full(n_gpu, 400.0), nan_g]),
            "serving_requests_running": np.concatenate([nan_s, np.full(n_serving, 7.0)]),
            "serving_kv_cache_usage_ratio": np.concatenate([nan_s, np.full(n_serving, 0.5)])}
    parts = [(0, 1.7e9, 1.7e9 + 5, t, Columns.from_dict(cols, len(t)), {}),
             (1, 1.7e9, 1.7e9 + 5, t[:n_gpu], Columns.from_dict({k: v[:n_gpu] for k, v in cols.items()}, n_gpu), {})]
    w, alone = compute_windows(stack(parts))
    assert w.get("serving_requests_running") == 7.0 and w.get("util_gpu_ratio") == 0.9
    assert w.samples == alone.samples == n_gpu
    assert classify(w).evidence["samples"] == n_gpu


def test_features_read_only_their_declared_inputs(fixture_dir):
    """judge_newest (an agent's /metrics) gathers only features.INPUTS from
    its samples: a metric read but not declared would silently be NaN there."""
    from gpuscope.analyzers.features import INPUTS, feature_matrix
    from gpuscope.collectors.recording import read_recording
    rec = read_recording(fixture_dir / "samples.csv")
    idx = np.flatnonzero(rec.gpu == rec.gpu[0])[:400]
    every = {k: rec.metrics[k][idx] for k in rec.metrics}
    declared = {k: v for k, v in every.items() if k in INPUTS}
    assert len(declared) < len(every)                      # the recording has metrics the features never read
    parts = [(0, 0.0, 1.0, rec.t[idx][i:i + 50], Columns.from_dict({k: v[i:i + 50] for k, v in cols.items()}, 50), {})
             for cols in (every, declared) for i in range(0, 400, 50)]
    m = feature_matrix(stack(parts))
    np.testing.assert_array_equal(m[:8], m[8:])
    assert set(INPUTS) <= set(cat.NAMES)


def test_an_idle_link_s_gen1_reading_does_not_shrink_the_line_rate():
    """The agent read Gen1 while the GPU idled (ASPM); traffic later is measured against the
    link's best generation, or 20 GB/s would read as 5x a Gen1 x16 link."""
    t = np.arange(0.0, 5.0, 0.5)
    n = len(t)
    cols = Columns.from_dict({"util_gpu_ratio": np.full(n, 0.9), "gpm_pcie_tx_bytes_per_second": np.full(n, 20e9),
                              "gpm_pcie_rx_bytes_per_second": np.full(n, 20e9)}, n)
    facts = dict(pcie_generation=1, pcie_width=16, power_limit_watts=700.0)
    idle_read = compute_windows(stack([(0, 0.0, 5.0, t, cols, dict(facts, pcie_max_generation=5))]))[0]
    assert idle_read.features["pcie_link_util_ratio"] == pytest.approx(20e9 / (3.938e9 * 16))
    unknown_best = compute_windows(stack([(0, 0.0, 5.0, t, cols, facts)]))[0]
    assert unknown_best.features["pcie_link_util_ratio"] == pytest.approx(20e9 / (0.25e9 * 16))


def test_windows_features_are_the_known_numbers_of_each_row_whatever_the_mix_of_known_sets():
    """compute_windows groups windows by their set of known features, or goes
    row by row when the sets are mostly unlike: the same features either way."""
    from gpuscope.analyzers import features as F
    rng = np.random.default_rng(5)
    for k, unknown_share in ((400, 0.0), (400, 0.02), (400, 0.4), (7, 0.3)):
        m = rng.random((k, len(F.FEATURES)))
        m[rng.random(m.shape) < unknown_share] = np.nan
        m[:3, [F.FEATURE_INDEX["util_gpu_ratio"], F.FEATURE_INDEX["sm_util_ratio"]]] = np.nan   # no activity
        s = F.Stack(gpu=np.arange(k), start=np.zeros(k), end=np.ones(k), t=np.zeros(k), names=(),
                    matrix=np.empty((k, 0)), offsets=np.arange(k), pcie_generation=np.zeros(k),
                    pcie_width=np.zeros(k), power_limit_watts=np.zeros(k))
        windows = F.compute_windows(s, m)
        assert windows[:3] == [None, None, None]
        activity = [F.FEATURE_INDEX["util_gpu_ratio"], F.FEATURE_INDEX["sm_util_ratio"]]
        for w, row in zip(windows, m.tolist()):
            if all(row[i] != row[i] for i in activity):
                assert w is None
            else:
                assert list(w.features.items()) == [(n, v) for n, v in zip(F.FEATURES, row) if v == v]
