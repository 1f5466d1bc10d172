"""The chart's containers, run here as processes: what a cluster would run,
less the cluster. `make-secrets.sh` makes the certificates and the Secrets
(with a real kubectl, --dry-run=client); each Secret is laid out as the
kubelet mounts it (a file per key); the analyzer and the agent start with
the args the chart renders, $(NODE_NAME) expanded as the kubelet does, and
only these changed: the mount paths (to temporary directories), the ports
(free ones), the agent's analyzer address (127.0.0.1, the certificate's name
kept in --tls-server-name) and the agent's source (the bundled recording:
no GPU here). Then the rendered probes, Prometheus' view of /metrics (the
ServiceMonitor's TLS settings) and the data path are checked for real."""
import base64
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuscope.daemon.cli import build_parser
from tests.conftest import ROOT, free_port

from .chart import container, expand, one, render
from .tools import tool

NODE = "gpu-node-1"
GPUSCOPE = str(Path(sys.executable).parent / "gpuscope")
RECORDING = ROOT / "collectors" / "data" / "h200-run1.csv.gz"


def _env() -> dict:
    # the image's PATH: gpuscope-health beside gpuscope, and `python3` the venv's
    path = f"{ROOT / 'deploy' / 'container'}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "NODE_NAME": NODE, "NODE_IP": "127.0.0.1", "GRPC_VERBOSITY": "ERROR"}


def _mount(secret: dict, where: Path) -> Path:
    """A Secret as the kubelet lays it out: one file per key."""
    where.mkdir(parents=True)
    for key, value in secret["data"].items():
        f = where / key
        f.write_bytes(base64.b64decode(value))
        f.chmod(0o400)
    return where


def _replace(words: list[str], swaps: dict[str, str]) -> list[str]:
    out = []
    for w in words:
        for old, new in swaps.items():
            w = w.replace(old, new)
        out.append(w)
    return out


def _probe(command: list[str], swaps: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(_replace(command, swaps), env=_env(), capture_output=True, text=True, timeout=30)


def _until(check, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def _scrape(port: int, server_name: str, tls: Path) -> str:
    """GET /metrics as Prometheus does with the ServiceMonitor's tlsConfig:
    the fleet's CA, a client certificate, and the name the server must carry."""
    ctx = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    ctx.load_cert_chain(str(tls / "client.pem"), str(tls / "client.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: scrape\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head[:200]
    return body.decode()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture()
def secrets(tmp_path):
    out = subprocess.run(["sh", str(ROOT / "deploy" / "helm" / "make-secrets.sh"), str(tmp_path / "pki"), "gpuscope",
                          f"node/{NODE}", "gpu-node-2"],
                         env={**_env(), "GPUSCOPE": GPUSCOPE, "KUBECTL": str(tool("kubectl"))},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d}
    assert set(docs) == {"gpuscope-analyzer-tls", "gpuscope-agent-tls", "gpuscope-prometheus-tls"}
    assert all(d["kind"] == "Secret" and d["metadata"]["namespace"] == "gpuscope" for d in docs.values())
    return {name: _mount(d, tmp_path / "secrets" / name) for name, d in docs.items()}


def test_the_agent_secret_holds_each_node_and_grows_without_reissuing(tmp_path, secrets):
    agents = secrets["gpuscope-agent-tls"]
    assert sorted(p.name for p in agents.iterdir()) == sorted(
        ["ca.pem", f"{NODE}.pem", f"{NODE}.key", "gpu-node-2.pem", "gpu-node-2.key"])
    before = (agents / f"{NODE}.pem").read_bytes()
    out = subprocess.run(["sh", str(ROOT / "deploy" / "helm" / "make-secrets.sh"), str(tmp_path / "pki"), "gpuscope",
                          "gpu-node-3"], env={**_env(), "GPUSCOPE": GPUSCOPE, "KUBECTL": str(tool("kubectl"))},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    agent_secret = next(d for d in yaml.safe_load_all(out.stdout) if d and d["metadata"]["name"] == "gpuscope-agent-tls")
    assert {f"{n}.pem" for n in (NODE, "gpu-node-2", "gpu-node-3")} <= set(agent_secret["data"])
    assert base64.b64decode(agent_secret["data"][f"{NODE}.pem"]) == before


def test_the_rendered_containers_serve_probe_and_stream(tmp_path, secrets):
    objects = render("default")
    sts, ds = one(objects, "StatefulSet", "-analyzer"), one(objects, "DaemonSet", "-agent")
    grpc_port, analyzer_metrics, agent_api, agent_metrics = (free_port() for _ in range(4))
    a_swaps = {"/etc/gpuscope/tls": str(secrets["gpuscope-analyzer-tls"]),
               "/var/lib/gpuscope": str(tmp_path / "analyzer"),
               "0.0.0.0:9403": f"127.0.0.1:{grpc_port}", "127.0.0.1:9403": f"127.0.0.1:{grpc_port}",
               "0.0.0.0:9464": f"0.0.0.0:{analyzer_metrics}"}
    g_swaps = {"/etc/gpuscope/tls": str(secrets["gpuscope-agent-tls"]),
               "/var/lib/gpuscope": str(tmp_path / "agent"),
               "--analyzer=gpuscope-analyzer.gpuscope.svc:9403": f"--analyzer=127.0.0.1:{grpc_port}",
               "127.0.0.1:9401": f"127.0.0.1:{agent_api}", "0.0.0.0:9464": f"0.0.0.0:{agent_metrics}"}
    (tmp_path / "analyzer").mkdir()
    (tmp_path / "agent").mkdir()
    a_args = _replace(container(sts)["args"], a_swaps)
    g_args = _replace(expand(container(ds)["args"], {"NODE_NAME": NODE, "NODE_IP": "127.0.0.1"}), g_swaps)
    assert "--tls-server-name=gpuscope-analyzer.gpuscope.svc" in g_args
    g_args.append(f"--source=replay:{RECORDING}")
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("analyzer", "agent")}
    procs = {}
    try:
        procs["analyzer"] = subprocess.Popen([GPUSCOPE, *a_args], env=_env(), stdout=logs["analyzer"],
                                             stderr=subprocess.STDOUT, start_new_session=True)
        a_probe = container(sts)["readinessProbe"]["exec"]["command"]
        _until(lambda: _probe(a_probe, a_swaps).returncode == 0 or procs["analyzer"].poll() is not None,
               90, "the analyzer's readiness probe")
        assert procs["analyzer"].poll() is None, (tmp_path / "analyzer.log").read_text()
        procs["agent"] = subprocess.Popen([GPUSCOPE, *g_args], env=_env(), stdout=logs["agent"],
                                          stderr=subprocess.STDOUT, start_new_session=True)
        g_probe = container(ds)["readinessProbe"]["exec"]["command"]
        _until(lambda: _probe(g_probe, g_swaps).returncode == 0 or procs["agent"].poll() is not None,
               60, "the agent's readiness probe")
        assert procs["agent"].poll() is None, (tmp_path / "agent.log").read_text()
        for probe in ("startupProbe", "livenessProbe"):
            assert _probe(container(sts)[probe]["exec"]["command"], a_swaps).returncode == 0
            assert _probe(container(ds)[probe]["exec"]["command"], g_swaps).returncode == 0

        # the agent speaks for its node, over mutual TLS: the analyzer stores its GPU
        probe_dir = secrets["gpuscope-analyzer-tls"]
        status = [GPUSCOPE, "status", "--server", f"127.0.0.1:{grpc_port}", "--json", "--ca", str(probe_dir / "ca.pem"),
                  "--cert", str(probe_dir / "probe.pem"), "--key", str(probe_dir / "probe.key"),
                  "--tls-server-name", "gpuscope-analyzer.gpuscope.svc"]

        def stored():
            out = subprocess.run(status, env=_env(), capture_output=True, text=True, timeout=30)
            s = json.loads(out.stdout) if out.returncode == 0 else {}
            return [g for g in s.get("gpus", []) if g["host"] == NODE and s.get("samples_committed", 0) > 0]
        _until(stored, 60, f"samples of {NODE} stored by the analyzer")

        # Prometheus, as the ServiceMonitors configure it
        prom = secrets["gpuscope-prometheus-tls"]
        agent_text = _scrape(agent_metrics, "gpuscope-agent", prom)
        assert "gpuscope_agent_samples_total" in agent_text and 'gpuscope_gpu_up{gpu="0"' in agent_text
        assert "gpuscope_findings_open" in _scrape(analyzer_metrics, "gpuscope-analyzer.gpuscope.svc", prom)
        with pytest.raises(ssl.SSLCertVerificationError):
            _scrape(agent_metrics, "someone-else", prom)

        # a probe can fail: the agent stopped, its probe says so
        _stop(procs["agent"])
        failed = _probe(g_probe, g_swaps)
        assert failed.returncode == 1 and "gpuscope-health: 127.0.0.1:" in failed.stderr, failed
    finally:
        for proc in procs.values():
            _stop(proc)
        for f in logs.values():
            f.close()
    assert procs["analyzer"].returncode == 0, (tmp_path / "analyzer.log").read_text()[-3000:]


def test_the_probe_refuses_a_certificate_of_another_ca(tmp_path, secrets):
    """gpuscope-health presents what it is given; a server of another CA
    fails the handshake, and the probe says so instead of passing."""
    other = tmp_path / "other"
    subprocess.run([GPUSCOPE, "certs", "init", str(other), "--name", "localhost", "--ip", "127.0.0.1"],
                   env=_env(), check=True, capture_output=True, timeout=60)
    port = free_port()
    proc = subprocess.Popen([GPUSCOPE, "analyzer", "--listen", f"127.0.0.1:{port}", "--tls-dir", str(other),
                             "--db", str(tmp_path / "x.duckdb"), "--engine", "thread"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        probe_dir = secrets["gpuscope-analyzer-tls"]
        cmd = ["gpuscope-health", f"127.0.0.1:{port}", "--ca", str(probe_dir / "ca.pem"),
               "--cert", str(probe_dir / "probe.pem"), "--key", str(probe_dir / "probe.key")]
        def listening():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        _until(listening, 60, "the analyzer listening")
        out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and "gpuscope-health" in out.stderr, out
    finally:
        _stop(proc)


def test_the_init_container_hands_the_analyzer_a_tokens_file_it_accepts(tmp_path):
    """Under fsGroup the kubelet makes a Secret's files group-readable
    (0440), which gpuscope refuses for a tokens file; the chart's init
    container copies it, its owner's alone, into a memory volume, which it accepts."""
    from gpuscope.security.auth import TokenFileError, TokenStore, add_token

    sts = one(render("default", "analyzer.tokensSecret=gpuscope-tokens"), "StatefulSet")
    [init] = sts["spec"]["template"]["spec"]["initContainers"]
    secret, memory = tmp_path / "secret", tmp_path / "memory"
    secret.mkdir()
    memory.mkdir()
    add_token(secret / "tokens", "grafana", "reader")
    (secret / "tokens").chmod(0o440)
    with pytest.raises(TokenFileError, match="group or others"):
        TokenStore.load(secret / "tokens")
    swaps = {"/etc/gpuscope/tokens-secret": str(secret), "/var/run/gpuscope": str(memory)}
    subprocess.run(_replace(init["command"], swaps), check=True, timeout=30)
    args = build_parser().parse_args(container(sts)["args"])
    copied = Path(args.tokens.replace("/var/run/gpuscope", str(memory)))
    assert copied.stat().st_mode & 0o077 == 0
    assert TokenStore.load(copied) is not None
