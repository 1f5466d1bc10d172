import duckdb

from gpuscope.analyzers.store import Store, StoreConfig
from tests.helpers import AnalyzerServer


def test_memory_cap_is_applied(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "m.duckdb"), memory_limit="300MB"))
    limit = s.reader().execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert limit.replace(" ", "").upper().startswith(("286.1MIB", "300.0MB", "300MB", "286MIB"))
    s.close()


def test_metrics_added_to_the_catalogue_become_columns(tmp_path):
    path = str(tmp_path / "old.duckdb")
    Store(StoreConfig(path)).close()
    con = duckdb.connect(path)
    con.execute('ALTER TABLE samples DROP COLUMN "gpm_fp16_util_ratio"')
    con.close()
    s = Store(StoreConfig(path))
    cols = {r[0] for r in s.reader().execute("DESCRIBE samples").fetchall()}
    assert "gpm_fp16_util_ratio" in cols
    assert s.reader().execute("SELECT unit FROM metrics WHERE name = 'power_watts'").fetchone()[0] == "watts"
    s.close()


def test_open_findings_survive_an_analyzer_restart(tmp_path):
    from gpuscope.analyzers.classify import Classification
    srv = AnalyzerServer(tmp_path / "f.duckdb")
    c = Classification(gpu=0, start=100.0, end=105.0, verdict="memory-bound", confidence=0.9, summary="s",
                       evidence={"dram_bw_util_ratio": 0.8})
    srv.analyzer.writer.call(lambda store: srv.analyzer._record([("h", c, "pid:1")])).result()
    srv.stop()
    srv = AnalyzerServer(tmp_path / "f.duckdb")
    try:
        assert [f["verdict"] for f in srv.analyzer.findings.open.values()] == ["memory-bound"]
        c2 = Classification(gpu=0, start=105.0, end=110.0, verdict="memory-bound", confidence=0.7, summary="s",
                            evidence={"dram_bw_util_ratio": 0.6})
        srv.analyzer.writer.call(lambda store: srv.analyzer._record([("h", c2, "pid:1")])).result()
        f = srv.analyzer.list_findings(host="h")[0]
        assert f["windows"] == 2 and f["end"] is None and abs(f["evidence"]["dram_bw_util_ratio"] - 0.7) < 1e-9
    finally:
        srv.stop()


def test_a_counter_is_queried_as_its_rate_with_resets_and_wraps(tmp_path):
    """Found in a trial: `query pcie_tx_bytes_total` showed running totals
    (2.55e+08), which say nothing; Prometheus users read rate()."""
    import pyarrow as pa
    s = Store(StoreConfig(str(tmp_path / "r.duckdb")))
    try:
        t = [100.0, 101.0, 102.0, 103.0, 104.0]
        tx = [4_294_967_000.0, 200.0, 1200.0, 3200.0, 100.0]          # 32-bit wrap, then a reset
        energy = [1000.0, 1700.0, 2400.0, 10.0, 710.0]               # a driver reload resets it
        s.append("samples", pa.table({"host": ["h"] * 5, "gpu": [0] * 5, "t": t, "pcie_tx_bytes_total": tx,
                                      "energy_joules_total": energy}))
        rows = s.metric("pcie_tx_bytes_total", "h", 0, 0, 200, "series", 1.0, rate=True)
        assert [(r["bucket"], r["value"]) for r in rows] == [
            (101.0, 200.0 + 2**32 - 4_294_967_000.0), (102.0, 1000.0), (103.0, 2000.0)]   # a wrap; the reset: none
        watts = s.metric("energy_joules_total", "h", 0, 0, 200, "series", 1.0, rate=True)
        assert [r["value"] for r in watts] == [700.0, 700.0, 700.0]              # the interval of the reset has none
        assert s.metric("energy_joules_total", "h", 0, 0, 200, "max", 0, rate=False)[0]["value"] == 2400.0
    finally:
        s.close()


def test_a_bitmask_series_holds_the_bits_set_in_each_bucket(tmp_path):
    """Found in a trial: the mean of throttle bits 0, 1 and 4 read as
    'applications-clocks-setting' (2), a reason that never was."""
    import pyarrow as pa
    s = Store(StoreConfig(str(tmp_path / "b.duckdb")))
    try:
        s.append("samples", pa.table({"host": ["h"] * 4, "gpu": [0] * 4, "t": [100.0, 101.0, 102.0, 103.0],
                                      "clock_event_reasons": [0.0, 1.0, 4.0, 4.0]}))
        rows = s.metric("clock_event_reasons", "h", 0, 0, 200, "series", 10.0)
        assert [r["value"] for r in rows] == [5.0]                     # gpu-idle | sw-power-cap, never 2
    finally:
        s.close()


def test_findings_by_flag(tmp_path):
    """Found in a trial: 'which GPUs are power-capped?' could not be asked."""
    from gpuscope.analyzers.store import FINDING_COLUMNS, finding_dicts
    s = Store(StoreConfig(str(tmp_path / "f.duckdb")))
    try:
        def row(fid, flags):
            return tuple(fid if c == "id" else "h" if c == "host" else 0 if c == "gpu" else 1.0 if c == "start"
                         else json.dumps(flags) if c == "flags" else None for c in FINDING_COLUMNS)
        import json
        s.upsert_findings([row("a", ["power-capped"]), row("b", []), row("c", ["power-capped", "thermal-throttled"])])
        ids = lambda **q: sorted(f["id"] for f in finding_dicts(s.findings_table(**q)))  # noqa: E731
        assert ids(flags=["power-capped"]) == ["a", "c"]
        assert ids(flags=["power-capped", "thermal-throttled"]) == ["c"] and ids() == ["a", "b", "c"]
        assert ids(flags=["power"]) == []                       # whole words, not a substring of one
    finally:
        s.close()


def test_top_keeps_each_hosts_jobs_apart_and_names_the_verdict_that_held_longest(tmp_path):
    """Found in a trial: pid 461 on three hosts was one job on 3 GPUs, and a
    row's verdict was its single longest finding's while TIME summed all of
    them (60 s memory-bound + 95 s in three others read as "launch-bound")."""
    import json

    from gpuscope.analyzers.store import FINDING_COLUMNS
    s = Store(StoreConfig(str(tmp_path / "top.duckdb")))
    try:
        def f(fid, host, gpu, verdict, start, end, job="pid:461 python serve.py"):
            d = dict(id=fid, host=host, gpu=gpu, job=job, verdict=verdict, start=start, end=end, confidence=0.9,
                     windows=1, flags=json.dumps([]), summary=f"{verdict} evidence")
            return tuple(d.get(c) for c in FINDING_COLUMNS)
        s.upsert_findings([f("m1", "a", 0, "memory-bound", 0, 30), f("m2", "a", 0, "memory-bound", 40, 70),
                           f("l1", "a", 0, "launch-bound", 70, 110), f("c1", "a", 0, "compute-bound", 110, 130),
                           f("x1", "b", 0, "host-bound", 0, 20), f("x2", "c", 1, "host-bound", 0, 10)])
        gpus = s.top_bottlenecked(0, 200, by="gpu")
        assert [(r["host"], r["main_verdict"], r["bottleneck_seconds"]) for r in gpus][0] == ("a", "memory-bound", 120)
        assert gpus[0]["verdicts"] == [dict(verdict="memory-bound", seconds=60.0),
                                       dict(verdict="launch-bound", seconds=40.0),
                                       dict(verdict="compute-bound", seconds=20.0)]
        assert gpus[0]["finding_id"] in ("m1", "m2")          # the main verdict's longest, not launch-bound's
        jobs = s.top_bottlenecked(0, 200, by="job")
        assert sorted((r["host"], r["gpus"], r["bottleneck_seconds"]) for r in jobs) == [
            ("a", 1, 120.0), ("b", 1, 20.0), ("c", 1, 10.0)]
    finally:
        s.close()
