"""GetStatus answered by the gRPC process from a mirror of the analysis
process's state (analyzers/status.py): it must say what the analysis
process itself would say."""
import time

import pytest

from gpuscope.analyzers.status import GpuRow, StatusMirror
from tests.analyzers.test_lifecycle import COMPUTE, MEMORY, _batch
from tests.helpers import AnalyzerServer, wait_for

TIMING = ("last_seen_age_s", "analysis_lag_seconds")


def _without_timing(status: dict) -> dict:
    out = {k: v for k, v in status.items() if k not in TIMING}
    out["gpus"] = [{k: v for k, v in g.items() if k not in TIMING} for g in status["gpus"]]
    return out


def test_the_mirror_answers_what_the_analysis_process_would(tmp_path):
    srv = AnalyzerServer(tmp_path / "m.duckdb", engine=True, window_s=1.0)
    engine = srv.analyzer
    try:
        t0 = int(time.time()) - 20
        for s in range(6):     # windows close, verdicts and findings open
            for host, gpus in (("host-b", {0: MEMORY, 1: COMPUTE}), ("host-a", {0: COMPUTE, 3: MEMORY})):
                assert engine.submit(_batch(host, "boot-1", s + 1, t0 + s, gpus)).result(timeout=10) == "committed"
        wait_for(lambda: engine.status()["gpus_total"] == 4 and all(g["verdict"] for g in engine.status()["gpus"]),
                 timeout=15)
        wait_for(lambda: _without_timing(engine.status()) == _without_timing(engine.call("status", "", None)),
                 timeout=10)
        mirrored = engine.status("host-a", 1)
        assert _without_timing(mirrored) == _without_timing(engine.call("status", "host-a", 1))
        assert [(g["host"], g["gpu"]) for g in mirrored["gpus"]] == [("host-a", 0)]
        assert mirrored["gpus_matching"] == 2 and mirrored["hosts"] == 2
        assert engine.status()["findings_open"] >= 1
        assert any(g["open_finding"] for g in engine.status()["gpus"])
    finally:
        srv.stop()


def _row(host: str, gpu: int, verdict: str = "compute_bound", arrival: float = 0.0) -> GpuRow:
    return GpuRow(host, gpu, "NVIDIA H200", verdict, 0.9, ("x",), arrival - 1, arrival, None, False)


def test_rows_are_replaced_and_staleness_is_judged_when_asked():
    m = StatusMirror()
    assert m.age() == float("inf")
    with pytest.raises(LookupError):
        m.status(time.time())
    now = time.time()
    totals = dict(stale_after_seconds=15.0, agents_connected=1, findings_open=0)
    m.apply([_row("h1", 0, arrival=now), _row("h2", 0, arrival=now - 60)], totals)
    m.apply([_row("h1", 0, "memory_bound", arrival=now)], totals)     # only what changed comes again
    s = m.status(now, agents_connected=2)
    assert s["agents_connected"] == 2                  # what this process knows better wins
    assert [(g["host"], g["verdict"], g["stale"]) for g in s["gpus"]] == [
        ("h1", "memory_bound", False), ("h2", "compute_bound", True)]
    assert (s["hosts"], s["hosts_stale"], s["gpus_total"], s["gpus_stale"]) == (2, 1, 2, 1)
    later = m.status(now + 30)                         # nothing new published: ages grow all the same
    assert later["gpus_stale"] == 2 and later["gpus"][0]["last_seen_age_s"] == pytest.approx(30)
    assert m.age() < 5


def test_an_analyzer_behind_its_agents_judges_silence_at_when_it_last_kept_up():
    m, now = StatusMirror(), time.time()
    totals = dict(stale_after_seconds=15.0, ingest_behind_since=now - 50)
    m.apply([_row("h1", 0, arrival=now - 70), _row("h2", 0, arrival=now - 40)], totals)
    s = m.status(now)
    # h2's batches may be waiting behind the backlog: not stale; h1 was silent while the analyzer kept up
    assert [(g["host"], g["stale"], round(g["last_seen_age_s"])) for g in s["gpus"]] == [
        ("h1", True, 70), ("h2", False, 40)]
    assert (s["gpus_stale"], s["hosts_stale"]) == (1, 1)


def test_the_mirrors_index_counts_and_lists_what_a_scan_of_every_row_does():
    """StatusMirror keeps its keys sorted and its arrivals in arrays;
    summarize() scans every row: the same status for every host, limit and
    moment, over rows added out of order and replaced."""
    import random

    from gpuscope.analyzers.status import summarize

    rng, now = random.Random(3), time.time()
    m, rows = StatusMirror(), {}
    for _ in range(60):                                  # publications: new GPUs and replaced rows, any order
        batch = [_row(f"h{rng.randrange(200):03d}", rng.randrange(8),
                      arrival=rng.choice([0.0, now - rng.uniform(0, 120)])) for _ in range(rng.randrange(1, 200))]
        totals = dict(stale_after_seconds=15.0, ingest_behind_since=rng.choice([None, now - 30]))
        m.apply(batch, totals)
        rows.update({(r.host, r.gpu): r for r in batch})
    assert len(rows) > 1024                          # past the arrays' first size
    for _ in range(200):
        host = rng.choice(["", "h003", "h199", "h04", "zz"])
        limit = rng.choice([None, 0, 1, 5, 1000])
        at = now + rng.uniform(-60, 60)
        want = summarize(((k, r.last_arrival) for k, r in rows.items()), rows.__getitem__, totals, at, host, limit)
        assert m.status(at, host, limit) == want, (host, limit)
