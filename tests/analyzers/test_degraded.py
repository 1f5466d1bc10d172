"""Degraded GPUs against their peers (analyzers/degraded.py), and the
simulated fleet bench/degraded.py scores it on."""
from __future__ import annotations

import time

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from gpuscope.analyzers.degraded import (DIMENSIONS, DegradedConfig, clocks_at_power_sql, find_degraded,
                                         unjudged_groups)

COLUMN = {d.name: d.column for d in DIMENSIONS}

# What a healthy GPU measures (calibrate's hbm_triad, matmul_bf16, h2d, d2d
# medians; SM clock under a power-limited GEMM), by model; then the spread
# between healthy GPUs of one model and driver, as a fraction.
HEALTHY = {"NVIDIA H100 80GB HBM3": dict(hbm=3.0e12, tensor=7.5e14, pcie=5.3e10, nvlink=3.8e11, clocks=1.755e9),
           "NVIDIA H200": dict(hbm=4.25e12, tensor=7.8e14, pcie=5.3e10, nvlink=3.8e11, clocks=1.83e9)}
DRIVERS = {"550.127.08": 0.985, "560.35.03": 1.0, "570.86.15": 1.01}     # what each does to every ceiling
NOISE = dict(hbm=0.02, tensor=0.025, pcie=0.02, nvlink=0.025, clocks=0.02)
MISSING = dict(hbm=0.03, tensor=0.03, pcie=0.03, nvlink=0.03, clocks=0.25)   # not calibrated; never at the limit


def simulated_fleet(hosts: int, gpus_per_host: int = 8, planted: int = 20, mild: int = 20, links: int = 12,
                    seed: int = 7, noise: float = 1.0) -> tuple[pa.Table, set[tuple[str, int, str]]]:
    """One row per GPU (find_degraded's input) and the (host, gpu, dimension)
    truly degraded: `planted` GPUs per dimension 10-30 % under healthy,
    `links` with a PCIe link trained at x8 or Gen4 (host-to-device halved),
    and `mild` per dimension 3-5 % under, which are not degraded. Hosts are
    of one model and driver each; every GPU has NOISE (x `noise`); some
    values are NULL."""
    rng = np.random.default_rng(seed)
    n = hosts * gpus_per_host
    host_model = rng.choice(list(HEALTHY), hosts)
    host_driver = rng.choice(list(DRIVERS), hosts)
    model, driver = np.repeat(host_model, gpus_per_host), np.repeat(host_driver, gpus_per_host)
    factor = np.array([DRIVERS[d] for d in driver])
    cols, truth = {}, set()
    unused = rng.permutation(n).tolist()            # each planted GPU is degraded in one way only
    for dim, col in COLUMN.items():
        base = np.array([HEALTHY[m][dim] for m in model]) * factor
        values = base * (1 + noise * NOISE[dim] * rng.standard_normal(n))
        present = rng.random(n) >= MISSING[dim]
        chosen = [i for i in unused if present[i]][:planted + mild]
        unused = [i for i in unused if i not in chosen]
        values[chosen[:planted]] *= 1 - rng.uniform(0.10, 0.30, planted)
        values[chosen[planted:]] *= 1 - rng.uniform(0.03, 0.05, len(chosen) - planted)
        truth |= {(f"node-{i // gpus_per_host:04d}", i % gpus_per_host, dim) for i in chosen[:planted]}
        cols[col] = pa.array(np.where(present, values, np.nan), from_pandas=True)   # NaN -> NULL
    gen, width = np.full(n, 5), np.full(n, 16)
    slow = [i for i in unused if cols["pcie_h2d_bytes_per_s"][i].is_valid][:links]
    for k, i in enumerate(slow):
        if k % 3:
            width[i] = 8
        else:
            gen[i] = 4
    h2d = cols["pcie_h2d_bytes_per_s"].to_numpy(zero_copy_only=False)
    h2d[slow] /= 2                                  # half the lanes or half the rate per lane
    cols["pcie_h2d_bytes_per_s"] = pa.array(h2d, from_pandas=True)
    truth |= {(f"node-{i // gpus_per_host:04d}", i % gpus_per_host, "pcie") for i in slow}
    idx = np.arange(n)
    table = pa.table({"host": [f"node-{h:04d}" for h in idx // gpus_per_host], "gpu": idx % gpus_per_host,
                      "uuid": [f"GPU-{i:08x}" for i in idx], "model": model, "driver": driver, **cols,
                      "pcie_generation": gen, "pcie_width": width, "pcie_max_generation": np.full(n, 5),
                      "pcie_max_width": np.full(n, 16)})
    return table, truth


def score(findings: list[dict], truth: set[tuple[str, int, str]]) -> dict[str, dict]:
    """Precision and recall per dimension and over all ("all")."""
    found = {(f["host"], f["gpu"], f["dimension"]) for f in findings}
    out = {}
    for dim in [d.name for d in DIMENSIONS] + ["all"]:
        f = {k for k in found if dim in ("all", k[2])}
        t = {k for k in truth if dim in ("all", k[2])}
        tp = len(f & t)
        out[dim] = dict(planted=len(t), found=len(f), true_positives=tp,
                        precision=tp / len(f) if f else 1.0, recall=tp / len(t) if t else 1.0)
    return out


def _group(values, model="NVIDIA H200", driver="570.86.15", column="hbm_bytes_per_s", **extra) -> pa.Table:
    n = len(values)
    return pa.table({"host": [f"h{i // 8}" for i in range(n)], "gpu": [i % 8 for i in range(n)],
                     "model": [model] * n, "driver": [driver] * n, column: pa.array(values, pa.float64()),
                     **extra})


@pytest.fixture
def con():
    c = duckdb.connect()
    yield c
    c.close()


def test_planted_outliers_found_with_their_dimension(con):
    rng = np.random.default_rng(1)
    n = 32
    cols = {d.column: 1e12 * (1 + 0.01 * rng.standard_normal(n)) for d in DIMENSIONS}
    for i, d in enumerate(DIMENSIONS):
        cols[d.column][i * 3] *= 0.8
    t = pa.table({"host": [f"h{i // 8}" for i in range(n)], "gpu": [i % 8 for i in range(n)],
                  "model": ["NVIDIA H100 80GB HBM3"] * n, "driver": ["550.127.08"] * n, **cols})
    found = find_degraded(con, t)
    assert {(f["host"], f["gpu"], f["dimension"]) for f in found} == \
        {(f"h{i * 3 // 8}", i * 3 % 8, d.name) for i, d in enumerate(DIMENSIONS)}
    hbm = next(f for f in found if f["dimension"] == "hbm")
    assert hbm["kind"] == "degraded" and hbm["peers"] == n and hbm["unit"] == "bytes/s"
    assert 0.18 < hbm["shortfall"] < 0.22 and hbm["z"] < -10
    assert hbm["summary"].startswith("HBM ") and "% under the median" in hbm["summary"]
    assert "of 32 peers (NVIDIA H100 80GB HBM3, driver 550.127.08)" in hbm["summary"]
    assert "GFLOP/s" in next(f for f in found if f["dimension"] == "tensor")["summary"]


def test_a_tight_group_does_not_flag_small_differences(con):
    # MAD 0: without the scale's floor, 1 % under would be z = -inf
    assert find_degraded(con, _group([4.25e12] * 15 + [4.25e12 * 0.95])) == []
    assert [f["gpu"] for f in find_degraded(con, _group([4.25e12] * 15 + [4.25e12 * 0.9]))] == [7]


def test_a_noisy_group_needs_the_z_bound_too(con):
    rng = np.random.default_rng(3)
    values = 4.25e12 * (1 + 0.05 * rng.standard_normal(64))
    values[0] = np.median(values) * 0.9             # 10 % under, but only ~2 sigma of this group's noise
    assert find_degraded(con, _group(values)) == []
    assert find_degraded(con, _group(values), DegradedConfig(max_z=-1.5))[0]["gpu"] == 0


def test_groups_under_the_minimum_are_not_judged(con):
    values = [4.25e12] * 6 + [2e12]
    assert find_degraded(con, _group(values)) == []
    assert len(find_degraded(con, _group(values), DegradedConfig(min_peers=7))) == 1


def test_groups_under_the_minimum_are_listed_as_not_judged(con):
    """Found in a trial: a 4-GPU box read "no degraded GPU" though nothing
    was compared. Groups too small are listed per dimension, with how many
    GPUs have a figure there (unknowns do not count) and the minimum."""
    box = _group([4.25e12, 4.2e12, 2e12, None], tensor_flops_per_s=pa.array([7.8e14] * 4))
    fleet = _group([3.0e12] * 8, model="NVIDIA H100 80GB HBM3")      # judged: not listed
    nameless = _group([1e12] * 2, driver=None)                         # no known peers at all: in no group
    t = pa.concat_tables([box, fleet, nameless], promote_options="default")
    assert find_degraded(con, t) == []
    assert unjudged_groups(con, t) == [
        dict(model="NVIDIA H200", driver="570.86.15", dimension="hbm", gpus=3, min_peers=8),
        dict(model="NVIDIA H200", driver="570.86.15", dimension="tensor", gpus=4, min_peers=8)]
    assert [g["dimension"] for g in unjudged_groups(con, t, DegradedConfig(min_peers=4))] == ["hbm"]
    con.register("gpus", t)
    assert len(unjudged_groups(con, "gpus")) == 2
    assert unjudged_groups(con, pa.table({"host": ["a"], "gpu": [0], "model": ["x"], "driver": ["1"]})) == []


def test_nulls_are_skipped_not_zeros(con):
    # 8 values and 4 unknowns: the group is 8 peers, and no unknown is "100 % under"
    values = [4.25e12] * 7 + [3e12] + [None] * 4
    found = find_degraded(con, _group(values))
    assert [(f["gpu"], f["peers"], f["peer_median"]) for f in found] == [(7, 8, 4.25e12)]
    assert find_degraded(con, _group([4.25e12] * 7 + [3e12] + [None]), DegradedConfig(min_peers=9)) == []


def test_models_and_drivers_are_never_compared(con):
    h100 = _group([3.0e12] * 8, model="NVIDIA H100 80GB HBM3")
    h200 = _group([4.25e12] * 8, model="NVIDIA H200")
    old = _group([3.9e12] * 8, driver="535.54.03")
    assert find_degraded(con, pa.concat_tables([h100, h200, old])) == []


def test_link_below_the_maximum_is_flagged_without_peers(con):
    t = pa.table({"host": ["a", "a", "b"], "gpu": [0, 1, 0], "model": ["NVIDIA H200"] * 3, "driver": ["570"] * 3,
                  "pcie_generation": [5, 4, None], "pcie_width": [16, 8, 8],
                  "pcie_max_generation": [5, 5, 5], "pcie_max_width": [16, 16, 16]})
    found = find_degraded(con, t)
    assert [(f["host"], f["gpu"], f["dimension"], f["summary"]) for f in found] == [
        ("a", 1, "pcie", "PCIe Gen4 ×8, the device supports Gen5 ×16"),
        ("b", 0, "pcie", "PCIe ×8, the device supports Gen5 ×16")]
    assert found[0]["link"]["pcie_width"] == 8 and found[0]["value"] is None


def test_a_slow_link_and_its_slow_copies_are_one_finding(con):
    n = 16
    h2d = [5.3e10] * (n - 1) + [2.6e10]
    t = _group(h2d, column="pcie_h2d_bytes_per_s", pcie_width=[16] * (n - 1) + [8], pcie_max_width=[16] * n)
    [f] = find_degraded(con, t)
    assert f["dimension"] == "pcie" and f["link"]["pcie_width"] == 8 and 0.5 < f["shortfall"] < 0.52
    assert f["summary"].startswith("PCIe ×8, the device supports ×16; PCIe host-to-device 26.0 GB/s, 51 % under")


def test_a_table_in_the_connection_works_too(con):
    con.register("t", _group([4.25e12] * 15 + [3e12]))
    con.execute("CREATE TABLE gpus AS SELECT * FROM t")
    assert [f["gpu"] for f in find_degraded(con, "gpus")] == [7]
    with pytest.raises(ValueError, match="driver"):
        find_degraded(con, pa.table({"host": ["a"], "gpu": [0], "model": ["x"]}))


def test_clocks_at_power_uses_only_samples_at_the_limit(con):
    t = np.arange(100.0)
    rows = pa.table({"host": ["a"] * 200, "gpu": [0] * 100 + [1] * 100, "t": np.concatenate([t, t]),
                     # GPU 0: at the limit half the time (1.7 GHz there, 1.98 GHz when light);
                     # GPU 1: at the limit only 10 samples, under the minimum
                     "power_watts": np.concatenate([np.where(t < 50, 690.0, 300.0), np.where(t < 10, 700.0, 200.0)]),
                     "power_limit_watts": np.full(200, 700.0),
                     "sm_clock_hertz": np.concatenate([np.where(t < 50, 1.7e9, 1.98e9), np.full(100, 1.9e9)])})
    con.register("samples", rows)
    assert con.execute(clocks_at_power_sql("samples")).fetchall() == [("a", 0, 1.7e9, 50)]


def test_simulated_fleet_precision_and_recall():
    table, truth = simulated_fleet(hosts=100, planted=6, mild=6, links=6, seed=11)
    t0 = time.perf_counter()
    found = find_degraded(duckdb.connect(), table)
    assert time.perf_counter() - t0 < 2
    s = score(found, truth)["all"]
    assert s["planted"] == 36
    assert s["precision"] >= 0.95 and s["recall"] >= 0.95, s


def test_only_keys_and_no_figures_find_nothing(con):
    assert find_degraded(con, pa.table({"host": ["a"], "gpu": [0], "model": ["x"], "driver": ["1"]})) == []


def test_nan_and_unknown_model_or_driver_are_not_judged(con):
    t = pa.table({"host": ["h"] * 12, "gpu": list(range(12)), "model": ["NVIDIA H200"] * 11 + [None],
                  "driver": ["570"] * 10 + [None, "570"],
                  "hbm_bytes_per_s": pa.array([4.25e12] * 8 + [float("nan"), 1e12, 1e12, 1e12])})
    # GPU 8 is NaN, 9 is the only real outlier, 10 and 11 lack a driver or a model
    assert [(f["gpu"], f["peers"]) for f in find_degraded(con, t)] == [(9, 9)]
