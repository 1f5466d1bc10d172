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
