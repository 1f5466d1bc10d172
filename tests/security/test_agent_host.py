"""An agent with a host certificate speaks for the host it names: real
`gpuscope analyzer` and `gpuscope agent` processes over mutual TLS."""
import json
import os
import subprocess
import sys
import time

from tests.conftest import SAMPLES, free_port

GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]


def run(*args, tls_dir=None, timeout=120):
    env = {**os.environ, **({"GPUSCOPE_TLS_DIR": str(tls_dir)} if tls_dir else {})}
    return subprocess.run(GPUSCOPE + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def _pki(tmp_path):
    pki = tmp_path / "pki"
    for args in (["init", str(pki)], ["agent", str(pki), "--host", "gpu-host-7"],
                 ["client", str(pki), "--name", "tester", "--role", "reader"]):
        assert run("certs", *args).returncode == 0
    return pki


def _agent(pki, aport, *extra):
    return [*GPUSCOPE, "agent", "--analyzer", f"127.0.0.1:{aport}", "--listen", f"127.0.0.1:{free_port()}",
            "--source", f"replay:{SAMPLES}", "--speed", "4", "--interval", "0.2", "--tls-dir", str(pki), *extra]


def test_a_host_other_than_the_certificates_is_refused_at_start_up(fixture_dir, tmp_path):
    """Found by a tester: the agent ran, and the analyzer refused every batch."""
    pki = _pki(tmp_path)
    r = subprocess.run(_agent(pki, free_port(), "--host", "gpu-host-8", "--duration", "5s"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert (f"--host gpu-host-8: the agent's certificate {pki / 'agent.pem'} names host gpu-host-7" in r.stderr
            and "pass --host gpu-host-7, or make a certificate for gpu-host-8" in r.stderr), r.stderr
    assert "Traceback" not in r.stderr


def test_without_host_the_certificates_host_is_used_and_its_batches_are_taken(fixture_dir, tmp_path):
    """Found by a tester: without --host the agent reported this machine's
    name, and the analyzer refused every batch."""
    pki = _pki(tmp_path)
    aport = free_port()
    analyzer = subprocess.Popen([*GPUSCOPE, "analyzer", "--db", str(tmp_path / "h.duckdb"), "--listen",
                                 f"127.0.0.1:{aport}", "--window", "1", "--duration", "90s", "--tls-dir", str(pki)],
                                stderr=subprocess.PIPE, text=True)
    agent = subprocess.Popen(_agent(pki, aport, "--duration", "90s"), stderr=subprocess.PIPE, text=True)
    try:
        deadline, st = time.time() + 45, {}
        while time.time() < deadline:
            r = run("status", "--server", f"127.0.0.1:{aport}", "--json", tls_dir=pki)
            st = json.loads(r.stdout) if r.returncode == 0 else {}
            if st.get("samples_committed", 0) > 10:
                break
            time.sleep(0.5)
        assert st.get("samples_committed", 0) > 10 and {g["host"] for g in st["gpus"]} == {"gpu-host-7"}, st
    finally:
        for p in (agent, analyzer):
            p.send_signal(2)
        _, agent_err = agent.communicate(timeout=30)
        analyzer.communicate(timeout=30)
    said = [line for line in agent_err.splitlines() if "as its certificate" in line]
    assert len(said) == 1 and f"agent: host gpu-host-7, as its certificate {pki / 'agent.pem'} names it" in said[0], \
        agent_err
