"""Bearer tokens alone, as an on-call engineer uses them: `gpuscope certs`,
an analyzer with --tokens and --oncall-listen, and `gpuscope status`, all
as real processes."""
import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import free_port

CLI = [sys.executable, "-m", "gpuscope.daemon.cli"]


def _run(*args, env=None, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_a_token_alone_reads_on_the_oncall_port_and_nothing_else_gets_in(tmp_path):
    tls, tokens = tmp_path / "tls", tmp_path / "tokens"
    assert _run("certs", "init", str(tls)).returncode == 0
    made = _run("certs", "token", "--tokens", str(tokens), "--name", "alice", "--role", "reader", "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    token_file = tmp_path / "alice.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    port, oncall = free_port(), free_port()
    server = subprocess.Popen([*CLI, "--log-level", "warning", "analyzer", "--db", str(tmp_path / "t.duckdb"),
                               "--listen", f"127.0.0.1:{port}", "--tls-dir", str(tls), "--tokens", str(tokens),
                               "--oncall-listen", f"127.0.0.1:{oncall}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    env = dict(os.environ, GPUSCOPE_TLS_DIR="")
    try:
        ca = ["--ca", str(tls / "ca.pem")]
        deadline = time.monotonic() + 30
        while True:                                     # until it listens
            ok = _run("status", "--server", f"localhost:{oncall}", *ca, "--token-file", str(token_file), "--json",
                      env=env)
            if ok.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["kind"] == "analyzer"
        no_token = _run("status", "--server", f"localhost:{oncall}", *ca, env=env)
        assert no_token.returncode != 0 and "requires a client certificate or token" in no_token.stderr
        bad = tmp_path / "bad.token"
        bad.write_text("gps_not-a-token")
        bad.chmod(0o600)
        wrong = _run("status", "--server", f"localhost:{oncall}", *ca, "--token-file", str(bad), env=env)
        assert wrong.returncode != 0
        # the main port wants a client certificate: a token alone does not get through the handshake
        main = _run("status", "--server", f"localhost:{port}", *ca, "--token-file", str(token_file), env=env)
        assert main.returncode != 0
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=20)
    assert server.returncode == 0, err[-2000:]


def test_a_busy_or_shared_token_port_is_refused_before_anything_starts(tmp_path):
    import socket
    tls, tokens = tmp_path / "tls", tmp_path / "tokens"
    assert _run("certs", "init", str(tls)).returncode == 0
    assert _run("certs", "token", "--tokens", str(tokens), "--name", "a", "--role", "reader").returncode == 0
    port, busy = free_port(), free_port()
    base = ["analyzer", "--db", str(tmp_path / "t.duckdb"), "--listen", f"127.0.0.1:{port}", "--tls-dir", str(tls),
            "--tokens", str(tokens), "--duration", "5s"]
    holder = socket.socket()
    holder.bind(("127.0.0.1", busy))
    holder.listen()
    try:
        r = _run(*base, "--oncall-listen", f"127.0.0.1:{busy}")
    finally:
        holder.close()
    assert r.returncode != 0 and f"127.0.0.1:{busy}" in r.stderr and "--oncall-listen" in r.stderr, r.stderr
    r = _run(*base, "--oncall-listen", f"0.0.0.0:{port}")
    assert r.returncode != 0 and "is the port of --listen" in r.stderr, r.stderr
    assert not (tmp_path / "t.duckdb").exists()          # refused before the DB was opened
