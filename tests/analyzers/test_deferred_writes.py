"""The analysis's own writes (windows, findings, state rows, anomalies,
decisions) run on the writer's commit thread (Writer.defer): the analysis
thread no longer waits for DuckDB, about 10 % more batches a second at
2,000 agents (docs/benchmarks.md). They run in order, in one transaction;
one that fails fails alone, and its rows are owed again."""
import threading
import time

import duckdb
import pytest

from gpuscope.analyzers.ingest import decode
from gpuscope.analyzers.store import Store, StoreConfig
from gpuscope.analyzers.writer import COMMITTED, Writer
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch

T0 = time.time() - 3600


def _batch(seq: int):
    return decode(encode_batch("h1", "b1", seq, [GpuSample(0, T0 + seq, {"power_watts": 100.0})],
                               [DeviceInfo(gpu=0, name="NVIDIA H200")]))


class _Recorder:
    def __init__(self):
        self.done: list[tuple[str, type | None, str]] = []

    def write(self, name: str, sql: str):
        def run(st: Store) -> None:
            st._con.execute(sql)
        def done(error):
            self.done.append((name, type(error) if error is not None else None, threading.current_thread().name))
        return run, done


@pytest.fixture
def writer(tmp_path):
    store = Store(StoreConfig(str(tmp_path / "d.duckdb"), memory_limit="128MB"))
    store._con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v VARCHAR)")
    rec = _Recorder()
    plan: list[tuple[str, str]] = []

    def analyse(batches):                      # the analysis defers its writes as it goes
        for name, sql in plan:
            w.defer(*rec.write(name, sql))
        plan.clear()

    w = Writer(store, analyse)
    w.start()
    yield w, store, rec, plan
    w.stop()
    store.close()


def _rows(store: Store):
    return store.reader().execute("SELECT k, v FROM t ORDER BY k").fetchall()


def test_deferred_writes_are_stored_in_order_and_told_on_the_writer_thread(writer):
    w, store, rec, plan = writer
    plan += [("a", "INSERT INTO t VALUES (1, 'a')"), ("b", "INSERT OR REPLACE INTO t VALUES (1, 'b')")]
    assert w.submit(_batch(1)).result(30) == COMMITTED
    w.call(lambda _s: None).result(30)         # a task waits for what was deferred before it
    assert _rows(store) == [(1, "b")]
    assert rec.done == [("a", None, "db-writer"), ("b", None, "db-writer")]


def test_a_write_that_fails_fails_alone(writer):
    w, store, rec, plan = writer
    plan += [("a", "INSERT INTO t VALUES (1, 'a')"), ("bad", "INSERT INTO t VALUES (1, 'duplicate key')"),
             ("c", "INSERT INTO t VALUES (3, 'c')")]
    assert w.submit(_batch(1)).result(30) == COMMITTED
    w.call(lambda _s: None).result(30)
    assert _rows(store) == [(1, "a"), (3, "c")]
    assert [(n, e) for n, e, _ in rec.done] == [("a", None), ("bad", duckdb.ConstraintException), ("c", None)]
    assert w.submit(_batch(2)).result(30) == COMMITTED       # the writer and its connection go on


def test_a_store_that_cannot_write_fails_them_all_and_the_next_ones_land(writer, monkeypatch):
    w, store, rec, plan = writer
    plan += [("a", "INSERT INTO t VALUES (1, 'a')"), ("b", "INSERT INTO t VALUES (2, 'b')")]
    commit, commits = w._sink.commit, []

    def full():
        commits.append(1)
        if len(commits) == 2:          # the group's commit is the first; the writes' the second
            raise duckdb.IOException("No space left on device (injected)")
        commit()
    monkeypatch.setattr(w._sink, "commit", full)
    assert w.submit(_batch(1)).result(30) == COMMITTED
    w.call(lambda _s: None).result(30)
    assert [(n, e) for n, e, _ in rec.done] == [("a", duckdb.IOException), ("b", duckdb.IOException)]
    assert _rows(store) == []                          # all or none: a disk error is not retried one by one
    plan += [("c", "INSERT INTO t VALUES (3, 'c')")]
    assert w.submit(_batch(2)).result(30) == COMMITTED
    w.call(lambda _s: None).result(30)
    assert _rows(store) == [(3, "c")] and rec.done[-1][:2] == ("c", None)


def _open_finding(a, host="h1"):
    from gpuscope.analyzers.classify import Classification
    window = Classification(gpu=0, start=T0, end=T0 + 5, verdict="memory-bound", confidence=0.9,
                            summary="DRAM busy", evidence={})
    a.writer.call(lambda _s: a._record([(host, window, "pid:7 python", {})])).result(30)
    return a.list_findings(host=host)[0]


def test_whoever_sees_a_capture_sees_the_finding_that_names_it(tmp_path, monkeypatch):
    """Found by CI: the capture row committed at once while its finding's
    row (deferred) still listed no captures, so a client read one without
    the other. They now commit in one transaction; a slow store shows it."""
    from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
    from gpuscope.v1 import samples_pb2 as pb
    a = Analyzer(AnalyzerConfig(str(tmp_path / "c.duckdb"), memory_limit="128MB"))
    a.start()
    try:
        finding = _open_finding(a)
        upsert = a.writer._sink.upsert_findings

        def slow(rows):                               # the finding's row lands late in its transaction
            time.sleep(0.05)
            upsert(rows)
        monkeypatch.setattr(a.writer._sink, "upsert_findings", slow)
        seen: list = []
        stop = threading.Event()

        def reader():
            while not stop.is_set():
                caps = a.store.captures("h1")
                if caps:
                    seen.append((caps[0]["finding_id"], a.list_findings(host="h1")[0]["captures"]))
                    return
        t = threading.Thread(target=reader)
        t.start()
        rec = pb.CaptureRecord(id="cap1", host="h1", target="x:1", gpus=[0], start=T0 + 1, end=T0 + 2, status="ok")
        row = a.report_capture(rec, b"")
        t.join(10)
        stop.set()
        assert row["finding_id"] == finding["id"]
        assert seen == [(finding["id"], ["cap1"])]
    finally:
        a.close()


def test_a_finding_whose_write_is_not_committed_yet_is_shown_as_it_is(tmp_path):
    """Its stored row lags until the commit thread runs the write: queries
    show the live finding meanwhile, never the older row."""
    from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
    from gpuscope.analyzers.classify import Classification
    a = Analyzer(AnalyzerConfig(str(tmp_path / "p.duckdb"), memory_limit="128MB"))
    a.start()
    try:
        _open_finding(a)
        nxt = Classification(gpu=0, start=T0 + 5, end=T0 + 10, verdict="memory-bound", confidence=0.9,
                             summary="DRAM busy", evidence={})
        shown = []

        def record_and_read(_s):                      # on the writer thread: deferred, not yet run
            a._record([("h1", nxt, "pid:7 python", {})])
            f = a.findings.open[("h1", 0)]
            a._persist_findings([f])
            shown.append(a.list_findings(host="h1")[0]["windows"])
            shown.append(a.store.findings(host="h1")[0]["windows"])
        a.writer.call(record_and_read).result(30)
        assert shown == [2, 1]                        # live, though the stored row still says 1
        assert a.list_findings(host="h1")[0]["windows"] == 2 and not a._findings_unstored
    finally:
        a.close()


def test_a_new_findings_row_is_inserted_and_one_whose_insert_failed_lands_once(tmp_path, monkeypatch):
    """A finding the analysis has just opened has no row yet and is inserted,
    not upserted (a fifth of the cost); if that write fails, the finding is
    owed again and upserted later, so it is stored once, as it is then. One
    opened and closed by the same windows is inserted closed."""
    from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
    from gpuscope.analyzers.classify import Classification
    a = Analyzer(AnalyzerConfig(str(tmp_path / "n.duckdb"), memory_limit="128MB"))
    a.start()
    try:
        insert, calls = a.writer._sink.insert_findings, []

        def failing(rows):
            calls.append(len(rows))
            if rows and len(calls) == 1:
                raise duckdb.IOException("No space left on device (injected)")
            insert(rows)
        monkeypatch.setattr(a.writer._sink, "insert_findings", failing)

        def window(i, verdict, gpu=0):
            return Classification(gpu=gpu, start=T0 + 5 * i, end=T0 + 5 * i + 5, verdict=verdict, confidence=0.9,
                                  summary=verdict, evidence={"samples": 5.0})
        a.writer.call(lambda _s: a._record([("h1", window(0, "memory-bound"), "pid:7 python", {})])).result(30)
        a.writer.call(lambda _s: None).result(30)
        assert a.store.findings(host="h1") == [] and calls[0] == 1       # the insert failed: no row
        a.writer.call(lambda _s: a._record([("h1", window(1, "memory-bound"), "pid:7 python", {})])).result(30)
        a.writer.call(lambda _s: None).result(30)
        rows = a.store.findings(host="h1")
        assert [(r["windows"], r["end"]) for r in rows] == [(2, None)]    # owed again and upserted, once
        # opened and closed in one go on another GPU: one row, closed
        a.writer.call(lambda _s: a._record([("h1", window(2, "compute-bound", gpu=1), "", {}),
                                            ("h1", window(3, "idle", gpu=1), "", {})])).result(30)
        a.writer.call(lambda _s: None).result(30)
        rows = a.store.findings(host="h1", gpu=1)
        assert [(r["verdict"], r["windows"], r["end"]) for r in rows] == [("compute-bound", 1, T0 + 15)]
        assert len(rows[0]["id"]) == 20
    finally:
        a.close()
