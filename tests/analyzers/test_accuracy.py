"""Stated accuracy: each capture whose trace verdict lands for a GPU the
counters had judged is one pair; `gpuscope accuracy` counts them over the
fleet. Real analyzer, real gRPC, real traces of the bundled recording."""
import json
import subprocess
import sys

from gpuscope.analyzers.accuracy import MIN_PAIRS, summarize
from gpuscope.analyzers.classify import Classification
from gpuscope.daemon import clients
from gpuscope.v1 import samples_pb2 as pb
from tests.conftest import FIXTURE
from tests.helpers import AnalyzerServer


def _trace(phase: str) -> bytes:
    run = next((FIXTURE / "traces" / phase / "plugins" / "profile").iterdir())
    return (run / "vm.xplane.pb").read_bytes()


def _window(gpu: int, verdict: str, start: float = 100.0) -> Classification:
    return Classification(gpu=gpu, start=start, end=start + 5, verdict=verdict, confidence=0.8, summary=verdict,
                          evidence={"util_gpu_ratio": 0.9})


def test_captures_record_what_counters_and_trace_said_and_accuracy_counts_them(fixture_dir, tmp_path):
    srv = AnalyzerServer(tmp_path / "acc.duckdb")
    try:
        a = srv.analyzer
        a._names[("h1", 0)] = a._names[("h1", 1)] = "NVIDIA H200"
        windows = [("h1", _window(0, "host-bound"), "pid:1 a", {}), ("h1", _window(1, "compute-bound"), "pid:2 b", {}),
                   ("h2", _window(0, "compute-bound"), "pid:3 c", {})]
        a.writer.call(lambda st: a._record(windows)).result()
        captures = [("c1", "h1", 0, "launch_bound"),     # counters host-bound, trace launch-bound: same family
                    ("c2", "h1", 1, "matmul_bf16"),      # compute-bound both
                    ("c3", "h2", 0, "hbm_stream"),       # compute-bound said, memory-bound found
                    ("c4", "h3", 0, "matmul_bf16")]      # a GPU the counters never judged: no pair
        for cid, host, gpu, phase in captures:
            a.report_capture(pb.CaptureRecord(id=cid, host=host, target="x:1", gpus=[gpu], start=102.0, end=103.0,
                                              status="ok", trigger="on-call"), _trace(phase))
        rows = clients.accuracy(srv.target)
        assert sorted((r["model"], r["counters_verdict"], r["trace_verdict"], r["pairs"]) for r in rows) == [
            ("", "compute-bound", "memory-bound", 1), ("NVIDIA H200", "compute-bound", "compute-bound", 1),
            ("NVIDIA H200", "host-bound", "launch-bound", 1)]
        assert [r["pairs"] for r in clients.accuracy(srv.target, host="h2")] == [1]
        assert clients.accuracy(srv.target, start=1e9 * 1.9) == []       # all pairs are older
        s = summarize(rows)
        assert s["overall"] == dict(pairs=3, agreed=1, same_family=1, precision=0.333, enough=False)
        assert s["per_verdict"]["compute-bound"]["pairs"] == 2 and s["per_model"]["unknown"]["pairs"] == 1

        out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "accuracy", "--server", srv.target, "--insecure"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "3 pairs: the trace agreed with the counters in 1 of 3 (too few to state a rate)" in out.stdout
        assert "1 more within launch/host-bound" in out.stdout and "memory-bound 1" in out.stdout
        js = json.loads(subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "accuracy", "--server",
                                        srv.target, "--json", "--insecure"], capture_output=True, text=True, timeout=60).stdout)
        assert js["overall"]["pairs"] == 3 and len(js["pairs"]) == 3
    finally:
        srv.stop()


def test_precision_is_stated_only_with_enough_pairs():
    few = summarize([dict(model="m", counters_verdict="memory-bound", trace_verdict="memory-bound", pairs=3)])
    assert few["per_verdict"]["memory-bound"] == dict(pairs=3, agreed=3, same_family=0, precision=1.0, enough=False)
    many = summarize([dict(model="m", counters_verdict="memory-bound", trace_verdict="memory-bound", pairs=MIN_PAIRS),
                      dict(model="m", counters_verdict="memory-bound", trace_verdict="compute-bound", pairs=MIN_PAIRS)])
    assert many["per_verdict"]["memory-bound"]["precision"] == 0.5 and many["per_verdict"]["memory-bound"]["enough"]
    assert many["matrix"] == {"memory-bound": {"memory-bound": MIN_PAIRS, "compute-bound": MIN_PAIRS}}


def test_findings_show_the_measured_precision_of_their_counters_verdict(fixture_dir, tmp_path):
    srv = AnalyzerServer(tmp_path / "prec.duckdb")
    try:
        a = srv.analyzer
        a.writer.call(lambda st: a._record([("h1", _window(0, "compute-bound"), "pid:1 a", {})])).result()
        for i in range(MIN_PAIRS):          # ten traces of compute-bound GPUs, eight of them agree
            a.store.upsert_verdict_pair(dict(capture_id=f"p{i}", t=100.0 + i, host="h1", gpu=0, model="NVIDIA H200",
                                             counters_verdict="compute-bound", counters_confidence=0.9,
                                             trace_verdict="compute-bound" if i < 8 else "memory-bound",
                                             trace_confidence=0.9, finding_id=None))
        cli = [sys.executable, "-m", "gpuscope.daemon.cli", "findings", "--server", srv.target, "--insecure"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert "(counters' compute-bound measured right 80 % of 10 traces)" in out.stdout, out.stdout + out.stderr
        # a header with the time zone, and whose job each is (found in a trial: neither was said)
        lines = out.stdout.splitlines()
        assert lines[0].startswith("1 finding, times in ") and lines[2].startswith("    job ")
        js = json.loads(subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=60).stdout)
        assert js["findings"][0]["counters_precision"] == {"precision": 0.8, "pairs": 10}
    finally:
        srv.stop()


def test_the_live_view_shows_the_measured_precision_beside_a_finding():
    from gpuscope.analyzers.accuracy import measured, trust_words
    from gpuscope.daemon.view import render
    rows = [dict(model="m", counters_verdict="memory-bound", trace_verdict="memory-bound", pairs=9),
            dict(model="m", counters_verdict="memory-bound", trace_verdict="compute-bound", pairs=3)]
    status = dict(gpus=[], samples_committed=0, batches_committed=0, batches_rejected=0, window_seconds=5.0)
    f = dict(host="h", gpu=0, verdict="memory-bound", counters_verdict="memory-bound", start=0.0, confidence=0.9,
             job="pid:1 x", summary="s")
    known = measured(rows)
    text = render(status, [f], "hdr", now=60.0, trust=lambda verdict: trust_words(verdict, known))
    assert "(conf 0.90 (counters' memory-bound measured right 75 % of 12 traces))" in text
    assert "measured right" not in render(status, [f], "hdr", now=60.0)
