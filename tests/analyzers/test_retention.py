"""Retention on real DuckDB files: samples older than the horizon become
per-minute means and are deleted, in bounded chunks; what is newer stays;
QueryMetric over old ranges reads the rollup."""
import math
import time

import numpy as np
import pyarrow as pa
import pytest

from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.retention import RetentionConfig, parse_age
from gpuscope.analyzers.store import DEVICE_COLUMNS, Store, StoreConfig, finding_row
from gpuscope.daemon import clients
from tests.helpers import AnalyzerServer

DAY = 86400.0
NOW = math.floor(time.time() / 60) * 60 + 17.0
OLD = math.floor((NOW - 20 * DAY) / 3600) * 3600      # 20 days ago, a whole hour
NEW = NOW - 3600.0
OLD_HOURS, NEW_MINUTES = 3, 30


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _samples(start: float, seconds: int, gpus=(0, 1), seed=0) -> pa.Table:
    """1 Hz with jitter; power every second, energy every 10 s (a slow metric)."""
    rng = np.random.default_rng(seed)
    t = np.repeat(start + np.arange(seconds) + 0.1 + rng.random(seconds) * 0.8, len(gpus))
    gpu = np.tile(np.asarray(gpus, dtype=np.int32), seconds)
    n = len(t)
    energy = np.where(np.arange(n) % (10 * len(gpus)) < len(gpus), 1e4 + t - start, np.nan)
    return pa.table({"host": ["h"] * n, "gpu": gpu, "t": t, "util_gpu_ratio": rng.random(n),
                     "power_watts": 100 + 600 * rng.random(n),
                     "energy_joules_total": pa.array(energy, from_pandas=True)})     # NaN -> null, as ingest stores it


def _fill(path) -> tuple[pa.Table, pa.Table]:
    old, new = _samples(OLD, OLD_HOURS * 3600, seed=1), _samples(NEW, NEW_MINUTES * 60, seed=2)
    s = Store(StoreConfig(str(path), memory_limit="256MB"))
    s.begin()
    s.append("samples", old)
    s.append("samples", new)
    s.append("processes", pa.table({"host": ["h", "h"], "gpu": [0, 0], "t": [OLD + 5, NEW + 5], "pid": [1, 2]}))
    s.insert_health([("h", 0, OLD + 7, "xid", "79", 79), ("h", 0, NEW + 7, "xid", "79", 79)])
    s.insert_windows([("h", 0, OLD, OLD + 5, "compute-bound", 0.9, "[]", ""),
                      ("h", 0, NEW, NEW + 5, "compute-bound", 0.9, "[]", "")])
    s.upsert_agents([("h", "old-boot", 10, OLD + 100, 0, "1-10"), ("h", "new-boot", 10, NOW - 5, 0, "1-10"),
                     ("g", "only-boot", 10, OLD + 100, 0, "1-10")])
    def device(host, uuid, last_seen):
        given = dict(host=host, gpu=0, uuid=uuid, name="NVIDIA H200", architecture="hopper", gpm_supported=True,
                     lost=False, source="nvml", last_seen=last_seen)
        return tuple(given.get(c) for c in DEVICE_COLUMNS)
    s.upsert_devices([device("h", "u0", NOW - 5), device("g", "u1", OLD + 100)])
    f = dict(id="f-old", host="h", gpu=0, job="", verdict="compute-bound", start=NOW - 400 * DAY,
             end=NOW - 399 * DAY, confidence=0.9, windows=3, evidence={}, flags=[], summary="",
             alternatives=[], decided_by="counters", counters_verdict="compute-bound", trace_verdict=None,
             captures=[])
    s.upsert_findings([finding_row(f), finding_row(dict(f, id="f-recent", start=OLD, end=OLD + 10)),
                       finding_row(dict(f, id="f-open", start=NOW - 400 * DAY, end=None))])
    s.commit()
    s.close()
    return old, new


def _minute_means(tbl: pa.Table) -> dict[tuple[int, float], tuple[int, dict]]:
    t, gpu = tbl["t"].to_numpy(), tbl["gpu"].to_numpy()
    cols = {k: tbl[k].to_numpy(zero_copy_only=False).astype(float)       # null -> NaN
            for k in ("util_gpu_ratio", "power_watts", "energy_joules_total")}
    minute = np.floor(t / 60) * 60
    out = {}
    for g, m in sorted(set(zip(gpu.tolist(), minute.tolist()))):
        sel = (gpu == g) & (minute == m)
        out[(g, m)] = (int(sel.sum()), {k: float(np.nanmean(v[sel])) for k, v in cols.items()})
    return out


def _analyzer(path, **config) -> Analyzer:
    a = Analyzer(AnalyzerConfig(str(path), window_s=1.0, memory_limit="256MB", **config), clock=Clock(NOW))
    a.writer.start()
    return a


def test_retention_rolls_up_and_deletes_exactly_the_old_rows(tmp_path):
    old, new = _fill(tmp_path / "r.duckdb")
    a = _analyzer(tmp_path / "r.duckdb")
    try:
        q = a.store.reader()
        assert a.status()["samples_stored"] == old.num_rows + new.num_rows
        # one chunk is one hour of data, one transaction: the rest waits for the next
        first = a.writer.call(a.retention.chunk).result(timeout=60)
        assert (first["lo"], first["hi"]) == (OLD, OLD + 3600) and first["more"]
        assert first["samples_deleted"] == 2 * 3600 and first["minutes_written"] == 2 * 60
        assert q.execute("SELECT min(t) FROM samples").fetchone()[0] >= OLD + 3600

        result = a.run_retention(breather=False)
        assert result.complete and result.chunks >= 2
        assert q.execute("SELECT count(*) FROM samples").fetchone()[0] == new.num_rows
        assert q.execute("SELECT min(t) FROM samples").fetchone()[0] == pytest.approx(min(new["t"].to_pylist()))
        assert a.status()["samples_stored"] == new.num_rows
        # per-minute means equal the means of the raw samples, minute by minute
        want = _minute_means(old)
        rows = q.execute("SELECT gpu, t, samples, util_gpu_ratio, power_watts, energy_joules_total "
                         "FROM samples_1m ORDER BY gpu, t").fetchall()
        assert len(rows) == len(want) == 2 * OLD_HOURS * 60
        for gpu, t, n, util, power, energy in rows:
            count, means = want[(gpu, t)]
            assert n == count == 60
            assert util == pytest.approx(means["util_gpu_ratio"], rel=1e-12)
            assert power == pytest.approx(means["power_watts"], rel=1e-12)
            assert energy == pytest.approx(means["energy_joules_total"], rel=1e-12)   # 6 of 60 samples
        # the other tables: old rows gone, new ones kept
        for table, col in (("processes", "t"), ("health", "t"), ("windows", '"end"')):
            assert q.execute(f"SELECT min({col}) > ?, count(*) FROM {table}", [NOW - 14 * DAY]).fetchone() == (True, 1)
        # agent boots: the old boot of a host with a newer one goes; a host's newest stays
        assert sorted(q.execute("SELECT host, boot_id FROM agents").fetchall()) == [("g", "only-boot"),
                                                                                    ("h", "new-boot")]
        assert q.execute("SELECT host FROM devices").fetchall() == [("h",)]
        # findings are kept for a year; open ones always
        assert sorted(r[0] for r in q.execute("SELECT id FROM findings").fetchall()) == ["f-open", "f-recent"]
        # nothing left to do: a second pass is one cheap look
        again = a.run_retention(breather=False)
        assert again.complete and again.chunks == 1 and again.counts.get("samples_deleted", 0) == 0
    finally:
        a.close()


def test_late_samples_of_a_rolled_up_minute_are_merged_into_it(tmp_path):
    _fill(tmp_path / "m.duckdb")
    a = _analyzer(tmp_path / "m.duckdb")
    try:
        a.run_retention(breather=False)
        q = a.store.reader()
        n0, util0 = q.execute("SELECT samples, util_gpu_ratio FROM samples_1m WHERE gpu = 0 AND t = ?",
                              [OLD]).fetchone()
        late = pa.table({"host": ["h"] * 30, "gpu": np.zeros(30, dtype=np.int32), "t": OLD + np.arange(30) + 0.5,
                         "util_gpu_ratio": np.ones(30)})
        a.writer.call(lambda s: (s.begin(), s.append("samples", late), s.commit())).result()
        a.run_retention(breather=False)
        n1, util1 = q.execute("SELECT samples, util_gpu_ratio FROM samples_1m WHERE gpu = 0 AND t = ?",
                              [OLD]).fetchone()
        assert n1 == n0 + 30 and util1 == pytest.approx((util0 * n0 + 30) / (n0 + 30))
        assert q.execute("SELECT count(*) FROM samples_1m WHERE gpu = 0 AND t = ?", [OLD]).fetchone()[0] == 1
    finally:
        a.close()


def test_without_rollup_old_samples_are_only_deleted(tmp_path):
    old, new = _fill(tmp_path / "n.duckdb")
    a = _analyzer(tmp_path / "n.duckdb", rollup=False)
    try:
        assert a.run_retention(breather=False).counts["samples_deleted"] == old.num_rows
        q = a.store.reader()
        assert q.execute("SELECT count(*) FROM samples_1m").fetchone()[0] == 0
        assert q.execute("SELECT count(*) FROM samples").fetchone()[0] == new.num_rows
    finally:
        a.close()


def test_query_metric_over_old_ranges_reads_the_rollup(tmp_path):
    old, new = _fill(tmp_path / "q.duckdb")
    util = np.asarray(old["util_gpu_ratio"].to_pylist())
    gpu0 = np.asarray(old["gpu"].to_pylist()) == 0
    srv = AnalyzerServer(tmp_path / "q.duckdb")
    try:
        before = clients.query(srv.target, "util_gpu_ratio", "h", 0, OLD, OLD + OLD_HOURS * 3600, "mean", 0)
        srv.analyzer.run_retention(breather=False)
        assert srv.analyzer.store.count("samples") == new.num_rows
        end = OLD + OLD_HOURS * 3600
        after = clients.query(srv.target, "util_gpu_ratio", "h", 0, OLD, end, "mean", 0)
        assert after["series"][0]["samples"] == before["series"][0]["samples"] == OLD_HOURS * 3600
        assert after["series"][0]["value"] == pytest.approx(util[gpu0].mean(), rel=1e-9)
        assert after["series"][0]["value"] == pytest.approx(before["series"][0]["value"], rel=1e-9)
        series = clients.query(srv.target, "util_gpu_ratio", "h", 0, OLD, OLD + 600, "series", 60)
        want = _minute_means(old)
        assert [p[0] for p in series["series"][0]["points"]] == [OLD + 60 * i for i in range(11)]
        for t, value in series["series"][0]["points"][:10]:
            assert value == pytest.approx(want[(0, t)][1]["util_gpu_ratio"], rel=1e-9)
        # a range over both: rolled-up minutes and raw samples, each sample counted once
        both = clients.query(srv.target, "util_gpu_ratio", "h", 0, OLD, NOW, "mean", 0)
        new_gpu0 = np.asarray(new["gpu"].to_pylist()) == 0
        assert both["series"][0]["samples"] == gpu0.sum() + new_gpu0.sum()
        want_mean = (util[gpu0].sum() + np.asarray(new["util_gpu_ratio"].to_pylist())[new_gpu0].sum()) / (
            gpu0.sum() + new_gpu0.sum())
        assert both["series"][0]["value"] == pytest.approx(want_mean, rel=1e-9)
        # a recent range does not touch the rollup
        recent = clients.query(srv.target, "util_gpu_ratio", "h", 0, NEW, NOW, "max", 0)
        assert recent["series"][0]["samples"] == new_gpu0.sum()
        # what a report shows before/during/after a finding reads the rollup too
        m = srv.analyzer.store.means("h", 0, OLD, end, ["util_gpu_ratio", "power_watts"])
        assert m["samples"] == OLD_HOURS * 3600
        assert m["util_gpu_ratio"] == pytest.approx(util[gpu0].mean(), rel=1e-9)
        power = np.asarray(old["power_watts"].to_numpy(zero_copy_only=False), float)[gpu0]
        assert m["power_watts"] == pytest.approx(np.nanmean(power), rel=1e-6)
        assert srv.analyzer.store.means("h", 0, NOW + 10, NOW + 20, ["util_gpu_ratio"]) == {
            "samples": 0, "util_gpu_ratio": None}
    finally:
        srv.stop()


def test_retention_settings_are_checked_and_ages_parsed():
    assert parse_age("14d") == 14 * DAY and parse_age("36h") == 36 * 3600 and parse_age("90m") == 5400
    assert parse_age("3600") == 3600.0
    for bad in ("", "d", "-1d", "10s", "nand", "14x"):
        with pytest.raises(ValueError):
            parse_age(bad)
    with pytest.raises(ValueError):
        RetentionConfig(retention_s=10)
    with pytest.raises(ValueError):
        RetentionConfig(retention_s=30 * DAY, history_s=7 * DAY)


def test_the_analyzer_schedules_retention_and_its_job_runs_a_pass(tmp_path):
    old, new = _fill(tmp_path / "j.duckdb")
    srv = AnalyzerServer(tmp_path / "j.duckdb")
    try:
        job = srv.analyzer._scheduler.get_job("retention")
        assert job is not None and job.trigger.interval.total_seconds() == 600
        srv.analyzer._retention_job()          # what the scheduler runs
        assert srv.analyzer.store.count("samples") == new.num_rows
        assert srv.analyzer.retention.last_pass.complete
        assert srv.analyzer.status()["samples_stored"] == new.num_rows
    finally:
        srv.stop()
