"""A capture refines the counters' finding: counters say "GPU starved by the
host" (host-bound or launch-bound), the trace decides."""
import json

from gpuscope.analyzers.classify import Classification
from gpuscope.collectors.xspace_reader import parse_xspace
from gpuscope.v1 import samples_pb2 as pb
from tests.conftest import FIXTURE
from tests.helpers import AnalyzerServer


def _launch_trace() -> bytes:
    run = next((FIXTURE / "traces" / "launch_bound" / "plugins" / "profile").iterdir())
    return (run / "vm.xplane.pb").read_bytes()


def test_trace_refines_a_starved_finding(fixture_dir, tmp_path):
    srv = AnalyzerServer(tmp_path / "fuse.duckdb")
    try:
        a = srv.analyzer
        window = Classification(gpu=0, start=100.0, end=105.0, verdict="host-bound", confidence=0.7,
                                summary="GPU starved by the host", evidence={"host_cpu_cores": 1.8},
                                alternatives=("launch-bound",))
        a.writer.call(lambda st: a._record([("h1", window, "pid:461 python workload.py", {})])).result()
        rec = pb.CaptureRecord(id="cap1", host="h1", target="127.0.0.1:9012", pid=461, gpus=[0], start=103.0,
                               end=103.5, duration_ms=500, status="ok", trigger="on-call")
        row = a.report_capture(rec, _launch_trace())
        assert row["verdict"] == "launch-bound" and row["finding_id"]
        f = a.list_findings(host="h1")[0]
        assert f["verdict"] == "launch-bound" and f["decided_by"] == "trace"
        assert f["counters_verdict"] == "host-bound" and f["trace_verdict"] == "launch-bound"
        assert f["captures"] == ["cap1"] and "launches/s" in f["summary"]
        # the episode keeps following the counters: another host-bound window extends it
        nxt = Classification(gpu=0, start=105.0, end=110.0, verdict="host-bound", confidence=0.7, summary="s",
                             evidence={"host_cpu_cores": 1.7})
        a.writer.call(lambda st: a._record([("h1", nxt, "pid:461", {})])).result()
        f = a.list_findings(host="h1")[0]
        assert f["windows"] == 2 and f["verdict"] == "launch-bound" and f["end"] is None
        stored = a.store.captures("h1")[0]
        assert json.loads(stored["summary"])["verdict"] == "launch-bound"
    finally:
        srv.stop()


def test_capture_without_open_finding_is_stored_unlinked(fixture_dir, tmp_path):
    srv = AnalyzerServer(tmp_path / "nolink.duckdb")
    try:
        rec = pb.CaptureRecord(id="cap2", host="h2", target="x:1", gpus=[3], status="ok")
        row = srv.analyzer.report_capture(rec, _launch_trace())
        assert row["finding_id"] is None and row["verdict"] == "launch-bound"
    finally:
        srv.stop()


def test_garbage_trace_in_a_report_is_recorded_as_an_error(tmp_path):
    srv = AnalyzerServer(tmp_path / "bad.duckdb")
    try:
        rec = pb.CaptureRecord(id="cap3", host="h3", target="x:1", status="ok")
        row = srv.analyzer.report_capture(rec, b"\x0a\xff\xff\xff\xff\x0f")
        assert row["verdict"] is None and "not an XSpace" in row["error"]
    finally:
        srv.stop()


def test_foreign_protobuf_is_not_taken_for_a_trace():
    import pytest
    from gpuscope.collectors.xspace_reader import TraceError
    foreign = pb.CaptureRecord(id="x", host="h", target="t", status="ok").SerializeToString()
    with pytest.raises(TraceError):
        parse_xspace(foreign, "foreign.pb")


def test_a_capture_over_before_the_open_finding_began_does_not_decide_it(fixture_dir, tmp_path):
    """Found in a trial: captures reported after the GPU moved on (an agent
    buffering its reports through an outage) turned the newer finding's
    verdict."""
    srv = AnalyzerServer(tmp_path / "late.duckdb")
    try:
        a = srv.analyzer
        window = Classification(gpu=0, start=200.0, end=205.0, verdict="compute-bound", confidence=0.9,
                                summary="tensor pipes busy", evidence={"tensor_util_ratio": 0.8})
        a.writer.call(lambda st: a._record([("h1", window, "pid:461 python train.py", {})])).result()
        late = pb.CaptureRecord(id="old", host="h1", target="127.0.0.1:9012", pid=461, gpus=[0], start=150.0,
                                end=150.5, duration_ms=500, status="ok", trigger="on-call")
        row = a.report_capture(late, _launch_trace())
        assert row["verdict"] == "launch-bound" and row["finding_id"] is None        # stored, linked to nothing
        f = a.list_findings(host="h1")[0]
        assert f["verdict"] == "compute-bound" and f["decided_by"] == "counters" and not f["captures"]
    finally:
        srv.stop()
