"""The analyzer with its store and analysis in a child process
(analyzers/engine.py), driven in process: what crosses the pipe, and what
happens while the child is away."""
import os
import signal

import pytest

from gpuscope.analyzers.analyzer import AnalyzerConfig
from gpuscope.analyzers.engine import EngineClient
from gpuscope.daemon import clients
from tests.helpers import AnalyzerServer, wait_for


def test_a_store_that_cannot_open_ends_start_up_with_the_childs_error(tmp_path):
    (tmp_path / "dir.duckdb").mkdir()
    engine = EngineClient(AnalyzerConfig(str(tmp_path / "dir.duckdb"), memory_limit="256MB"))
    with pytest.raises(RuntimeError) as err:
        engine.start()
    assert "dir.duckdb" in str(err.value)
    engine.close()


def test_queries_while_the_child_restarts_are_unavailable_then_answered(tmp_path):
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
