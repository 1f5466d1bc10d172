"""Each GPU's source is said where people look (issue 10: "gpuscope status
and each finding say which source decided"): the agent's words travel with
the device facts, over real gRPC, into status, findings and the report."""
import json
import subprocess
import sys

from gpuscope.daemon import clients
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import AnalyzerServer, fake_agent, wait_for
from tests.test_watch_report import MEMORY


def test_status_findings_and_report_say_where_the_counters_came_from(tmp_path):
    srv = AnalyzerServer(tmp_path / "s.duckdb")
    agent = fake_agent(FakeNvml([h200(**MEMORY)]), srv.target, host="gpu-node")
    try:
        f = wait_for(lambda: clients.findings(srv.target, open_only=True), timeout=30)[0]
        assert f["source"] == "nvml (GPM)"
        gpus = clients.status(srv.target)["gpus"]
        assert [g["source"] for g in gpus] == ["nvml (GPM)"]
        cli = [sys.executable, "-m", "gpuscope.daemon.cli"]
        out = subprocess.run(cli + ["status", "--server", srv.target, "--insecure"], capture_output=True, text=True,
                             timeout=60)
        assert "SOURCE" in out.stdout and out.stdout.rstrip().endswith("nvml (GPM)"), out.stdout + out.stderr
        out = subprocess.run(cli + ["findings", "--server", srv.target, "--insecure"], capture_output=True,
                             text=True, timeout=60)
        assert "counters from nvml (GPM)" in out.stdout, out.stdout + out.stderr
        out = subprocess.run(cli + ["report", f["id"], "--server", srv.target, "--insecure"], capture_output=True,
                             text=True, timeout=60)
        assert "(decided by counters from nvml (GPM);" in out.stdout.splitlines()[0], out.stdout + out.stderr
        rep = json.loads(subprocess.run(cli + ["report", f["id"], "--server", srv.target, "--insecure", "--json"],
                                        capture_output=True, text=True, timeout=60).stdout)
        assert rep["finding"]["source"] == "nvml (GPM)"
    finally:
        agent.stop()
        srv.stop()
