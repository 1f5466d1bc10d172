"""The picture of a time range (analyzers/report.py, build_range_report) on
a store of days: bounded whatever the range, and saying where it merged or
left anything out; and the RangeReport RPC's answers to bad questions."""
import time

import pytest

from gpuscope.analyzers.report import build_range_report
from gpuscope.analyzers.store import FINDING_COLUMNS, Store, StoreConfig
from gpuscope.daemon import clients
from tests.helpers import AnalyzerServer

DAYS, HOST = 3, "gpu-host-1"
END = 1_795_000_000.0
START = END - DAYS * 86400
PATTERN = ("compute-bound", "memory-bound", "idle")       # by hour: a bucket of minutes holds one


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(StoreConfig(str(tmp_path_factory.mktemp("range") / "r.duckdb"), memory_limit="1GB"))
    n = DAYS * 86400
    # three GPUs at 1 Hz for three days, generated in DuckDB; GPU 2 is idle throughout
    st._con.execute(f"""
        INSERT INTO samples (host, gpu, t, gpm_sm_util_ratio, gpm_dram_bw_util_ratio, power_watts)
        SELECT '{HOST}', g, {START} + s, CASE WHEN g < 2 AND (s // 3600) % 3 = 0 THEN 0.9 ELSE 0.1 END,
               CASE WHEN g < 2 AND (s // 3600) % 3 = 1 THEN 0.8 ELSE 0.05 END, 100 + g
        FROM range(3) r1(g), range({n}) r2(s)""")
    st._con.execute(f"""
        INSERT INTO windows SELECT '{HOST}', g, {START} + w * 5, {START} + w * 5 + 5,
               CASE WHEN g = 2 THEN 'idle' ELSE ['{"', '".join(PATTERN)}'][(w * 5 // 3600) % 3 + 1] END,
               0.9, CASE WHEN (w * 5 // 3600) % 3 = 0 THEN '["power-capped"]' ELSE '[]' END, ''
        FROM range(3) r1(g), range({n // 5}) r2(w)""")
    st._con.execute(f"INSERT INTO devices (host, gpu, name) VALUES ('{HOST}', 0, 'NVIDIA H200'), "
                    f"('{HOST}', 1, 'NVIDIA H200'), ('{HOST}', 2, 'NVIDIA H200')")
    rows = []
    for i in range(3):
        f = dict(id=f"f{i:011d}", host=HOST, gpu=i % 2, verdict="memory-bound", start=START + 3600 * (3 * i + 1),
                 end=START + 3600 * (3 * i + 2), confidence=0.9, windows=720, evidence="{}", flags="[]",
                 summary="DRAM busy", alternatives="[]", decided_by="counters")
        rows.append(tuple(f.get(c) for c in FINDING_COLUMNS))
    st.upsert_findings(rows)
    yield st
    st.close()


def test_days_of_three_gpus_come_back_bounded_and_say_how(store):
    t0 = time.perf_counter()
    rep = build_range_report(store, START, END, HOST, max_points=1000)
    took = time.perf_counter() - t0
    assert [g["gpu"] for g in rep["gpus"]] == [0, 1, 2] and rep["gpus"][0]["samples"] == DAYS * 86400
    step = DAYS * 86400 / 1000
    assert rep["lanes"]["step"] == pytest.approx(step)
    assert any(n.startswith("verdict lanes: the verdict that held most of each 4.32 min (up to 51,840 windows")
               for n in rep["notes"]), rep["notes"]
    assert any(n.startswith("counters: means over 4.32 min (up to 2") for n in rep["notes"]), rep["notes"]
    for gpu in (0, 1, 2):
        runs = [r for r in rep["lanes"]["runs"] if r["gpu"] == gpu]
        assert 1 <= len(runs) <= 1000
        assert runs[0]["start"] >= START and runs[-1]["end"] <= END
    # GPU 2 was idle all along: one run from end to end
    idle = [r for r in rep["lanes"]["runs"] if r["gpu"] == 2]
    assert [r["verdict"] for r in idle] == ["idle"] and idle[0]["end"] - idle[0]["start"] > DAYS * 86400 - step
    # the verdict of an hour, where the hour is
    at = START + 3600 * 4 + 1800                           # hour 4: memory-bound
    assert next(r["verdict"] for r in rep["lanes"]["runs"] if r["gpu"] == 0 and r["start"] <= at < r["end"]) \
        == "memory-bound"
    assert any(r["flag"] == "power-capped" and r["start"] <= START + 1800 < r["end"]
               for r in rep["lanes"]["flag_runs"] if r["gpu"] == 0)
    for s in rep["counters"]["series"]:
        assert len(s["t"]) <= 1001 and len(s["t"]) == len(s["v"])
    assert {s["metric"] for s in rep["counters"]["series"]} == {"gpm_sm_util_ratio", "gpm_dram_bw_util_ratio",
                                                                 "power_watts"}
    assert [f["id"] for f in rep["findings"]] == ["f00000000000", "f00000000001", "f00000000002"]
    assert rep["findings"][0]["what_to_try"]
    assert took < 20, took


def test_past_max_gpus_the_most_bottlenecked_are_drawn(store):
    rep = build_range_report(store, START, START + 7200, HOST, max_points=2000, max_gpus=2)
    assert [g["gpu"] for g in rep["gpus"]] == [0, 1] and rep["gpus_in_range"] == 3
    assert "2 of 3 GPUs drawn: those bottlenecked longest in the range (--host or --gpu for others)" in rep["notes"]
    # two hours of 5 s windows fit: drawn window by window, merged where they follow each other
    assert rep["lanes"]["step"] is None
    assert [(r["verdict"], r["end"] - r["start"]) for r in rep["lanes"]["runs"] if r["gpu"] == 0] == [
        ("compute-bound", 3600.0), ("memory-bound", 3600.0)]


def test_an_empty_range_says_where_the_samples_are(store):
    rep = build_range_report(store, 1000.0, 2000.0, HOST)
    assert rep["gpus"] == [] and rep["extent"] == dict(first=START, last=END - 1)
    assert build_range_report(store, 1000.0, 2000.0, "nobody")["extent"] is None


def test_peaks_come_from_the_traces_else_the_datasheet(store):
    from gpuscope.analyzers.report import _peaks
    gpus = [dict(host=HOST, gpu=0, name="NVIDIA H200")]
    traced = _peaks([dict(device="NVIDIA H200", roofline=dict(peak_flops_per_s=1.07e15, peak_bytes_per_s=4.81e12))],
                    gpus)
    assert [(p["source"], p["flops_per_s"]) for p in traced] == [("trace", 1.07e15)]
    sheet = _peaks([dict(device=None, roofline=None)], gpus)
    assert [(p["source"], p["flops_per_s"], p["bytes_per_s"]) for p in sheet] == [("datasheet", 989e12, 4.8e12)]
    assert _peaks([], [dict(host=HOST, gpu=0, name="replay of samples.csv")]) == []


def test_the_rpc_refuses_what_it_cannot_draw(tmp_path):
    srv = AnalyzerServer(tmp_path / "a.duckdb")
    try:
        with pytest.raises(clients.ClientError, match="^start: not before end$"):
            clients.range_report(srv.target, 2000.0, 1000.0)
        with pytest.raises(clients.ClientError, match="^max_points: 10, expected 50 to 10000$"):
            clients.range_report(srv.target, max_points=10)
        with pytest.raises(clients.ClientError, match="^max_gpus: 65, expected 1 to 64$"):
            clients.range_report(srv.target, max_gpus=65)
        rep = clients.range_report(srv.target)              # the last hour of nothing: an answer, not an error
        assert rep["gpus"] == [] and rep["extent"] is None and rep["end"] - rep["start"] == pytest.approx(3600)
    finally:
        srv.stop()


def test_a_calibrated_gpus_measured_peaks_come_first(store):
    from gpuscope.analyzers.report import _peaks
    gpus = [dict(host=HOST, gpu=0, name="NVIDIA H200")]
    got = _peaks([dict(device="NVIDIA H200", roofline=dict(peak_flops_per_s=1.07e15, peak_bytes_per_s=4.81e12))],
                 gpus, {(HOST, 0): (4.3e12, 7.1e14, 1_764_400_000.0)})
    assert [(p["source"], p["flops_per_s"], p["bytes_per_s"]) for p in got] == [
        ("measured", 7.1e14, 4.3e12), ("trace", 1.07e15, 4.81e12)]
    assert "calibrated 2025-11-29" in got[0]["how"]
