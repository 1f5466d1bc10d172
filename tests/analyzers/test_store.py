import subprocess
import sys
import time

import duckdb
import pytest

from gpuscope.analyzers.store import Store, StoreConfig
from tests.helpers import AnalyzerServer


def test_memory_cap_is_applied(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "m.duckdb"), memory_limit="300MB"))
    limit = s.reader().execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert limit.replace(" ", "").upper().startswith(("286.1MIB", "300.0MB", "300MB", "286MIB"))
    s.close()


def test_a_db_that_will_not_open_says_what_to_do(tmp_path):
    garbage = tmp_path / "g.duckdb"
    garbage.write_text("not a database")
    with pytest.raises(RuntimeError, match="not a gpuscope database: pass another --db"):
        Store(StoreConfig(str(garbage)))
    other = str(tmp_path / "other.duckdb")
    with duckdb.connect(other) as con:
        con.execute("CREATE TABLE samples (x INTEGER)")
    with pytest.raises(RuntimeError, match="holds tables of another program .*: pass another --db"):
        Store(StoreConfig(other))
    with duckdb.connect(other) as con:          # untouched: found in a trial with 24 tables and 61 columns added
        assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("samples",)]
        assert con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'samples'"
                           ).fetchone()[0] == 1
    db = str(tmp_path / "held.duckdb")
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({db!r}); "
                               "print('open', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(RuntimeError, match=rf"another process holds it: stop PID {holder.pid}, or pass another --db"):
            Store(StoreConfig(db))
    finally:
        holder.kill()
        holder.wait()


def _analyzer_on(db, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "error", "analyzer",
                           "--insecure", "--listen", "127.0.0.1:0", "--db", str(db), "--duration", "1s"],
                          capture_output=True, text=True, timeout=timeout)


def test_the_analyzer_says_why_a_db_will_not_open_without_a_class_name(tmp_path):
    """Found by a tester: `error: RuntimeError: ...` before words that say it all."""
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE samples (x INTEGER)")
    r = _analyzer_on(other)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        f"gpuscope analyzer: error: {other} holds tables of another program (not a gpuscope database): "
        "pass another --db"), r.stderr


def test_a_db_another_process_holds_is_refused_at_once_naming_it(tmp_path):
    """Found by a tester: the analyzer waited 20 s before saying so (a wait
    meant for the analysis process of an analyzer killed -9, closing the
    store on its way out). Bounded by another refusal of the same start-up
    path: both processes started, the store opened and refused."""
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE samples (x INTEGER)")
    t0 = time.monotonic()
    assert _analyzer_on(other).returncode == 1
    baseline = time.monotonic() - t0
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               "print('open', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        t0 = time.monotonic()
        r = _analyzer_on(db)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1 and f"another process holds it: stop PID {holder.pid}, or pass another --db" in r.stderr, \
        r.stderr
    assert "waiting" not in r.stderr and took < baseline + 2.0, (took, baseline)


def test_checkpoints_wait_for_64mb_of_wal_after_a_reopen_too(tmp_path):
    """DuckDB's 16 MB default checkpoints every few seconds under a fleet,
    each re-reading the unfinished row group of samples."""
    s = Store(StoreConfig(str(tmp_path / "c.duckdb")))
    q = "SELECT current_setting('checkpoint_threshold')"
    assert s.reader().execute(q).fetchone()[0].replace(" ", "") == "61.0MiB"
    s.reopen()
    assert s.reader().execute(q).fetchone()[0].replace(" ", "") == "61.0MiB"
    s.close()
    with pytest.raises(ValueError, match="checkpoint threshold: '64 apples'"):
        Store(StoreConfig(str(tmp_path / "d.duckdb"), checkpoint_threshold="64 apples"))


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
    srv.analyzer.writer.call(lambda store: srv.analyzer._record([("h", c, "pid:1", {})])).result()
    srv.stop()
    srv = AnalyzerServer(tmp_path / "f.duckdb")
    try:
        assert [f["verdict"] for f in srv.analyzer.findings.open.values()] == ["memory-bound"]
        c2 = Classification(gpu=0, start=105.0, end=110.0, verdict="memory-bound", confidence=0.7, summary="s",
                            evidence={"dram_bw_util_ratio": 0.6})
        srv.analyzer.writer.call(lambda store: srv.analyzer._record([("h", c2, "pid:1", {})])).result()
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


def _finding_row(fid, host, gpu, job, attribution, start=100.0, end=160.0, verdict="memory-bound"):
    from gpuscope.analyzers.store import finding_row
    return finding_row(dict(id=fid, host=host, gpu=gpu, job=job, verdict=verdict, start=start, end=end,
                            confidence=0.9, windows=12, evidence={}, flags=[], summary="s", alternatives=[],
                            decided_by="counters", counters_verdict=verdict, captures=[],
                            attribution=attribution))


def test_findings_by_pod_namespace_and_slurm_job_and_top_by_them(tmp_path):
    from gpuscope.analyzers.store import finding_dicts
    s = Store(StoreConfig(str(tmp_path / "o.duckdb")))
    try:
        pod = dict(user="alice", namespace="ml", pod="trainer-0", container="main")
        s.upsert_findings([_finding_row("a", "h1", 0, "pid:1 python train.py", pod),
                           _finding_row("b", "h1", 1, "pid:1 python train.py", pod, end=130.0),
                           _finding_row("c", "h2", 0, "pid:7 python sim.py", dict(slurm_job="81234", user="bob")),
                           _finding_row("d", "h3", 0, "pid:8 python sim.py", dict(slurm_job="81234", user="bob")),
                           _finding_row("e", "h4", 0, "pid:9 x", {})])
        ids = lambda **q: sorted(f["id"] for f in finding_dicts(s.findings_table(**q)))  # noqa: E731
        assert ids(pod="trainer-0") == ids(pod="ml/trainer-0") == ids(namespace="ml") == ["a", "b"]
        assert ids(pod="other/trainer-0") == [] and ids(slurm_job="81234") == ["c", "d"]
        assert ids(slurm_job="8123") == []                             # whole ids, never a prefix
        assert finding_dicts(s.findings_table(pod="trainer-0"))[0]["attribution"] == pod
        assert finding_dicts(s.findings_table(host="h4"))[0]["attribution"] == {}
        pods = s.top_bottlenecked(0, 1000, by="pod")
        assert [(r["group"], r["bottleneck_seconds"], r["gpus"]) for r in pods] == [("ml/trainer-0", 90.0, 2)]
        assert pods[0]["attribution"] == pod and pods[0]["finding_id"] == "a"
        slurm = s.top_bottlenecked(0, 1000, by="slurm-job")
        assert [(r["group"], r["bottleneck_seconds"], r["gpus"]) for r in slurm] == [("81234", 120.0, 2)]
    finally:
        s.close()


def test_a_metric_pooled_by_job_pod_and_slurm_job(tmp_path):
    """A sample belongs to its GPU's job at that sample (the process with
    the most memory); pods and Slurm jobs pool GPUs, across hosts too."""
    import pyarrow as pa
    import numpy as np
    from gpuscope.analyzers.ingest import ProcessRows
    from gpuscope.collectors.records import ATTRIBUTION_FIELDS
    s = Store(StoreConfig(str(tmp_path / "g.duckdb")))
    try:
        t = [100.0, 101.0, 102.0, 103.0]
        rows = []
        for host, gpu, util in (("h1", 0, 0.2), ("h1", 1, 0.4), ("h2", 0, 0.9)):
            s.append("samples", pa.table({"host": [host] * 4, "gpu": [gpu] * 4, "t": t, "util_gpu_ratio": [util] * 4}))
        labels = [tuple(dict(namespace="ml", pod="trainer-0", container="main").get(k) for k in ATTRIBUTION_FIELDS),
                  tuple(dict(slurm_job="81234").get(k) for k in ATTRIBUTION_FIELDS)]
        # h1/gpu0 and h1/gpu1: the pod's trainer (pid 10, 4 GiB) beside a small helper without attribution;
        # h2/gpu0: a Slurm job's process, attributed only at the last two samples
        def procs(host, gpu, pid, mem, owner, helper=False):
            n = 4
            r = ProcessRows(host, np.array([gpu] * n, np.int32), np.array(t), [pid] * n, [mem] * n, [None] * n,
                            ["python train.py"] * n, owner, labels)
            rows.append(r)
            if helper:
                rows.append(ProcessRows(host, np.array([gpu] * n, np.int32), np.array(t), [99] * n, [1] * n,
                                        [None] * n, ["helper"] * n, [], labels))
        procs("h1", 0, 10, 4 << 30, [0] * 4, helper=True)
        procs("h1", 1, 10, 4 << 30, [0] * 4)
        procs("h2", 0, 20, 1 << 30, [None, None, 1, 1])
        s.append("processes", ProcessRows.table(rows))
        by_pod = s.metric("util_gpu_ratio", "", None, 0, 200, "mean", 1.0, group_by="pod")
        assert [(r["group"], r["gpus"], round(r["value"], 6), r["n"]) for r in by_pod] == [("ml/trainer-0", 2, 0.3, 8)]
        by_slurm = s.metric("util_gpu_ratio", "", None, 0, 200, "series", 1.0, group_by="slurm-job")
        assert [(r["group"], r["host"], r["bucket"], r["value"]) for r in by_slurm] == [
            ("81234", "h2", 102.0, 0.9), ("81234", "h2", 103.0, 0.9)]
        by_job = s.metric("util_gpu_ratio", "", None, 0, 200, "mean", 1.0, group_by="job")
        assert [(r["group"], r["gpus"]) for r in by_job] == [("h1 pid:10 python train.py", 2),
                                                             ("h2 pid:20 python train.py", 1)]
        assert s.metric("util_gpu_ratio", "h1", 1, 0, 200, "mean", 1.0, group_by="pod")[0]["gpus"] == 1
    finally:
        s.close()


def test_a_job_taking_over_an_open_finding_is_written_at_once(tmp_path):
    """Open findings that only grow are written with the 30 s snapshot; one
    whose job (and so its pod or Slurm job) changed is asked for by them."""
    from gpuscope.analyzers.classify import Classification
    from gpuscope.analyzers.store import finding_dicts
    srv = AnalyzerServer(tmp_path / "j.duckdb")
    try:
        a = srv.analyzer

        def window(i, job, owner):
            c = Classification(gpu=0, start=100.0 + 5 * i, end=105.0 + 5 * i, verdict="memory-bound",
                               confidence=0.9, summary="s", evidence={"dram_bw_util_ratio": 0.8})
            a.writer.call(lambda store: a._record([("h", c, job, owner)])).result()
        window(0, "pid:1 a", dict(namespace="ml", pod="p1"))
        window(1, "pid:1 a", dict(namespace="ml", pod="p1"))
        window(2, "pid:2 b", dict(namespace="ml", pod="p2"))
        stored = finding_dicts(a.store.findings_table(pod="ml/p2"))
        assert [(f["job"], f["attribution"]["pod"], f["end"]) for f in stored] == [("pid:2 b", "p2", None)]
        assert not finding_dicts(a.store.findings_table(pod="p1"))
    finally:
        srv.stop()
