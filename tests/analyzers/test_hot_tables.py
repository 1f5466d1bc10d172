"""Findings, anomalies and decisions that can no longer change leave their
keyed (hot) tables for history tables, so that DuckDB's in-memory indexes
stay small; every query still sees every row (analyzers/hot_tables.py)."""
import time

import duckdb

from gpuscope.analyzers import retention as retention_mod
from gpuscope.analyzers.hot_tables import history, hot
from gpuscope.analyzers.retention import Retention, RetentionConfig
from gpuscope.analyzers.store import Store, StoreConfig, finding_row

NOW = time.time()
OLD = NOW - 3600


def _finding(fid: str, gpu: int, start: float, end: float | None, windows: int = 3) -> tuple:
    return finding_row(dict(id=fid, host="h1", gpu=gpu, job="pid:7 python", verdict="memory-bound", start=start,
                            end=end, confidence=0.9, windows=windows, evidence={"samples": 5.0}, flags=[],
                            summary="DRAM busy", alternatives=[], decided_by="counters"))


def _anomaly(aid: str, t: float, finding_id: str | None = None) -> dict:
    return dict(id=aid, t=t, host="h1", gpu=0, job="", kind="bottleneck", kinds=["bottleneck"], reason="r",
                details={"verdict": "memory-bound"}, finding_id=finding_id)


def _decision(did: str, t: float, status: str, anomaly_id: str = "") -> dict:
    return dict(id=did, t=t, host="h1", gpu=0, job="", anomaly_id=anomaly_id, action="capture", reason="r",
                status=status, capture_id=None, updated=t)


def _fill(s: Store) -> None:
    s.insert_findings([_finding("closed-old", 0, OLD - 60, OLD), _finding("open-old", 1, OLD - 60, None),
                       _finding("closed-new", 2, NOW - 60, NOW - 5)])
    s.insert_anomalies([_anomaly("a-old", OLD, "closed-old"), _anomaly("a-new", NOW - 5)])
    s.insert_decisions([_decision("d-done", OLD, "done", "a-old"), _decision("d-pending", OLD, "pending"),
                        _decision("d-new", NOW - 5, "skipped")])


def _ids(s: Store, table: str) -> list[str]:
    return sorted(r[0] for r in s._con.execute(f"SELECT id FROM {table}").fetchall())


def test_what_can_no_longer_change_moves_and_every_query_still_sees_it(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "h.duckdb"), memory_limit="128MB"))
    try:
        _fill(s)
        assert s.move_to_history(NOW - 600) == dict(findings=1, anomalies=1, decisions=1)
        assert _ids(s, history("findings")) == ["closed-old"]
        assert _ids(s, hot("findings")) == ["closed-new", "open-old"]        # open, or too recent
        assert _ids(s, history("decisions")) == ["d-done"]                    # a pending one waits for its report
        assert _ids(s, history("anomalies")) == ["a-old"]
        assert sorted(f["id"] for f in s.findings(host="h1")) == ["closed-new", "closed-old", "open-old"]
        assert s.finding("closed-old")["end"] == OLD and s.finding_ids("closed-o") == ["closed-old"]
        assert [f["id"] for f in s.open_findings()] == ["open-old"]
        assert [a["id"] for a in s.records("anomalies", finding_id="closed-old")] == ["a-old"]
        assert [d["id"] for d in s.records("decisions", finding_id="closed-old")] == ["d-done"]
        assert s.count("findings") == 3 and s.count("anomalies") == 2 and s.count("decisions") == 3
        # the open finding goes on in its hot row; closed later, it moves at a later pass
        s.upsert_findings([_finding("open-old", 1, OLD - 60, OLD + 30, windows=9)])
        assert s.move_to_history(NOW - 600)["findings"] == 1
        assert [(f["id"], f["windows"]) for f in s.findings(gpu=1)] == [("open-old", 9)]
        # the long horizon deletes from both tables
        assert s.prune_history(NOW)["findings_deleted"] == 3 and s.count("findings") == 0
    finally:
        s.close()


def test_the_retention_pass_moves_in_bounded_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(retention_mod, "MOVE_ROWS", 4)
    s = Store(StoreConfig(str(tmp_path / "r.duckdb"), memory_limit="128MB"))
    try:
        s.insert_anomalies([_anomaly(f"a{i:02d}", OLD + i) for i in range(10)])
        r = Retention(RetentionConfig(retention_s=86400))
        chunks = []
        result = r.run_pass(lambda fn: _done(fn(s)), breather=False, on_chunk=chunks.append)
        assert [c.get("anomalies_moved") for c in chunks] == [4, 4, 2] and result.complete
        assert s.count("anomalies") == 10 and _ids(s, hot("anomalies")) == []
    finally:
        s.close()


def _done(value):
    from concurrent.futures import Future
    f = Future()
    f.set_result(value)
    return f


def test_a_file_from_before_schema_11_is_taken_over(tmp_path):
    """Its keyed tables become the hot ones: rows read as before, an upsert
    of an existing id replaces it, and they move like any other."""
    path = str(tmp_path / "old.duckdb")
    s = Store(StoreConfig(path, memory_limit="128MB"))
    _fill(s)
    s.close()
    con = duckdb.connect(path)                 # back to one keyed table each, as schema 10 had
    for name in ("findings", "anomalies", "decisions"):
        con.execute(f"DROP VIEW {name}")
        con.execute(f"DROP TABLE {history(name)}")
        con.execute(f"ALTER TABLE {hot(name)} RENAME TO {name}")
    con.execute("UPDATE meta SET value = '10' WHERE key = 'schema_version'")
    con.close()
    s = Store(StoreConfig(path, memory_limit="128MB"))
    try:
        assert s.count("findings") == 3 and s.count("anomalies") == 2 and s.count("decisions") == 3
        s.upsert_findings([_finding("open-old", 1, OLD - 60, None, windows=7)])
        assert [(f["id"], f["windows"]) for f in s.findings(gpu=1)] == [("open-old", 7)]
        assert s.move_to_history(NOW - 600) == dict(findings=1, anomalies=1, decisions=1)
        assert s.count("findings") == 3
    finally:
        s.close()


def test_a_file_from_a_newer_gpuscope_is_refused_untouched(tmp_path):
    """From schema 11 on, an older gpuscope's writes into a newer layout
    fail (the tables it knows are views): the store says so at open instead."""
    import pytest
    path = str(tmp_path / "new.duckdb")
    Store(StoreConfig(path, memory_limit="128MB")).close()
    con = duckdb.connect(path)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(RuntimeError, match=r"newer gpuscope \(schema 99; this one knows up to 11\)"):
        Store(StoreConfig(path, memory_limit="128MB"))
    con = duckdb.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [("99",)]
    con.close()


def test_a_row_written_again_after_it_moved_shows_once_as_written_last(tmp_path):
    """Nothing rewrites a settled record, but if something did, the hot row
    is the newer one: the view never shows an id twice."""
    s = Store(StoreConfig(str(tmp_path / "w.duckdb"), memory_limit="128MB"))
    try:
        _fill(s)
        s.move_to_history(NOW + 10 ** 6)
        s.upsert_findings([_finding("closed-old", 0, OLD - 60, OLD, windows=77)])
        rows = [f for f in s.findings(host="h1") if f["id"] == "closed-old"]
        assert [r["windows"] for r in rows] == [77] and s.finding("closed-old")["windows"] == 77
        assert s.count("findings") == 3
    finally:
        s.close()


def test_a_decision_left_pending_by_an_earlier_run_moves_after_a_day(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "p.duckdb"), memory_limit="128MB"))
    try:
        s.insert_decisions([_decision("d-stale", NOW - 2 * 86400, "pending"), _decision("d-wait", OLD, "pending")])
        assert s.move_to_history(NOW - 600)["decisions"] == 1
        assert _ids(s, history("decisions")) == ["d-stale"] and _ids(s, hot("decisions")) == ["d-wait"]
    finally:
        s.close()


def test_a_move_that_fails_is_logged_and_the_pass_still_prunes(tmp_path, monkeypatch):
    """A move copies rows, so a full disk fails it first; the deletes of the
    long horizon, which free space, must still run."""
    s = Store(StoreConfig(str(tmp_path / "f.duckdb"), memory_limit="128MB"))
    try:
        s.insert_anomalies([_anomaly("ancient", NOW - 400 * 86400)])

        def full(*_a, **_k):
            raise duckdb.IOException("No space left on device (injected)")
        monkeypatch.setattr(s, "move_to_history", full)
        result = Retention(RetentionConfig(retention_s=86400)).run_pass(lambda fn: _done(fn(s)), breather=False)
        assert result.complete and result.counts["anomalies_deleted"] == 1 and s.count("anomalies") == 0
    finally:
        s.close()
