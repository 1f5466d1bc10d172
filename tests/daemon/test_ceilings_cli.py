"""Measured ceilings over real gRPC on loopback: `gpuscope calibrate --send`
stores them in the analyzer, `gpuscope ceilings` prints them against the
datasheet; bad records are refused naming the field."""
import json

import pytest

from gpuscope.daemon import clients
from gpuscope.daemon.cli import main
from gpuscope.security.tls import ClientSecurity
from tests.helpers import AnalyzerServer, calibration_record

PLAIN = ClientSecurity(insecure=True)


@pytest.fixture
def analyzer(tmp_path, monkeypatch):
    # main() would point the logs at this test's captured stdout, closed before the next test
    monkeypatch.setattr("gpuscope.daemon.logs.configure", lambda *a, **k: None)
    srv = AnalyzerServer(tmp_path / "a.duckdb")
    yield srv
    srv.stop()


def test_sent_calibrations_are_listed_against_the_datasheet(analyzer, capsys):
    t = analyzer.target
    clients.report_calibration(t, "h1", calibration_record(started_at=1.7e9, hbm=4.0e12), security=PLAIN)
    clients.report_calibration(t, "h1", calibration_record(started_at=1.7e9 + 86400, hbm=4.32e12), security=PLAIN)
    clients.report_calibration(t, "h2", calibration_record(uuid="GPU-b", name="NVIDIA A100-SXM4-80GB"),
                               security=PLAIN)
    capsys.readouterr()                   # the analyzer's own log lines
    assert main(["ceilings", "--server", t, "--insecure", "--model", "h200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:-1]] == ["h1"]
    assert "4.32 TB/s (90 %)" in out[1] and "700 TFLOP/s (71 %)" in out[1] and "2023-11-15" in out[1]
    assert main(["ceilings", "--server", t, "--insecure", "--history", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["calibrations"]
    assert len(rows) == 3 and rows[0]["ceilings"]["hbm_triad"]["value"] == 4.32e12


def test_a_bad_record_is_refused_naming_the_field(analyzer):
    r = calibration_record()
    r["measurements"][0]["unit"] = "parsecs"
    with pytest.raises(clients.ClientError, match=r"measurements\[0\]\.unit"):
        clients.report_calibration(analyzer.target, "h1", r, security=PLAIN)


def test_calibrate_send_stores_a_cpu_result_marked(analyzer, capsys):
    argv = ["calibrate", "--quick", "--platform", "cpu", "--dtypes", "bf16", "--send", analyzer.target,
            "--insecure", "--host", "h9", "--json"]
    assert main(argv) == 0
    assert "no GPU's roofline uses it" in capsys.readouterr().err
    (row,) = analyzer.analyzer.store.ceilings(host="h9")
    assert row["platform"] == "cpu" and row["ceilings"]["matmul_bf16"]["value"] > 0
    capsys.readouterr()
    assert main(["ceilings", "--server", analyzer.target, "--insecure"]) == 0
    assert "(quick, cpu, not a GPU)" in capsys.readouterr().out


def test_through_the_analysis_process(tmp_path):
    """`gpuscope analyzer` runs its store in a child process: both calls cross it (engine CALLS)."""
    srv = AnalyzerServer(tmp_path / "e.duckdb", engine=True)
    try:
        ack = clients.report_calibration(srv.target, "h1", calibration_record(), security=PLAIN)
        assert ack["ceilings"] == 7
        bad = calibration_record()
        bad["started_at"] = None
        with pytest.raises(clients.ClientError, match="started_at: missing"):
            clients.report_calibration(srv.target, "h1", bad, security=PLAIN)
        assert [r["id"] for r in clients.ceilings(srv.target, security=PLAIN)] == [ack["id"]]
    finally:
        srv.stop()
