"""`gpuscope top`: the fleet's worst GPUs and jobs over real gRPC, from the
findings the analyzer made of a fake NVML's GPUs."""
import json
import os
import subprocess
import sys
import time

import pytest

from gpuscope.daemon import clients
from tests.fakes.nvml import FakeNvml, h200
from tests.conftest import free_port
from tests.helpers import AnalyzerServer, fake_agent, in_terminal, last_frame, wait_for
from tests.test_watch_report import BUSY, MEMORY


@pytest.mark.parametrize("engine", [False, True], ids=["thread", "process"])
def test_top_ranks_what_was_bottlenecked_longest_and_says_what_holds_it_now(tmp_path, engine):
    srv = AnalyzerServer(tmp_path / "t.duckdb", engine=engine)
    fake = FakeNvml([h200(**MEMORY), h200(**BUSY), h200()])      # memory-bound, compute-bound, idle
    agent = fake_agent(fake, srv.target, host="gpu-node")
    try:
        wait_for(lambda: {f["verdict"] for f in clients.findings(srv.target, open_only=True)}
                 >= {"memory-bound", "compute-bound"}, timeout=30)
        time.sleep(1.5)
        r = clients.top(srv.target, start=time.time() - 600)
        rows = {(x["host"], x["gpu"]): x for x in r["rows"]}
        assert set(rows) == {("gpu-node", 0), ("gpu-node", 1)}                   # idle is not a bottleneck
        assert rows["gpu-node", 0]["verdict"] == rows["gpu-node", 0]["now_verdict"] == "memory-bound"
        assert rows["gpu-node", 1]["now_verdict"] == "compute-bound"
        assert all(0 < x["bottleneck_seconds"] <= 600 and 0 < x["share"] <= 1 for x in r["rows"])
        assert r["rows"][0]["bottleneck_seconds"] >= r["rows"][1]["bottleneck_seconds"]
        assert "DRAM" in rows["gpu-node", 0]["summary"] or "memory" in rows["gpu-node", 0]["summary"]
        jobs = clients.top(srv.target, by="job")
        assert len(jobs["rows"]) >= 1 and sum(x["gpus"] for x in jobs["rows"]) == 2
        assert clients.top(srv.target, host="nowhere")["rows"] == []
        with pytest.raises(clients.ClientError, match="by: 'pid'"):
            clients.top(srv.target, by="pid")
        assert all("power-capped" in f["flags"] for f in clients.findings(srv.target, flags=["power-capped"]))
        with pytest.raises(clients.ClientError, match="'Power capped' is not a flag"):
            clients.findings(srv.target, flags=["Power capped"])
        # the CLI, for people and for scripts
        cli = [sys.executable, "-m", "gpuscope.daemon.cli", "top", "--server", srv.target, "--insecure"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "gpu-node/gpu0" in out.stdout and "memory-bound " in out.stdout, out.stderr
        out = subprocess.run(cli + ["--json", "--by", "job"], capture_output=True, text=True, timeout=60)
        assert json.loads(out.stdout)["by"] == "job"
        out = subprocess.run(cli + ["--host", "nowhere"], capture_output=True, text=True, timeout=60)
        assert "no bottlenecks for host 'nowhere'" in out.stdout and "knows no host 'nowhere'" in out.stdout
        if not engine:                 # top --watch in a terminal: redrawn in the alternate screen, cut to its width
            text, status = in_terminal(cli + ["--watch", "1"], 60, 20, seconds=5)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text[-2000:]
            view = last_frame(text)
            assert "\x1b[?1049h" in text and "gpu-node/gpu0" in view and "as of " in view, view
            assert all(len(line.rstrip()) <= 60 for line in view.split("\n")), view
            lost = [sys.executable, "-m", "gpuscope.daemon.cli", "top", "--server", f"127.0.0.1:{free_port()}",
                    "--insecure", "--watch", "1"]
            text, status = in_terminal(lost, 100, 20, seconds=5)     # a lost server is said, and asked again
            assert os.WEXITSTATUS(status) == 0 and "asking again in 1 s" in last_frame(text), text[-2000:]
        # watch starts with what is open now (found in a trial: no header, no current state)
        for args, want in ((["--json"], '"kind": "finding"'), ([], "--- live ---")):
            w = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "watch", "--server", srv.target,
                                  "--insecure", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                lines = []
                while sum(want in ln for ln in lines) < (2 if args else 1):
                    line = w.stdout.readline()
                    assert line, w.stderr.read()
                    lines.append(line)
            finally:
                w.kill()
                w.communicate(timeout=10)
            if args:
                first = [json.loads(ln) for ln in lines]
                assert all(e["backlog"] for e in first)
                assert {e["record"]["verdict"] for e in first if e["kind"] == "finding"} >= {"memory-bound",
                                                                                           "compute-bound"}
            else:
                assert lines[0].startswith(f"watching {srv.target}: anomaly, capture, decision, finding")
                assert lines[1].startswith("now: ") and "open finding" in lines[1]
    finally:
        agent.stop()
        srv.stop()
