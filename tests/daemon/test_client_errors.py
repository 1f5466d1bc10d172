"""What an on-call command says when a call fails, against real servers and
real processes: a closed port, a TLS mismatch either way, a wrong server
name, an analyzer stopped with SIGSTOP (a deadline) and one killed with
kill -9 in the middle of a call (gone, not a TLS refusal: found in a trial,
where it read "it probably requires TLS")."""
import signal
import subprocess
import sys
import textwrap
import threading

import grpc
import pytest

from gpuscope.daemon import clients
from gpuscope.security import certs
from gpuscope.security.tls import INSECURE, ClientSecurity, server_credentials, tls_files
from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc
from tests.conftest import free_port
from tests.helpers import generic_servers, wait_for

CLI = [sys.executable, "-m", "gpuscope.daemon.cli"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    certs.create_ca(root)
    certs.issue_server(root)                       # localhost, 127.0.0.1, ::1
    certs.issue_client(root, "rita", "reader", out=root / "rita")
    return root


def _rita(pki, **kw) -> ClientSecurity:
    return ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / "rita" / "client.pem"),
                          key=str(pki / "rita" / "client.key"), **kw)


class _Answers(grpc.GenericRpcHandler):
    def service(self, details):
        return grpc.unary_unary_rpc_method_handler(lambda request, context: b"",
                                                   response_serializer=lambda b: b)


@pytest.fixture(scope="module")
def servers(pki):
    out, stop = generic_servers(_Answers(), {"mtls": server_credentials(tls_files(pki, "analyzer")), "plain": None})
    yield out
    stop()


def _status_error(target: str, security: ClientSecurity, timeout: float = 10.0) -> str:
    with pytest.raises(clients.ClientError) as info:
        clients._call(target, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(),
                                                                                          timeout=t),
                      timeout=timeout, security=security)
    return str(info.value)


def test_a_closed_port_is_unreachable_and_says_what_should_run_there():
    target = f"127.0.0.1:{free_port()}"
    said = _status_error(target, INSECURE)
    assert said.startswith(f"cannot reach {target}: Failed to connect to remote host: Connection refused")
    assert "is `gpuscope analyzer` or `gpuscope up` running there?" in said
    with pytest.raises(clients.ClientError, match="is `gpuscope agent` or `gpuscope up` running there"):
        clients.jobs(target, security=INSECURE)


def test_a_tls_mismatch_names_the_flag_either_way(pki, servers):
    # the server is up: its closing a plain-text connection is a refusal, not a server gone away
    said = _status_error(servers["mtls"], INSECURE)
    assert "closed a plain-text connection; it probably requires TLS: drop --insecure" in said
    said = _status_error(servers["plain"], _rita(pki))
    assert "does not speak TLS (was it started with --insecure?): pass --insecure" in said


def test_a_wrong_server_name_names_the_name_asked_for(pki, servers):
    said = _status_error(servers["mtls"], _rita(pki, server_name="analyzer.elsewhere"))
    assert "does not name analyzer.elsewhere, the name --tls-server-name asked for" in said
    clients._call(servers["mtls"], lambda ch, t: ch.unary_unary("/x.Y/Z")(b"", timeout=t),
                  security=_rita(pki, server_name="localhost"))


def test_an_analyzer_stopped_then_killed_mid_call(pki, tmp_path):
    """A real `gpuscope analyzer` per mode. Stopped (SIGSTOP), it accepts TCP
    in the kernel and answers nothing: the deadline names the wait and the
    likely causes. Killed while a call waits on it: it reset the connection
    and nothing listens any more, whatever TLS the client spoke."""
    procs = {}
    for mode, flags, security in (("plain", ["--insecure"], INSECURE),
                                  ("mtls", ["--tls-dir", str(pki)], _rita(pki))):
        port = free_port()
        target = f"localhost:{port}" if mode == "mtls" else f"127.0.0.1:{port}"
        proc = subprocess.Popen([*CLI, "--log-level", "warning", "analyzer", "--engine", "thread",
                                 "--db", str(tmp_path / f"{mode}.duckdb"), "--listen", f"127.0.0.1:{port}", *flags],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs[mode] = proc, target, security
    try:
        for proc, target, security in procs.values():
            wait_for(lambda: _answers(target, security), timeout=60, step=0.2)
        for mode, (proc, target, security) in procs.items():
            proc.send_signal(signal.SIGSTOP)
            said = _status_error(target, security, timeout=1)
            assert said.startswith(f"the analyzer at {target} did not answer within 1 s: it is overloaded, or its "
                                   "process is stopped"), said
            errors = []
            waiting = threading.Thread(target=lambda: errors.append(_status_error(target, security)))
            waiting.start()
            threading.Timer(0.5, proc.kill).start()
            waiting.join(20)
            proc.wait(20)
            assert errors and errors[0].startswith(f"cannot reach {target}: it reset the connection and now "
                                                   "refuses new ones"), (mode, errors)
            assert "is `gpuscope analyzer` or `gpuscope up` running there?" in errors[0]
            assert "TLS" not in errors[0] and "certificate" not in errors[0]
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def _answers(target: str, security: ClientSecurity) -> bool:
    try:
        clients._call(target, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(),
                                                                                          timeout=t),
                      timeout=2, security=security)
        return True
    except clients.ClientError:
        return False


def test_a_server_killed_while_it_works_on_the_call_lost_the_connection(tmp_path):
    """The connection was up and the call under way when the process died
    (kill -9): gRPC says "Stream removed", which no handshake refusal says."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import sys, time, grpc
        from concurrent import futures
        class Slow(grpc.GenericRpcHandler):
            def service(self, details):
                return grpc.unary_unary_rpc_method_handler(lambda request, context: time.sleep(60))
        server = grpc.server(futures.ThreadPoolExecutor(2))
        server.add_generic_rpc_handlers([Slow()])
        server.add_insecure_port(sys.argv[1])
        server.start()
        print("serving", flush=True)
        server.wait_for_termination()
    """))
    target = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, str(script), target], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "serving"
        threading.Timer(1.0, proc.kill).start()
        with pytest.raises(clients.ClientError) as info:
            clients._call(target, lambda ch, t: ch.unary_unary("/x.Y/Z")(b"", timeout=t), security=INSECURE)
        said = str(info.value)
        assert said.startswith(f"lost the connection to {target} in the middle of the call (Stream removed"), said
        assert "the analyzer there stopped or restarted; is `gpuscope analyzer` or `gpuscope up` running" in said
    finally:
        proc.kill()
        proc.wait()
