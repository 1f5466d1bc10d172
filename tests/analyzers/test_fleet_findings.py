"""Fleet-check findings: one per condition, refreshed while it holds,
closed at the last check that found it, and kept apart from bottlenecks in
the store (kinds)."""
import duckdb
import pytest

from gpuscope.analyzers.fleet_findings import ConditionFindings
from gpuscope.analyzers.store import Store, StoreConfig, finding_row


def _found(key="degraded:hbm:GPU-1", host="h1", gpu=1, z=-5.0):
    return dict(key=key, host=host, gpu=gpu, summary=f"HBM low (z {z})", evidence={"robust_z": z},
                flags=[key.split(":")[1]], confidence=0.7)


def test_a_condition_opens_once_refreshes_and_closes_at_the_last_check_that_found_it():
    c = ConditionFindings("degraded", [], ended_words="no longer under its peers")
    r = c.reconcile([_found()], now=100.0)
    assert len(r.opened) == 1 and not r.updated and not r.closed
    f = r.opened[0]
    assert (f["kind"], f["verdict"], f["start"], f["end"], f["windows"]) == ("degraded", "degraded", 100.0, None, 1)
    r = c.reconcile([_found(z=-6.0)], now=400.0)
    assert r.updated == [f] and f["windows"] == 2 and f["evidence"] == {"robust_z": -6.0}
    assert f["summary"] == "HBM low (z -6.0)"
    # one check without it: a GPU at the edge of the threshold keeps its finding
    assert not c.reconcile([], now=700.0).changed and f["end"] is None
    # found again: the misses start over
    c.reconcile([_found()], now=1000.0)
    assert not c.reconcile([], now=1300.0).closed
    r = c.reconcile([], now=1600.0)
    assert r.closed == [f] and f["end"] == 1000.0
    assert f["summary"].endswith("; ended: no longer under its peers (2 checks in a row)")
    assert c.open == {}
    # the same condition later is a new episode
    again = c.reconcile([_found()], now=2000.0).opened[0]
    assert again["id"] != f["id"] and again["start"] == 2000.0


def test_a_check_that_names_a_condition_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        ConditionFindings("degraded", []).reconcile([_found(), _found()], now=1.0)


def test_stored_conditions_resume_and_stay_out_of_the_bottleneck_lifecycle(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "k.duckdb")))
    try:
        c = ConditionFindings("degraded", s.open_findings("degraded"))
        opened = c.reconcile([_found(), _found("degraded:pcie:GPU-2", gpu=2)], now=50.0).opened
        bottleneck = dict(id="b1", host="h1", gpu=1, job="pid:1 x", verdict="memory-bound", start=10.0, end=None,
                          confidence=0.9, windows=3, evidence={}, flags=[], summary="s", alternatives=[],
                          decided_by="counters")
        s.upsert_findings([finding_row(f) for f in opened] + [finding_row(bottleneck)])
        assert [f["id"] for f in s.open_findings()] == ["b1"]           # what the tracker resumes
        assert {f["id"] for f in s.open_findings("degraded")} == {f["id"] for f in opened}
        assert {f["kind"] for f in s.findings()} == {"bottleneck", "degraded"}
        ids = lambda **q: sorted(f["id"] for f in s.findings(**q))  # noqa: E731
        assert ids(kinds=["bottleneck"]) == ["b1"]
        assert ids(kinds=["degraded"]) == sorted(f["id"] for f in opened)
        assert ids(flags=["pcie"]) == [opened[1]["id"]]
        assert s.top_bottlenecked(0, 100, now=100)[0]["finding_id"] == "b1"
        assert [r["finding_id"] for r in s.top_bottlenecked(0, 100, now=100)] == ["b1"]
        assert {k: [f["id"] for f in v] for k, v in s.open_conditions().items()} == {
            ("h1", 1): [opened[0]["id"]], ("h1", 2): [opened[1]["id"]]}
        # a restarted analyzer finds the same conditions open and refreshes them
        resumed = ConditionFindings("degraded", s.open_findings("degraded"))
        r = resumed.reconcile([_found()], now=350.0)
        assert [f["id"] for f in r.updated] == [opened[0]["id"]] and r.updated[0]["windows"] == 2
        # the one the restarted analyzer never found closes at the check before the restart that did
        closed = resumed.reconcile([], now=650.0).closed
        assert [(f["id"], f["end"]) for f in closed] == [(opened[1]["id"], 50.0)]
        closed = resumed.reconcile([], now=950.0).closed
        assert [(f["id"], f["end"]) for f in closed] == [(opened[0]["id"], 350.0)]
    finally:
        s.close()


def test_findings_from_before_kinds_read_as_bottlenecks(tmp_path):
    path = str(tmp_path / "old.duckdb")
    s = Store(StoreConfig(path))
    s.upsert_findings([finding_row(dict(id="old1", host="h", gpu=0, job=None, verdict="idle", start=1.0, end=None,
                                        confidence=1.0, windows=1, evidence={}, flags=[], summary="",
                                        alternatives=[], decided_by="counters"))])
    s.close()
    con = duckdb.connect(path)        # as a file from before kinds was: one findings table (schema 8)
    con.execute("DROP VIEW findings")
    con.execute("DROP TABLE findings_history")
    con.execute("ALTER TABLE findings_hot RENAME TO findings")
    con.execute("ALTER TABLE findings DROP COLUMN kind")
    con.execute("ALTER TABLE findings DROP COLUMN condition_key")
    con.close()
    s = Store(StoreConfig(path))
    try:
        assert [f["kind"] for f in s.findings()] == ["bottleneck"]
        assert [f["id"] for f in s.open_findings()] == ["old1"] and s.open_findings("degraded") == []
    finally:
        s.close()
