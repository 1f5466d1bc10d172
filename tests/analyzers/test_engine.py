"""The analyzer with its store and analysis in a child process
(analyzers/engine.py), driven in process: what crosses the pipe, and what
happens while the child is away."""
import os
import signal

import duckdb
import pytest

from gpuscope.analyzers.analyzer import AnalyzerConfig
from gpuscope.analyzers.engine import EngineClient, said
from gpuscope.daemon import clients
from tests.helpers import AnalyzerServer, wait_for


def test_a_store_that_cannot_open_ends_start_up_with_the_childs_error(tmp_path):
    (tmp_path / "dir.duckdb").mkdir()
    engine = EngineClient(AnalyzerConfig(str(tmp_path / "dir.duckdb"), memory_limit="256MB"))
    with pytest.raises(RuntimeError) as err:
        engine.start()
    assert "dir.duckdb" in str(err.value)
    # found by a tester: "RuntimeError: cannot open ...", the class name before words that say it all
    assert str(err.value).startswith(f"cannot open DuckDB file {tmp_path / 'dir.duckdb'}: IO Error: "), err.value
    engine.close()


@pytest.mark.parametrize("exc, shown", [
    (RuntimeError("cannot open DuckDB file x: held"), "cannot open DuckDB file x: held"),
    (PermissionError(13, "Permission denied", "/var/lib/g.duckdb"), "[Errno 13] Permission denied: '/var/lib/g.duckdb'"),
    (duckdb.IOException("IO Error: No space left on device"), "IO Error: No space left on device"),
    (ValueError("memory limit: '1 apple', expected a size like 1GB or 512MiB"),
     "memory limit: '1 apple', expected a size like 1GB or 512MiB"),
    (KeyError("host"), "KeyError: 'host'"), (AssertionError(), "AssertionError"),
])
def test_start_up_errors_are_said_in_their_own_words_unless_those_need_the_class(exc, shown):
    assert said(exc) == shown


def _note_gc(path):
    import gc
    import sys
    with open(path, "w") as f:
        f.write(repr((gc.get_threshold(), sys.getswitchinterval())))


def test_the_child_runs_with_the_analyzers_collector_thresholds_and_switch_interval(tmp_path):
    """Python's defaults cost the live analysis 15-25 % of its CPU (docs/benchmarks.md)."""
    from gpuscope.analyzers.engine import GC_THRESHOLDS, SWITCH_INTERVAL_S
    note = tmp_path / "gc.txt"
    engine = EngineClient(AnalyzerConfig(str(tmp_path / "g.duckdb"), memory_limit="256MB"),
                          init=_note_gc, init_args=(str(note),))
    engine.start()
    try:
        assert note.read_text() == repr((GC_THRESHOLDS, SWITCH_INTERVAL_S))
    finally:
        engine.close()


def test_queries_while_the_child_restarts_are_unavailable_then_answered(tmp_path, monkeypatch):
    # the gap before the restart outlasts a slow call on a busy machine (2 s did not, under load)
    monkeypatch.setattr("gpuscope.analyzers.engine.RESTART_DELAY_S", 8.0)
    srv = AnalyzerServer(tmp_path / "e.duckdb", engine=True)
    try:
        assert clients.status(srv.target)["kind"] == "analyzer"
        os.kill(srv.analyzer._proc.pid, signal.SIGKILL)
        wait_for(lambda: not srv.analyzer._up, timeout=10)
        with pytest.raises(clients.ClientError) as err:
            clients.findings(srv.target)
        assert "analysis process" in str(err.value)
        wait_for(lambda: srv.analyzer._up, timeout=30)
        assert srv.analyzer.restarts == 1
        assert clients.findings(srv.target) == [] and clients.status(srv.target)["gpus"] == []
    finally:
        srv.stop()


def test_after_a_restart_watchers_and_command_streams_carry_on(tmp_path):
    """Found in a trial: a new child did not learn who was connected or
    watching, so watchers went silent and agents looked disconnected."""
    import time

    import grpc

    from gpuscope.analyzers.events import Watch
    from gpuscope.v1 import analyzer_pb2_grpc
    from tests.analyzers.test_lifecycle import COMPUTE, _batch
    srv = AnalyzerServer(tmp_path / "w.duckdb", engine=True)
    got = []
    try:
        srv.analyzer.commands.subscribe("host-a", lambda cmd: True)
        srv.analyzer.events.subscribe(Watch(deliver=lambda e: got.append(e) or True))
        wait_for(lambda: clients.status(srv.target)["agents_connected"] == 1, timeout=10)
        os.kill(srv.analyzer._proc.pid, signal.SIGKILL)
        wait_for(lambda: srv.analyzer.restarts == 1 and srv.analyzer._up, timeout=30)
        wait_for(lambda: clients.status(srv.target)["agents_connected"] == 1, timeout=10)
        t0 = int(time.time()) - 30
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            for i in range(4):
                stub.Push(_batch("host-a", "b1", i + 1, t0 + i, {0: COMPUTE}), timeout=10)
        wait_for(lambda: any(e["kind"] == "finding" for e in got), timeout=15)
    finally:
        srv.stop()


def test_a_stalled_child_cannot_stall_the_analyzer_or_its_stop(tmp_path):
    """Found in a trial: with the child stopped (SIGSTOP: swap, a stuck call),
    the pipe filled, a send blocked the event loop and the stop never ended."""
    import time
    srv = AnalyzerServer(tmp_path / "s.duckdb", engine=True)
    child = srv.analyzer._proc.pid
    try:
        wait_for(lambda: srv.analyzer.mirror.age() < 5, timeout=10)     # the child's first status arrived
        os.kill(child, signal.SIGSTOP)
        big = b"x" * (1 << 20)
        t0 = time.monotonic()
        for _ in range(64):                                 # far more than a pipe holds
            srv.analyzer._tell(("watch", bool(big)))       # never blocks the caller
            srv.analyzer._pipe.put(("rejected", "h", 1, big.decode()))
        assert time.monotonic() - t0 < 1.0
        assert clients.status(srv.target)["gpus_total"] == 0     # answered here, from the mirror
        srv.analyzer.mirror_max_age_s = 0.0                      # ... until the mirror is old: then asked
        with pytest.raises(clients.ClientError) as err:
            clients.status(srv.target)
        assert "did not answer" in str(err.value)
        t0 = time.monotonic()
        srv.stop()
        assert time.monotonic() - t0 < 15
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
