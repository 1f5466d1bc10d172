"""TLS, certificates, callers and roles, over real gRPC handshakes on loopback:
certificates made by security.certs, servers with security.tls credentials,
and callers named by security.auth from what the handler sees."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
import structlog
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuscope.collectors.records import GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.cli import main
from gpuscope.daemon.cliutil import UsageError
from gpuscope.daemon.security_flags import agent_security, client_security, server_tls_files, server_tokens
from gpuscope.daemon.uplink import Uplink, UplinkConfig
from gpuscope.security import certs
from gpuscope.security.auth import (METHOD_ROLES, OPERATOR_ACTIONS, Caller, TokenFileError, TokenStore, add_token,
                                    audit, authorize, authorize_host, caller_from, sees_full_commands, token_hash)
from gpuscope.security.tls import (INSECURE, ClientSecurity, TlsConfigError, TlsFiles, explain_failure, is_loopback,
                                   server_credentials, tls_files)
from gpuscope.v1 import agent_pb2, agent_pb2_grpc, analyzer_pb2, analyzer_pb2_grpc, samples_pb2 as pb
from tests.conftest import free_port
from tests.helpers import generic_servers

METHOD = "/gpuscope.v1.Analyzer/GetStatus"


# -- a PKI for the whole module ---------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca = root / "ca"
    certs.create_ca(ca)
    certs.issue_server(ca)                                        # localhost, 127.0.0.1, ::1, this host
    certs.issue_agent(ca, "gpu-host-7", out=root / "agent")
    certs.issue_client(ca, "rita", "reader", out=root / "reader")
    certs.issue_client(ca, "oscar", "operator", out=root / "operator")
    other = root / "other"
    certs.create_ca(other, common_name="someone else's CA")
    certs.issue_client(other, "mallory", "operator")
    tokens = root / "tokens"
    token = add_token(tokens, "alice", "operator")
    reader_token = add_token(tokens, "bob", "reader")
    return dict(root=root, ca=ca, agent=root / "agent", reader=root / "reader", operator=root / "operator",
                other=other, tokens=tokens, token=token, reader_token=reader_token)


def _client(d, token=None, **kw) -> ClientSecurity:
    return ClientSecurity(ca=str(d / "ca.pem"), cert=str(d / "client.pem" if (d / "client.pem").exists() else
                                                         d / "agent.pem"),
                          key=str(d / "client.key" if (d / "client.key").exists() else d / "agent.key"),
                          token=token, **kw)


class _Recorder(grpc.GenericRpcHandler):
    """Answers any method with what the server knows of its caller."""

    def __init__(self, tokens):
        self.tokens = tokens

    def service(self, details):
        def handle(request, context):
            caller = caller_from(context.auth_context(), context.invocation_metadata(), self.tokens)
            denied = authorize(details.method, caller)
            return json.dumps(dict(caller=caller.__dict__ if caller else None,
                                   denied=[denied[0].name, denied[1]] if denied else None)).encode()
        return grpc.unary_unary_rpc_method_handler(handle)


@pytest.fixture(scope="module")
def servers(pki):
    """mtls: client certificates required; tls: server-authenticated only (tokens); plain: no TLS."""
    tokens = TokenStore.load(pki["tokens"])
    out, stop = generic_servers(_Recorder(tokens), {
        "mtls": server_credentials(tls_files(pki["ca"], "analyzer")),
        "tls": server_credentials(tls_files(pki["ca"], "analyzer"), require_client_cert=False), "plain": None},
        workers=4)
    yield out
    stop()


def _ask(target: str, security: ClientSecurity, method: str = METHOD) -> dict:
    with security.channel(target) as ch:
        return json.loads(ch.unary_unary(method)(b"", timeout=5))


# -- who is calling, over real handshakes ---------------------------------------------------------

def test_agent_certificate_names_an_agent_for_its_host(pki, servers):
    got = _ask(servers["mtls"], _client(pki["agent"]), "/gpuscope.v1.Analyzer/Ingest")
    assert got["caller"] == dict(name="gpu-host-7", role="agent", host="gpu-host-7", via="cert")
    assert got["denied"] is None
    denied = _ask(servers["mtls"], _client(pki["agent"]), "/gpuscope.v1.Analyzer/ListFindings")["denied"]
    assert denied[0] == "PERMISSION_DENIED" and "agent" in denied[1]


def test_reader_certificate_reads_but_may_not_capture(pki, servers):
    got = _ask(servers["mtls"], _client(pki["reader"]))
    assert got["caller"] == dict(name="rita", role="reader", host=None, via="cert") and got["denied"] is None
    denied = _ask(servers["mtls"], _client(pki["reader"]), "/gpuscope.v1.Agent/Capture")["denied"]
    assert denied[0] == "PERMISSION_DENIED" and "operator" in denied[1]


def test_operator_token_over_tls(pki, servers):
    sec = ClientSecurity(ca=str(pki["ca"] / "ca.pem"), token=pki["token"])
    got = _ask(servers["tls"], sec, "/gpuscope.v1.Agent/Capture")
    assert got["caller"] == dict(name="alice", role="operator", host=None, via="token") and got["denied"] is None


def test_token_decides_over_certificate_and_a_bad_token_is_refused(pki, servers):
    got = _ask(servers["mtls"], _client(pki["reader"], token=pki["token"]))
    assert got["caller"]["name"] == "alice" and got["caller"]["role"] == "operator"
    got = _ask(servers["mtls"], _client(pki["operator"], token="gps_not-a-token"))
    assert got["caller"] is None and got["denied"][0] == "UNAUTHENTICATED"


def test_no_credentials_is_no_caller(pki, servers):
    got = _ask(servers["tls"], ClientSecurity(ca=str(pki["ca"] / "ca.pem")))
    assert got["caller"] is None and got["denied"][0] == "UNAUTHENTICATED"
    assert "client certificate or a bearer token" in got["denied"][1]


def test_asyncio_channel_carries_the_token(pki, servers):
    async def ask():
        async with ClientSecurity(ca=str(pki["ca"] / "ca.pem"), token=pki["reader_token"]).aio_channel(
                servers["tls"]) as ch:
            return json.loads(await ch.unary_unary(METHOD)(b"", timeout=5))
    assert asyncio.run(ask())["caller"] == dict(name="bob", role="reader", host=None, via="token")


def test_plain_text_authenticates_no_one(servers):
    with grpc.insecure_channel(servers["plain"]) as ch:     # a token sent in clear by hand is void
        got = json.loads(ch.unary_unary(METHOD)(b"", timeout=5, metadata=(("authorization", "Bearer x"),)))
    assert got["caller"] is None


def _failure(target, security) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _ask(target, security)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    return info.value


def test_certificate_of_another_ca_fails_the_handshake(pki, servers):
    other = ClientSecurity(ca=str(pki["ca"] / "ca.pem"), cert=str(pki["other"] / "client.pem"),
                           key=str(pki["other"] / "client.key"))
    exc = _failure(servers["mtls"], other)
    assert "refused the client certificate" in explain_failure(exc, servers["mtls"], other)
    no_cert = ClientSecurity(ca=str(pki["ca"] / "ca.pem"))
    exc = _failure(servers["mtls"], no_cert)
    assert "requires a client certificate" in explain_failure(exc, servers["mtls"], no_cert)


def test_server_of_another_ca_is_not_trusted(pki, servers):
    sec = ClientSecurity(ca=str(pki["other"] / "ca.pem"), cert=str(pki["operator"] / "client.pem"),
                         key=str(pki["operator"] / "client.key"))
    exc = _failure(servers["mtls"], sec)
    assert "not signed by the CA this client trusts" in explain_failure(exc, servers["mtls"], sec)


def test_server_name_must_match_unless_overridden(pki, servers):
    wrong = _client(pki["operator"], server_name="analyzer.elsewhere")
    exc = _failure(servers["mtls"], wrong)
    assert "--tls-server-name" in explain_failure(exc, servers["mtls"], wrong)
    assert _ask(servers["mtls"], _client(pki["operator"], server_name="localhost"))["caller"]["role"] == "operator"


def test_tls_client_to_plain_server_and_back(pki, servers):
    sec = _client(pki["operator"])
    exc = _failure(servers["plain"], sec)
    assert "does not speak TLS" in explain_failure(exc, servers["plain"], sec)
    exc = _failure(servers["mtls"], INSECURE)
    assert "drop --insecure" in explain_failure(exc, servers["mtls"], INSECURE)


def test_token_is_never_sent_in_clear():
    with pytest.raises(TlsConfigError, match="without TLS"):
        ClientSecurity(insecure=True, token="gps_x")
    with pytest.raises(TlsConfigError, match="--insecure cannot be combined"):
        ClientSecurity(insecure=True, ca="/x/ca.pem")
    with pytest.raises(TlsConfigError, match="--cert with --key"):
        ClientSecurity(cert="/x/c.pem")
    assert "gps_secret" not in repr(ClientSecurity(token="gps_secret"))


# -- the method table ---------------------------------------------------------------------------------

def test_every_rpc_of_our_services_has_roles():
    methods = {f"/gpuscope.v1.{svc.name}/{m.name}"
               for mod in (agent_pb2, analyzer_pb2) for svc in mod.DESCRIPTOR.services_by_name.values()
               for m in svc.methods}
    assert methods == set(METHOD_ROLES)


AGENT = Caller("h1", "agent", "h1", "cert")
READER = Caller("rita", "reader", None, "cert")
OPERATOR = Caller("alice", "operator", None, "token")


@pytest.mark.parametrize("method,allowed", [
    ("/gpuscope.v1.Analyzer/Ingest", {"agent"}),
    ("/gpuscope.v1.Analyzer/Push", {"agent"}),
    ("/gpuscope.v1.Analyzer/Commands", {"agent"}),
    ("/gpuscope.v1.Analyzer/ReportCapture", {"agent"}),
    ("/gpuscope.v1.Analyzer/UploadCapture", {"agent"}),
    ("/gpuscope.v1.Analyzer/ReportCalibration", {"agent"}),
    ("/gpuscope.v1.Analyzer/ListCeilings", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/ListPrograms", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/ListDistJobs", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/JobSkew", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/CaptureJob", {"operator"}),
    ("/gpuscope.v1.Analyzer/GetStatus", {"agent", "reader", "operator"}),
    ("/gpuscope.v1.Analyzer/ListFindings", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/QueryMetric", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/ListCaptures", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/Watch", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/ListRecords", {"reader", "operator"}),
    ("/gpuscope.v1.Analyzer/Report", {"reader", "operator"}),
    ("/gpuscope.v1.Agent/GetStatus", {"reader", "operator"}),
    ("/gpuscope.v1.Agent/RecentSamples", {"reader", "operator"}),
    ("/gpuscope.v1.Agent/ListCaptures", {"reader", "operator"}),
    ("/gpuscope.v1.Agent/Capture", {"operator"}),
    ("/gpuscope.v1.Agent/ListJobs", {"operator"}),
])
def test_authorize_by_role(method, allowed):
    for caller in (AGENT, READER, OPERATOR):
        result = authorize(method, caller)
        if caller.role in allowed:
            assert result is None, (method, caller)
        else:
            assert result[0] == grpc.StatusCode.PERMISSION_DENIED and caller.name in result[1]
    code, message = authorize(method, None)
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_authorize_fails_closed_and_leaves_health_open():
    for method in ("/gpuscope.v1.Analyzer/DropEverything", "/gpuscope.v2.Analyzer/Ingest", "/x/y", ""):
        assert authorize(method, OPERATOR)[0] == grpc.StatusCode.PERMISSION_DENIED
    assert authorize("/grpc.health.v1.Health/Check", None) is None
    assert authorize("/grpc.health.v1.Health/Watch", None) is None
    assert OPERATOR_ACTIONS == {"/gpuscope.v1.Agent/Capture", "/gpuscope.v1.Agent/ListJobs",
                                "/gpuscope.v1.Analyzer/CaptureJob"}


def test_agents_speak_only_for_their_own_host():
    assert authorize_host(AGENT, "h1") is None
    assert authorize_host(AGENT, "h2")[0] == grpc.StatusCode.PERMISSION_DENIED
    assert authorize_host(OPERATOR, "h1")[0] == grpc.StatusCode.PERMISSION_DENIED
    assert authorize_host(None, "h1")[0] == grpc.StatusCode.UNAUTHENTICATED
    assert sees_full_commands(OPERATOR) and not sees_full_commands(READER) and not sees_full_commands(None)


def test_caller_from_plain_dicts_caches_and_ignores_roleless_certs(pki):
    pem = (pki["agent"] / "agent.pem").read_bytes()
    ctx = {"transport_security_type": [b"ssl"], "x509_pem_cert": [pem], "x509_common_name": [b"gpu-host-7"]}
    assert caller_from(ctx, (), None) == Caller("gpu-host-7", "agent", "gpu-host-7", "cert")
    assert caller_from(ctx, (), None) is not None
    server_pem = (pki["ca"] / "analyzer.pem").read_bytes()      # OU=server is no caller role
    assert caller_from({"transport_security_type": [b"ssl"], "x509_pem_cert": [server_pem]}, (), None) is None
    assert caller_from({"transport_security_type": [b"insecure"], "x509_pem_cert": [pem]}, (), None) is None
    assert caller_from({"transport_security_type": [b"ssl"]}, (("authorization", "Basic eDp5"),),
                       TokenStore.load(pki["tokens"])) is None


def test_audit_is_one_structured_line():
    with structlog.testing.capture_logs() as logs:
        audit(OPERATOR, "/gpuscope.v1.Agent/Capture", {"pid": 42, "method": "shadowed"})
    assert logs == [dict(event="audit", log_level="info", logger="gpuscope.audit", method="/gpuscope.v1.Agent/Capture",
                         outcome="ok",
                         caller="alice", role="operator", caller_host=None, via="token", pid=42,
                         detail_method="shadowed")]


# -- tokens file -------------------------------------------------------------------------------------

def test_tokens_file_keeps_hashes_and_is_private(tmp_path):
    path = tmp_path / "sub" / "tokens"
    token = add_token(path, "alice", "operator")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in path.read_text() and token_hash(token) in path.read_text()
    store = TokenStore.load(path)
    assert store.lookup(token) == Caller("alice", "operator", None, "token")
    assert store.lookup(token + "x") is None and store.lookup("") is None
    os.chmod(path, 0o640)
    with pytest.raises(TokenFileError, match="chmod 600"):
        TokenStore.load(path)
    with pytest.raises(TokenFileError, match="chmod 600"):
        add_token(path, "bob", "reader")


@pytest.mark.parametrize("line,message", [
    ("gps_plaintexttoken reader bob", "not a SHA-256"),
    (f"{'a' * 64} admin bob", "role 'admin'"),
    (f"{'a' * 64} reader", "SHA256HEX ROLE NAME"),
])
def test_tokens_file_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "tokens"
    path.write_text(f"# ok\n\n{'b' * 64} operator carol with spaces\n{line}\n")
    os.chmod(path, 0o600)
    with pytest.raises(TokenFileError, match=message) as info:
        TokenStore.load(path)
    assert f"{path}:4" in str(info.value)


def test_tokens_file_names_may_have_spaces(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{token_hash('t1')} reader carol the on-call\n")
    os.chmod(path, 0o600)
    assert TokenStore.load(path).lookup("t1").name == "carol the on-call"
    with pytest.raises(TokenFileError, match="no such file"):
        TokenStore.load(tmp_path / "missing")


# -- certificates --------------------------------------------------------------------------------------

def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certificates_carry_host_role_and_names(pki):
    agent = _cert(pki["agent"] / "agent.pem")
    assert agent.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-host-7"
    assert agent.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "agent"
    sans = agent.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName)[0] == "gpu-host-7"
    eku = agent.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    server = _cert(pki["ca"] / "analyzer.pem")
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(i) for i in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    ca = _cert(pki["ca"] / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert 364 <= (ca.not_valid_after_utc - ca.not_valid_before_utc).days <= 366
    assert (pki["agent"] / "ca.pem").read_bytes() == (pki["ca"] / "ca.pem").read_bytes()   # ready to copy


def test_keys_are_private_and_never_overwritten(tmp_path):
    d = tmp_path / "pki"
    certs.create_ca(d)
    certs.issue_client(d, "rita", "reader")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for key in ("ca.key", "client.key"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600
    before = (d / "client.key").read_bytes()
    with pytest.raises(certs.CertError, match="--force"):
        certs.issue_client(d, "rita", "operator")
    with pytest.raises(certs.CertError, match="--force"):
        certs.create_ca(d)
    assert (d / "client.key").read_bytes() == before
    certs.issue_client(d, "rita", "operator", force=True)
    assert (d / "client.key").read_bytes() != before
    with pytest.raises(certs.CertError, match="expected one of"):
        certs.issue_client(d, "x", "admin")
    with pytest.raises(certs.CertError, match="gpuscope certs init"):
        certs.issue_agent(tmp_path / "nothing", "h1")


def test_ensure_local_pki_is_idempotent_and_follows_the_host(tmp_path):
    d = tmp_path / "state" / "tls"
    first = certs.ensure_local_pki(d, "h1")
    assert first["created"] == ["ca.pem", "analyzer.pem", "agent.pem", "client.pem"]
    stamp = {p.name: p.read_bytes() for p in d.iterdir()}
    assert certs.ensure_local_pki(d, "h1")["created"] == []
    assert {p.name: p.read_bytes() for p in d.iterdir()} == stamp
    assert certs.ensure_local_pki(d, "h2")["created"] == ["agent.pem"]
    assert _cert(d / "agent.pem").subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "h2"
    client = _cert(d / "client.pem").subject
    assert client.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "operator"


def test_tls_files_name_the_missing_file_and_the_command(tmp_path):
    d = tmp_path / "tls"
    d.mkdir()
    with pytest.raises(TlsConfigError, match=r"ca\.pem: no such file; make it with `gpuscope certs init"):
        tls_files(d, "analyzer")
    certs.create_ca(d)
    with pytest.raises(TlsConfigError, match=r"agent\.pem: no such file; make it with `gpuscope certs agent"):
        tls_files(d, "agent")
    certs.issue_agent(d, "h1")
    files = tls_files(d, "agent")
    assert files == TlsFiles(d / "ca.pem", d / "agent.pem", d / "agent.key")
    wrong = TlsFiles(d / "ca.pem", d / "agent.pem", d / "ca.key")
    with pytest.raises(TlsConfigError, match="is not the key of"):
        server_credentials(wrong)
    assert tls_files(None, "x", ca=d / "ca.pem", cert=d / "agent.pem", key=d / "agent.key") == files


def test_openssl_made_certificates_work_too(tmp_path):
    """The docs' openssl recipe: the same layout, usable by the same code."""
    sh = (tmp_path / "make.sh")
    sh.write_text(OPENSSL_RECIPE)
    r = subprocess.run(["bash", str(sh)], cwd=tmp_path, capture_output=True, text=True)
    if r.returncode == 127 or "openssl: command not found" in r.stderr:
        pytest.skip("no openssl here")
    assert r.returncode == 0, r.stderr
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers([_Recorder(None)])
    port = server.add_secure_port("127.0.0.1:0", server_credentials(tls_files(tmp_path, "analyzer")))
    server.start()
    try:
        got = _ask(f"127.0.0.1:{port}", ClientSecurity(ca=str(tmp_path / "ca.pem"), cert=str(tmp_path / "agent.pem"),
                                                       key=str(tmp_path / "agent.key")))
        assert got["caller"] == dict(name="gpu-host-7", role="agent", host="gpu-host-7", via="cert")
    finally:
        server.stop(0)


# The same commands as docs/security.md ("Without gpuscope certs").
OPENSSL_RECIPE = r"""set -eu
umask 077
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days 365 -subj "/O=gpuscope/OU=ca/CN=gpuscope CA" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem
sign() {  # NAME SUBJECT EXTENSIONS
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 -sha256 -extfile "$1.ext" -out "$1.pem"
  rm "$1.csr" "$1.ext"
}
sign analyzer "/O=gpuscope/OU=server/CN=localhost" \
  "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth"
sign agent "/O=gpuscope/OU=agent/CN=gpu-host-7" \
  "subjectAltName=DNS:gpu-host-7,DNS:localhost,IP:127.0.0.1
extendedKeyUsage=clientAuth,serverAuth"
sign client "/O=gpuscope/OU=operator/CN=alice" "extendedKeyUsage=clientAuth"
chmod 644 ca.pem analyzer.pem agent.pem client.pem
"""


# -- the command line --------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _logs_untouched(monkeypatch):
    """main() in process must not point structlog at pytest's captured
    stderr, which is closed after the test (later log lines would fail)."""
    monkeypatch.setattr("gpuscope.daemon.logs.configure", lambda *a, **k: None)


def test_certs_command_line_end_to_end(tmp_path, capsys):
    d = tmp_path / "pki"
    r = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "certs", "init", str(d), "--name",
                        "analyzer.example", "--ip", "10.0.0.5", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [i["kind"] for i in out["issued"]] == ["ca", "analyzer"]
    assert out["issued"][1]["dns"] == ["analyzer.example"] and out["issued"][1]["ips"] == ["10.0.0.5"]

    assert main(["certs", "agent", str(d), "--host", "gpu-host-7", "--out", str(d / "gpu-host-7"), "--json"]) == 0
    agent = json.loads(capsys.readouterr().out)
    assert agent["common_name"] == "gpu-host-7" and agent["role"] == "agent"
    assert sorted(p.name for p in (d / "gpu-host-7").iterdir()) == ["agent.key", "agent.pem", "ca.pem"]

    assert main(["certs", "client", str(d), "--name", "rita", "--role", "reader"]) == 0
    assert "reader rita" in capsys.readouterr().out
    assert main(["certs", "client", str(d), "--name", "rita", "--role", "operator"]) == 1
    assert "--force" in capsys.readouterr().err

    tokens = tmp_path / "tokens"
    assert main(["certs", "token", "--tokens", str(tokens), "--name", "alice", "--role", "operator"]) == 0
    token = capsys.readouterr().out.strip()
    assert TokenStore.load(tokens).lookup(token).name == "alice"
    assert main(["certs", "token", "--tokens", str(tokens), "--name", "bob", "--role", "reader", "--json"]) == 0
    assert TokenStore.load(tokens).lookup(json.loads(capsys.readouterr().out)["token"]).role == "reader"

    assert main(["certs", "init", str(d)]) == 1          # the analyzer key exists: kept
    assert "analyzer.key exists" in capsys.readouterr().err


def _ns(argv: list[str]) -> argparse.Namespace:
    from gpuscope.daemon.cli import build_parser
    return build_parser().parse_args(argv)


def test_client_flags_resolve_to_client_security(pki, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSCOPE_TLS_DIR", raising=False)
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))        # no default tls/ there
    sec = client_security(_ns(["status", "--server", "h:9403", "--tls-dir", str(pki["operator"])]))
    assert sec.mode == "mtls" and sec.cert.endswith("client.pem") and sec.ca.endswith("ca.pem")
    monkeypatch.setenv("GPUSCOPE_TLS_DIR", str(pki["ca"]))               # a CA dir with no client.pem
    assert client_security(_ns(["findings", "--server", "h:9403"])).mode == "tls"
    monkeypatch.delenv("GPUSCOPE_TLS_DIR")
    # nothing configured: TLS with the system's CAs, even to loopback; plain text only with --insecure
    for server in ("127.0.0.1:9403", "analyzer.example:9403"):
        sec = client_security(_ns(["status", "--server", server]))
        assert not sec.insecure and sec.ca is None and sec.cert is None
    assert client_security(_ns(["status", "--server", "127.0.0.1:9403", "--insecure"])).insecure
    # the default state dir's tls/, as `gpuscope up` provisions it
    certs.ensure_local_pki(tmp_path / "state" / "gpuscope" / "tls", "h1")
    assert client_security(_ns(["status", "--server", "127.0.0.1:9403"])).mode == "mtls"
    # tokens
    token_file = tmp_path / "token"
    token_file.write_text(pki["token"] + "\n")
    os.chmod(token_file, 0o600)
    sec = client_security(_ns(["jobs", "--server", "h:9401", "--token-file", str(token_file),
                               "--tls-server-name", "gpu-host-7"]))
    assert sec.token == pki["token"] and sec.server_name == "gpu-host-7"
    os.chmod(token_file, 0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        client_security(_ns(["jobs", "--server", "h:9401", "--token-file", str(token_file)]))
    monkeypatch.setenv("GPUSCOPE_TOKEN", "gps_from_env")
    with pytest.raises(UsageError, match="plain text"):
        client_security(_ns(["status", "--server", "127.0.0.1:9403", "--insecure"]))
    monkeypatch.delenv("GPUSCOPE_TOKEN")
    with pytest.raises(UsageError, match="--insecure cannot be combined with --ca"):
        client_security(_ns(["status", "--server", "127.0.0.1:9403", "--insecure", "--ca", "x"]))
    with pytest.raises(UsageError, match="no such directory"):
        client_security(_ns(["status", "--server", "h:1", "--tls-dir", str(tmp_path / "nope")]))


def test_server_flags_resolve_files_tokens_and_agent_links(pki, tmp_path):
    ns = _ns(["analyzer", "--tls-dir", str(pki["ca"]), "--tokens", str(pki["tokens"])])
    assert ns.listen == "127.0.0.1:9403"
    assert server_tls_files(ns, "analyzer").cert == pki["ca"] / "analyzer.pem"
    assert len(server_tokens(ns)) == 2
    with pytest.raises(UsageError, match="needs TLS"):
        server_tls_files(_ns(["analyzer"]), "analyzer")
    assert server_tls_files(_ns(["analyzer", "--insecure"]), "analyzer") is None
    with pytest.raises(UsageError, match="--tokens needs TLS"):
        server_tokens(_ns(["analyzer", "--insecure", "--tokens", str(pki["tokens"])]))
    agent = agent_security(_ns(["agent", "--analyzer", "a:9403", "--tls-dir", str(pki["agent"]),
                                "--tls-server-name", "analyzer.example"]))
    assert agent.mode == "mtls" and agent.cert.endswith("agent.pem") and agent.server_name == "analyzer.example"
    up = _ns(["up", "--db", str(tmp_path / "db" / "x.duckdb")])
    with pytest.raises(TlsConfigError, match=str(tmp_path / "db" / "tls")):
        server_tls_files(up, "analyzer")           # `up` provisions it (certs.ensure_local_pki) before this
    certs.ensure_local_pki(tmp_path / "db" / "tls", "h1")
    assert server_tls_files(up, "analyzer").cert == tmp_path / "db" / "tls" / "analyzer.pem"
    assert agent_security(up, server_name="localhost").cert.endswith("agent.pem")
    assert is_loopback("127.0.0.1:9403") and is_loopback("[::1]:1") and is_loopback("localhost:9")
    assert not is_loopback("0.0.0.0:9403") and not is_loopback("[::]:9403") and not is_loopback("10.0.0.5:1")


# -- clients against real TLS servers with roles --------------------------------------------------------

class _Guard(grpc.ServerInterceptor):
    """What the real servers do (daemon/serve.py): authenticate, authorize."""

    def __init__(self, tokens):
        self.tokens = tokens

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def guarded(request, context):
            caller = caller_from(context.auth_context(), context.invocation_metadata(), self.tokens)
            denied = authorize(details.method, caller)
            if denied:
                context.abort(*denied)
            return inner(request, context)
        return handler._replace(unary_unary=guarded)


class _Analyzer(analyzer_pb2_grpc.AnalyzerServicer):
    def GetStatus(self, request, context):
        return analyzer_pb2.AnalyzerStatus(version="test", hosts=3)


class _Agent(agent_pb2_grpc.AgentServicer):
    def ListJobs(self, request, context):
        return agent_pb2.ListJobsReply(jobs=[agent_pb2.Job(pid=7, command="python train.py")])


@pytest.fixture(scope="module")
def guarded(pki):
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[_Guard(TokenStore.load(pki["tokens"]))])
    analyzer_pb2_grpc.add_AnalyzerServicer_to_server(_Analyzer(), server)
    agent_pb2_grpc.add_AgentServicer_to_server(_Agent(), server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(tls_files(pki["ca"], "analyzer")))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_clients_get_one_line_errors_that_name_the_fix(pki, guarded):
    ca = str(pki["ca"] / "ca.pem")
    assert clients.status(guarded, security=_client(pki["reader"]))["hosts"] == 3
    assert clients.jobs(guarded, security=_client(pki["operator"]))[0]["command"] == "python train.py"
    with pytest.raises(clients.ClientError, match="refused this call: rita has role reader.*--role operator"):
        clients.jobs(guarded, security=_client(pki["reader"]))
    with pytest.raises(clients.ClientError, match=r"gpu-host-7 has role agent; \S+ListFindings needs operator or "
                                                  r"reader \(a reader certificate .*--role reader`\)"):
        clients.findings(guarded, security=_client(pki["agent"]))
    with pytest.raises(clients.ClientError, match=r"rita has role reader; \S+ReportCalibration needs agent \(only a "
                                                  r"GPU host's agent certificate .*`gpuscope certs agent"):
        clients.report_calibration(guarded, "gpu-host-7", {}, security=_client(pki["reader"]))
    with pytest.raises(clients.ClientError, match="requires a client certificate"):
        clients.status(guarded, security=ClientSecurity(ca=ca))
    with pytest.raises(clients.ClientError, match="drop --insecure"):
        clients.status(guarded, security=INSECURE)
    with pytest.raises(clients.ClientError, match="cannot reach 127.0.0.1:1"):
        clients.status("127.0.0.1:1", security=_client(pki["reader"]))


def test_status_command_over_mutual_tls(pki, guarded, capsys, monkeypatch):
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)
    assert main(["status", "--server", guarded, "--tls-dir", str(pki["reader"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"] == 3
    assert main(["jobs", "--server", guarded, "--tls-dir", str(pki["reader"])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PERMISSION" not in err and "operator" in err


# -- the uplink over mutual TLS, and its last_error after a reconnect -----------------------------------

class _Ingest(analyzer_pb2_grpc.AnalyzerServicer):
    def __init__(self):
        self.hosts = []

    def Ingest(self, request_iterator, context):
        caller = caller_from(context.auth_context(), context.invocation_metadata(), None)
        for batch in request_iterator:
            denied = authorize_host(caller, batch.host)
            if denied:
                context.abort(*denied)
            self.hosts.append(batch.host)
            yield pb.BatchAck(seq=batch.seq, status=pb.BatchAck.COMMITTED)


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {predicate}")


def test_uplink_over_mutual_tls_clears_its_error_once_acked(pki):
    port = free_port()
    security = agent_security(_ns(["agent", "--tls-dir", str(pki["agent"])]))
    up = Uplink(UplinkConfig(target=f"localhost:{port}", flush_interval_s=0.05, backoff_initial_s=0.05,
                             backoff_max_s=0.2), "gpu-host-7", "boot", lambda: [], security=security)
    up.start()
    server = None
    try:
        up.submit([GpuSample(gpu=0, t=time.time(), values={"util_gpu_ratio": 0.5})])
        _wait(lambda: up.stats()["last_error"])
        assert "UNAVAILABLE" in up.stats()["last_error"] and not up.stats()["connected"]
        ingest = _Ingest()
        server = grpc.server(futures.ThreadPoolExecutor(4))
        analyzer_pb2_grpc.add_AnalyzerServicer_to_server(ingest, server)
        server.add_secure_port(f"127.0.0.1:{port}", server_credentials(tls_files(pki["ca"], "analyzer")))
        server.start()
        _wait(lambda: up.stats()["batches_acked"] >= 1)
        assert up.stats()["last_error"] == "" and ingest.hosts == ["gpu-host-7"]
    finally:
        up.stop(drain_s=0.2)
        if server is not None:
            server.stop(0)


def test_uplink_for_another_host_is_refused_with_the_reason(pki):
    ingest = _Ingest()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    analyzer_pb2_grpc.add_AnalyzerServicer_to_server(ingest, server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(tls_files(pki["ca"], "analyzer")))
    server.start()
    up = Uplink(UplinkConfig(target=f"127.0.0.1:{port}", flush_interval_s=0.05, backoff_initial_s=0.05,
                             backoff_max_s=0.2), "h2", "boot", lambda: [], security=_client(pki["agent"]))
    up.start()
    try:
        up.submit([GpuSample(gpu=0, t=time.time(), values={"util_gpu_ratio": 0.5})])
        _wait(lambda: "may not speak for host" in up.stats()["last_error"])
        assert ingest.hosts == [] and up.stats()["batches_acked"] == 0
    finally:
        up.stop(drain_s=0.1)
        server.stop(0)
