"""The analyzer over mutual TLS, as an attacker and as its users meet it:
no certificate, another CA, another host's agent certificate, a reader
calling an operator's RPC. Certificates are made in the test."""
import asyncio
import time

import grpc
import pytest

from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.service import AnalyzerServicer, add_to_server
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch
from gpuscope.daemon.serve import build_server, shutdown
from gpuscope.security import certs
from gpuscope.security.auth import authorize, caller_from
from gpuscope.security.tls import ClientSecurity, server_credentials, tls_files
from gpuscope.v1 import agent_pb2, agent_pb2_grpc, analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb
from tests.conftest import free_port


def _authenticate(method, auth_context, metadata):
    caller = caller_from(auth_context, metadata, None)
    return caller, authorize(method, caller), None


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca = root / "ca"
    certs.create_ca(ca)
    certs.issue_server(ca)
    for host in ("h1", "h2"):
        certs.issue_agent(ca, host, out=root / host)
    for role in ("reader", "operator"):
        certs.issue_client(ca, f"alice-{role}", role, out=root / role)
    other = root / "other"
    certs.create_ca(other)
    certs.issue_agent(other, "h1", out=root / "forged")
    return root


@pytest.fixture(scope="module")
def analyzer(pki, tmp_path_factory):
    a = Analyzer(AnalyzerConfig(str(tmp_path_factory.mktemp("db") / "s.duckdb"), memory_limit="256MB"))
    servicer = AnalyzerServicer(a)
    server, port, _ = build_server("127.0.0.1:0", [
        (add_to_server, servicer, "gpuscope.v1.Analyzer")],
        credentials=server_credentials(tls_files(pki / "ca", "analyzer")), authenticate=_authenticate)
    a.start()
    server.start()
    yield a, f"localhost:{port}"
    shutdown(server, grace_s=0.2)
    servicer.close()
    a.close()


def _client(pki, who):
    name = "client" if who in ("reader", "operator") else "agent"
    return ClientSecurity(ca=str(pki / "ca" / "ca.pem"), cert=str(pki / who / f"{name}.pem"),
                          key=str(pki / who / f"{name}.key"))


def _batch(host, seq=1):
    s = [GpuSample(0, time.time() - 1, {"power_watts": 100.0})]
    return encode_batch(host, "boot", seq, s, [DeviceInfo(gpu=0)])


def _code(fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code()


def test_an_agent_pushes_for_its_own_host_only(pki, analyzer):
    a, target = analyzer
    with _client(pki, "h1").channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        assert stub.Push(_batch("h1"), timeout=10).status == pb.BatchAck.COMMITTED
        assert _code(lambda: stub.Push(_batch("h2"), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        oversized = _batch("h2", 2)
        oversized.devices[0].name = "N" * (1 << 20)
        rejected = a.rejected
        assert _code(lambda: stub.Push(oversized, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        assert a.rejected == rejected          # not this agent's host: refused, never counted as a refusal of h2's
        commands = stub.Commands(apb.AgentHello(host="h2", boot_id="x"), timeout=5)
        assert _code(lambda: next(commands)) == grpc.StatusCode.PERMISSION_DENIED
        rec = pb.CaptureRecord(id="c1", host="h2", target="x", status="ok")
        assert _code(lambda: stub.ReportCapture(apb.CaptureReport(record=rec), timeout=10)) == \
            grpc.StatusCode.PERMISSION_DENIED
        # refused on its first chunk, before any trace is taken
        upload = iter([apb.CaptureChunk(record=rec, trace_bytes=3 << 20, data=b"x" * (1 << 20))] * 3)
        assert _code(lambda: stub.UploadCapture(upload, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        # an agent is no on-call reader
        assert _code(lambda: stub.ListFindings(apb.FindingsRequest(), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert a.store.reader().execute("SELECT DISTINCT host FROM samples").fetchall() == [("h1",)]


def test_no_certificate_or_another_ca_is_refused(pki, analyzer):
    _, target = analyzer
    with ClientSecurity(ca=str(pki / "ca" / "ca.pem")).channel(target) as ch:     # TLS, no client cert
        assert _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(), timeout=5)) == \
            grpc.StatusCode.UNAVAILABLE                                          # the handshake fails
    with _client(pki, "forged").channel(target) as ch:
        assert _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).Push(_batch("h1"), timeout=5)) == \
            grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(target) as ch:                                     # plain text to a TLS port
        assert _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(), timeout=5)) == \
            grpc.StatusCode.UNAVAILABLE


def test_roles_reader_reads_and_may_not_push(pki, analyzer):
    _, target = analyzer
    with _client(pki, "reader").channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        assert stub.GetStatus(apb.StatusRequest(), timeout=10).hosts >= 0
        stub.ListFindings(apb.FindingsRequest(), timeout=10)
        assert _code(lambda: stub.Push(_batch("h1", 2), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED


def test_a_reader_may_not_capture_on_an_agent(pki, tmp_path):
    """The agent's own API: Capture is an operator's action."""
    from gpuscope.daemon.service import AgentServicer

    class _NoAgent:      # never reached: authorization comes first
        pass
    server, port, _ = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(_NoAgent()), "gpuscope.v1.Agent")],
        credentials=server_credentials(tls_files(pki / "h1", "agent", ca=pki / "ca" / "ca.pem")),
        authenticate=_authenticate)
    server.start()
    try:
        with _client(pki, "reader").channel(f"127.0.0.1:{port}") as ch:
            req = agent_pb2.CaptureRequest(duration_ms=100, pid=1)
            assert _code(lambda: agent_pb2_grpc.AgentStub(ch).Capture(req, timeout=10)) == \
                grpc.StatusCode.PERMISSION_DENIED
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert _code(lambda: agent_pb2_grpc.AgentStub(ch).Capture(
                agent_pb2.CaptureRequest(duration_ms=100, pid=1), timeout=5)) == grpc.StatusCode.UNAVAILABLE
    finally:
        shutdown(server, grace_s=0.2)


def test_an_agent_sends_calibrations_for_its_own_host_only(pki, analyzer):
    import json
    from tests.helpers import calibration_record
    a, target = analyzer
    body = json.dumps(calibration_record(uuid="GPU-auth"))
    with _client(pki, "h1").channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        assert stub.ReportCalibration(apb.CalibrationReport(host="h1", calibration_json=body), timeout=10).ceilings == 7
        assert _code(lambda: stub.ReportCalibration(apb.CalibrationReport(host="h2", calibration_json=body),
                                                    timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        assert _code(lambda: stub.ListCeilings(apb.CeilingsRequest(), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    with _client(pki, "reader").channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        assert _code(lambda: stub.ReportCalibration(apb.CalibrationReport(host="h1", calibration_json=body),
                                                    timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        rows = json.loads(stub.ListCeilings(apb.CeilingsRequest(uuid="GPU-auth"), timeout=10).calibrations_json)
    assert [(r["host"], r["uuid"]) for r in rows] == [("h1", "GPU-auth")]


def test_calibrate_send_presents_the_agent_certificate_of_its_host(pki, analyzer, capsys, monkeypatch):
    from gpuscope.daemon.cli import main
    monkeypatch.setattr("gpuscope.daemon.logs.configure", lambda *a, **k: None)
    a, target = analyzer
    tls = ["--ca", str(pki / "ca" / "ca.pem"), "--cert", str(pki / "h1" / "agent.pem"),
           "--key", str(pki / "h1" / "agent.key")]
    argv = ["calibrate", "--quick", "--platform", "cpu", "--dtypes", "bf16", "--json", "--send", target, *tls]
    progress = []
    monkeypatch.setattr("gpuscope.daemon.cmd_calibrate.Calibrator.run", lambda self: progress.append("measured"))
    # another host's name, or a dead analyzer, are found by a dry run before anything is measured
    assert main(argv + ["--host", "h2"]) == 1
    out, err = capsys.readouterr()
    assert "this agent's certificate is for 'h1' (an agent's certificate speaks for its own host only: pass " \
        "--host h1" in err and "nothing was measured" in err and not out
    dead = f"127.0.0.1:{free_port()}"
    assert main([*argv[:-len(tls) - 1], dead, *tls, "--host", "h1"]) == 1
    assert f"error: cannot reach {dead}: Failed to connect to remote host: Connection refused" in \
        capsys.readouterr().err
    assert progress == []
    monkeypatch.undo()
    monkeypatch.setattr("gpuscope.daemon.logs.configure", lambda *a, **k: None)
    assert main(argv + ["--host", "h1"]) == 0
    assert [c["platform"] for c in a.store.ceilings(host="h1", model="cpu")] == ["cpu"]


def test_a_dry_run_checks_the_host_and_stores_nothing(pki, analyzer):
    a, target = analyzer
    before = a.store.ceilings(history=True)
    with _client(pki, "h1").channel(target) as ch:
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        ack = stub.ReportCalibration(apb.CalibrationReport(host="h1", dry_run=True), timeout=10)
        assert (ack.id, ack.ceilings) == ("", 0)
        assert _code(lambda: stub.ReportCalibration(apb.CalibrationReport(host="h2", dry_run=True),
                                                    timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    with _client(pki, "reader").channel(target) as ch:
        assert _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).ReportCalibration(
            apb.CalibrationReport(host="h1", dry_run=True), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert a.store.ceilings(history=True) == before


def test_programs_show_a_reader_the_executable_and_an_operator_the_command(pki, analyzer):
    import json
    from gpuscope.analyzers import programs as pg
    a, target = analyzer
    run = pg.new_run("h1", 77, "python3 train.py --lr 3e-4 --data /secret/corpus", 1000.0, {})
    a.writer.call(lambda st: st.upsert_program_runs([pg.run_row(run)])).result(timeout=10)
    req = apb.ProgramsRequest(start=0.0, fingerprint=run["command_fp"])
    seen = {}
    for who in ("reader", "operator"):
        with _client(pki, who).channel(target) as ch:
            (p,) = json.loads(analyzer_pb2_grpc.AnalyzerStub(ch).ListPrograms(req, timeout=10).programs_json)
            seen[who] = p
    assert seen["reader"]["command"] == "python3" and seen["reader"]["runs_shown"][0]["job"] == "pid:77 python3"
    assert seen["operator"]["runs_shown"][0]["job"] == "pid:77 python3 train.py --lr 3e-4 --data /secret/corpus"
    assert seen["reader"]["name"] == "python train.py"
    with _client(pki, "h1").channel(target) as ch:
        assert _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).ListPrograms(req, timeout=10)) == \
            grpc.StatusCode.PERMISSION_DENIED


def test_an_operator_action_is_audited_with_how_it_ended(pki, tmp_path):
    """The audit line is written once the action has ended and says how
    (found in a trial: `outcome: allowed` was written before the call ran,
    for captures that then failed)."""
    import structlog

    from gpuscope.daemon.cli import build_parser
    from gpuscope.daemon.cmd_serve import _server_security
    ns = build_parser().parse_args(["analyzer", "--tls-dir", str(pki / "ca"), "--db", str(tmp_path / "a.duckdb")])
    security = _server_security(ns, "analyzer", "127.0.0.1:0")
    a = Analyzer(AnalyzerConfig(str(tmp_path / "a.duckdb"), memory_limit="256MB"))
    servicer = AnalyzerServicer(a)
    server, port, _ = build_server("127.0.0.1:0", [(add_to_server, servicer, "gpuscope.v1.Analyzer")], **security)
    a.start()
    server.start()
    try:
        with structlog.testing.capture_logs() as logs:
            for who, req in (("operator", apb.CaptureJobRequest(job="no-such-job")),
                             ("operator", apb.CaptureJobRequest(job="j", duration_ms=10 ** 9)),
                             ("reader", apb.CaptureJobRequest(job="j"))):
                with _client(pki, who).channel(f"localhost:{port}") as ch:
                    _code(lambda: analyzer_pb2_grpc.AnalyzerStub(ch).CaptureJob(req, timeout=10))
            with _client(pki, "reader").channel(f"localhost:{port}") as ch:     # not an operator action: no line
                analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(), timeout=10)
    finally:
        shutdown(server, grace_s=0.2)
        servicer.close()
        a.close()
    audits = [(x["method"], x["role"], x["outcome"], x.get("target")) for x in logs if x["event"] == "audit"]
    assert audits == [("/gpuscope.v1.Analyzer/CaptureJob", "operator", "NOT_FOUND", "job=no-such-job"),
                      ("/gpuscope.v1.Analyzer/CaptureJob", "operator", "INVALID_ARGUMENT", "job=j duration_ms=1000000000"),
                      ("/gpuscope.v1.Analyzer/CaptureJob", "reader", "denied", None)]


def test_how_a_call_ended():
    from gpuscope.daemon.serve import _ended

    class Context:
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code
    assert _ended(Context(None), None) == "ok" and _ended(Context(grpc.StatusCode.OK), None) == "ok"
    assert _ended(Context(grpc.StatusCode.NOT_FOUND), Exception("aborted")) == "NOT_FOUND"
    assert _ended(Context(None), asyncio.CancelledError()) == "cancelled"
    assert _ended(Context(None), RuntimeError("bug")) == "failed"


def test_the_agents_operator_actions_are_audited_with_their_status_code(pki):
    """The agent's handlers are sync, and grpc.aio's context for them keeps
    no code (found in a trial: refused captures were audited as "failed")."""
    import structlog

    from gpuscope.daemon.cli import build_parser
    from gpuscope.daemon.service import AgentServicer, TargetNotAllowed

    class _Agent:
        def capture(self, *args, **kwargs):
            raise TargetNotAllowed("pid 1 is no job on this host's GPUs")

        def owners(self):
            return {}

        def jobs(self):
            return []
    ns = build_parser().parse_args(["agent", "--tls-dir", str(pki / "h1"), "--ca", str(pki / "ca" / "ca.pem")])
    security = _server_security_for(ns, "agent")
    server, port, _ = build_server("127.0.0.1:0", [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(_Agent()), "gpuscope.v1.Agent")], **security)
    server.start()
    try:
        with structlog.testing.capture_logs() as logs, _client(pki, "operator").channel(f"127.0.0.1:{port}") as ch:
            stub = agent_pb2_grpc.AgentStub(ch)
            assert _code(lambda: stub.Capture(agent_pb2.CaptureRequest(duration_ms=100, pid=1), timeout=10)) == \
                grpc.StatusCode.PERMISSION_DENIED
            assert _code(lambda: stub.Capture(agent_pb2.CaptureRequest(duration_ms=100), timeout=10)) == \
                grpc.StatusCode.INVALID_ARGUMENT
            raw = ch.unary_unary("/gpuscope.v1.Agent/Capture")          # bytes that are no message
            assert _code(lambda: raw(b"\xff\xff\xff", timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
            assert len(stub.ListJobs(agent_pb2.ListJobsRequest(), timeout=10).jobs) == 0
    finally:
        shutdown(server, grace_s=0.2)
    assert [(x["method"].rsplit("/", 1)[1], x["outcome"], x.get("target")) for x in logs if x["event"] == "audit"] == [
        ("Capture", "PERMISSION_DENIED", "pid=1 duration_ms=100"), ("Capture", "INVALID_ARGUMENT", "duration_ms=100"),
        ("Capture", "INVALID_ARGUMENT", None), ("ListJobs", "ok", None)]


def _server_security_for(ns, name):
    from gpuscope.daemon.cmd_serve import _server_security
    return _server_security(ns, name, "127.0.0.1:0")
