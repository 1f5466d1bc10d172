"""An analyzer killed with kill -9 under agents that had been talking to it
over mutual TLS: the agents say it went away, not that it refused their
certificate (found in a trial: every agent logged a certificate error at
level error). A certificate of another CA is still named as the cause."""
import signal
import subprocess
import sys
import time

from structlog.testing import capture_logs

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.commands import CommandListener
from gpuscope.daemon.uplink import Uplink, UplinkConfig
from gpuscope.security import certs
from gpuscope.security.tls import ClientSecurity
from tests.conftest import free_port
from tests.helpers import wait_for

CLI = [sys.executable, "-m", "gpuscope.daemon.cli"]


def _agent(pki, who, target):
    sec = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / who / "agent.pem"), key=str(pki / who / "agent.key"))
    up = Uplink(UplinkConfig(target=target, flush_interval_s=0.1, backoff_initial_s=0.1, backoff_max_s=0.3), "h1",
                "boot-1", lambda: [DeviceInfo(gpu=0)], security=sec)
    cmds = CommandListener(target, "h1", "boot-1", lambda cmd: None, backoff_s=0.1, max_backoff_s=0.3, security=sec)
    return up, cmds


def test_an_analyzer_killed_is_gone_not_a_refused_certificate(tmp_path):
    pki = tmp_path / "tls"
    assert subprocess.run([*CLI, "certs", "init", str(pki)], capture_output=True).returncode == 0
    certs.issue_agent(pki, "h1", out=pki / "h1")
    other = tmp_path / "other"
    certs.create_ca(other)
    certs.issue_agent(other, "h1", out=pki / "forged")
    port = free_port()
    target = f"localhost:{port}"
    server = subprocess.Popen([*CLI, "--log-level", "warning", "analyzer", "--db", str(tmp_path / "a.duckdb"),
                               "--listen", f"127.0.0.1:{port}", "--tls-dir", str(pki)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    up, cmds = _agent(pki, "h1", target)
    try:
        with capture_logs() as logs:
            up.start()
            cmds.start()
            up.submit([GpuSample(0, time.time(), {"power_watts": 100.0})])
            wait_for(lambda: up.connected and cmds._accepted, timeout=60)
            server.send_signal(signal.SIGKILL)
            server.communicate(timeout=20)
            wait_for(lambda: not up.connected and not cmds.connected, timeout=20)
            time.sleep(1.0)                                     # a few reconnection attempts
        errors = [e for e in logs if e["log_level"] == "error"]
        assert not errors, errors
        assert any(e["event"] == "analyzer unavailable, buffering" for e in logs)
    finally:
        up.stop(drain_s=0)
        cmds.stop()
        if server.poll() is None:
            server.kill()
            server.communicate()

    # the same agent with a certificate of another CA, against a live analyzer: the cause is named
    server = subprocess.Popen([*CLI, "--log-level", "warning", "analyzer", "--db", str(tmp_path / "b.duckdb"),
                               "--listen", f"127.0.0.1:{port}", "--tls-dir", str(pki)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    up, cmds = _agent(pki, "forged", target)
    try:
        with capture_logs() as logs:
            up.start()
            cmds.start()
            up.submit([GpuSample(0, time.time(), {"power_watts": 100.0})])
            said = wait_for(lambda: [e for e in logs if e["log_level"] == "error" and "certificate" in str(e)],
                            timeout=60)
        assert said
    finally:
        up.stop(drain_s=0)
        cmds.stop()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=20)
