"""ListFindings answered by the gRPC process from a mirror of the findings
the analysis process wrote (analyzers/findings_mirror.py): when it answers,
it must say exactly what the store says; when it cannot, it must say so."""
import json
import random
import time

from gpuscope.analyzers.findings_mirror import FindingsMirror
from gpuscope.daemon import clients
from gpuscope.analyzers.store import FINDING_COLUMNS, Store, StoreConfig
from tests.analyzers.test_lifecycle import COMPUTE, MEMORY, _batch
from tests.helpers import AnalyzerServer, wait_for

VERDICTS = ("memory-bound", "compute-bound", "host-bound", "degraded")
FLAGS = ("power-capped", "thermal-throttled", "ecc")


def _finding(rng: random.Random, i: int, now: float) -> dict:
    start = round(now - rng.uniform(0, 7200), -1)      # ties: ordered by id, in the store and the mirror
    closed = rng.random() < 0.7
    attribution = rng.choice([{}, {"namespace": "ml", "pod": f"p{i % 3}"}, {"slurm_job": str(i % 4)}])
    return dict(id=f"f{i:05d}", host=f"h{i % 7}", gpu=i % 4, job="python train.py", verdict=rng.choice(VERDICTS),
                start=start, end=start + rng.uniform(0, 600) if closed else None,
                confidence=0.8, windows=3, evidence=json.dumps({"dram_active": 0.5}),
                flags=json.dumps(rng.sample(FLAGS, rng.randint(0, 2))), summary="s", alternatives="[]",
                decided_by="counters", counters_verdict=None, trace_verdict=None, captures="[]",
                absorbed_until=None, attribution=json.dumps(attribution), source="nvml",
                kind=rng.choice(["bottleneck", "bottleneck", "degraded", None]), condition_key=None)


def _row(f: dict) -> tuple:
    return tuple(f[c] for c in FINDING_COLUMNS)


def _queries(rng: random.Random, now: float):
    for _ in range(400):
        q = {}
        if rng.random() < 0.3:
            q["host"] = f"h{rng.randrange(7)}"
        if rng.random() < 0.2:
            q["gpu"] = rng.randrange(4)
        if rng.random() < 0.7:
            q["start"] = now - rng.uniform(0, 8000)
        if rng.random() < 0.2:
            q["end"] = now - rng.uniform(0, 3000)
        if rng.random() < 0.2:
            q["open_only"] = True
        if rng.random() < 0.2:
            q["verdicts"] = rng.sample(VERDICTS, 2)
        if rng.random() < 0.15:
            q["flags"] = [rng.choice(FLAGS)]
        if rng.random() < 0.15:
            q["kinds"] = [rng.choice(["bottleneck", "degraded"])]
        if rng.random() < 0.1:
            q["pod"] = rng.choice(["ml/p1", "p2"])
        if rng.random() < 0.05:
            q["slurm_job"] = "2"
        if rng.random() < 0.1:
            q["gpus"] = [(f"h{rng.randrange(7)}", rng.randrange(4)) for _ in range(2)]
        q["limit"] = rng.choice([5, 50, 1000])
        yield q


def test_answers_are_the_stores_or_none(tmp_path):
    rng = random.Random(7)
    now = time.time()
    store = Store(StoreConfig(str(tmp_path / "f.duckdb")))
    try:
        found = [_finding(rng, i, now) for i in range(3000)]
        store.upsert_findings([_row(f) for f in found[:2000]])
        mirror = FindingsMirror(max_closed=600)
        mirror.reset(*store.recent_findings(600))
        assert mirror.covered_after > now - 7200     # it holds a part, and says which
        later = found[2000:]
        for f in rng.sample(found[:2000], 300):          # open ones close, closed ones are rewritten
            later.append(dict(f, end=f["end"] or f["start"] + 60, summary="changed"))
        for i in range(0, len(later), 100):
            rows = [_row(f) for f in later[i:i + 100]]
            store.upsert_findings(rows)
            mirror.apply(rows)
        assert len(mirror) < 3000
        answered = 0
        for q in _queries(rng, now):
            got = mirror.answer(**q)
            if got is None:
                continue
            answered += 1
            assert [r["id"] for r in got] == [r["id"] for r in store.findings(**q)], q
            assert got == store.findings(**q), q
        assert answered > 100
        assert mirror.answer(limit=100) is not None       # the newest hundred are here
        assert mirror.answer(host="h1", start=now - 7200, limit=100000) is None   # all of an old range is not
    finally:
        store.close()


def test_nothing_is_answered_before_the_first_publication():
    m = FindingsMirror()
    m.apply([_row(_finding(random.Random(1), 1, time.time()))])
    assert m.answer() is None


def test_the_engine_answers_findings_from_the_mirror(tmp_path):
    srv = AnalyzerServer(tmp_path / "m.duckdb", engine=True, window_s=1.0)
    engine = srv.analyzer
    try:
        t0 = int(time.time()) - 20
        seq = 0
        for s in range(12):       # verdicts change: findings open and close
            gpus = {0: MEMORY if s < 6 else COMPUTE, 1: COMPUTE}
            seq += 1
            assert engine.submit(_batch("host-a", "boot-1", seq, t0 + s, gpus)).result(timeout=10) == "committed"
        wait_for(lambda: len(engine.call("list_findings", start=t0 - 10)) >= 2, timeout=15)
        engine.drain()
        query = dict(start=t0 - 10)

        def same() -> bool:
            mirrored = engine.findings_mirror.answer(**query)
            stored = engine.call("list_findings", **query)
            key = ("id", "verdict", "start", "end")
            return mirrored is not None and [[r[k] for k in key] for r in mirrored] == [[r[k] for k in key] for r in stored]
        wait_for(same, timeout=15)
        assert engine.list_findings(**query)[0]["id"] == engine.call("list_findings", **query)[0]["id"]
        assert any(r["end"] is not None for r in engine.list_findings(**query))
        # what `gpuscope findings --json` shows: which window each one's numbers hold
        listed = clients.findings(srv.target, start=t0 - 10)
        assert listed and all(f["start"] < f["absorbed_until"] <= t0 + 12 for f in listed)
        assert all(f["absorbed_until"] == f["end"] for f in listed if f["end"] is not None)
    finally:
        srv.stop()


def test_what_a_list_made_of_a_row_is_kept_until_the_row_is_written_again():
    rng, now = random.Random(3), time.time()
    found = [_finding(rng, i, now) for i in range(50)]
    m = FindingsMirror()
    m.reset([_row(f) for f in found], -float("inf"))
    calls = []

    def convert(r):
        calls.append(r["id"])
        return (r["id"], r["summary"])
    first = m.messages(convert, "reader", limit=20)
    assert first == [(r["id"], r["summary"]) for r in m.answer(limit=20)] and len(calls) == 20
    assert m.messages(convert, "reader", limit=20) == first and len(calls) == 20       # kept
    assert len(m.messages(convert, "operator", limit=20)) == 20 and len(calls) == 40   # per variant
    newest = max(found, key=lambda f: (f["start"], f["id"]))
    m.apply([_row(dict(newest, summary="rewritten"))])
    again = m.messages(convert, "reader", limit=20)
    assert again[0] == (newest["id"], "rewritten") and len(calls) == 41


def test_a_reply_joined_from_entries_is_the_reply_built_from_messages():
    from gpuscope.analyzers.service import _findings_entry
    from gpuscope.v1 import analyzer_pb2 as apb
    msgs = [apb.Finding(id="a"), apb.Finding(id="b", job="x" * 200),
            apb.Finding(id="c", evidence=apb.Evidence(summary="y" * 40000, numbers={"dram": 0.5}))]
    joined = apb.FindingsResponse.FromString(b"".join(_findings_entry(m) for m in msgs))
    assert joined == apb.FindingsResponse(findings=msgs)
