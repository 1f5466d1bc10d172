"""The configuration file as users meet it: real `gpuscope analyzer` and
`gpuscope agent` processes reading one file, the environment and flags over
it, bad files refused at start-up, and `gpuscope config check|show|example`."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES, free_port

GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]
# the environment of a host with no configuration of its own
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "XDG_"))}


def run(*args, env=None, timeout=60):
    return subprocess.run(GPUSCOPE + list(args), capture_output=True, text=True, timeout=timeout,
                          env={**CLEAN, **(env or {})})


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_agent_and_analyzer_run_from_one_file_under_the_environment_and_flags(fixture_dir, tmp_path):
    """One file for both halves, as a fleet host would have it. The analyzer
    listens where the environment says (not the file's port) with the file's
    window and DB; the agent reports the host its flag names (not the
    environment's, not the file's) and finds the analyzer the file names."""
    p_file, p_env, gport = free_port(), free_port(), free_port()
    db = tmp_path / "state" / "fleet.duckdb"
    conf = write(tmp_path / "gpuscope.toml", f"""
[analyzer]
listen = "127.0.0.1:{p_file}"
window = 2
db = "{db}"
engine = "thread"
insecure = true
duration = "60s"

[agent]
analyzer = "127.0.0.1:{p_env}"
listen = "127.0.0.1:{gport}"
source = "replay:{SAMPLES}"
speed = 4
interval = 0.2
flush-interval = 0.2
host = "host-from-file"
insecure = true
duration = "60s"
""", 0o644)
    env = {**CLEAN, "GPUSCOPE_CONFIG": str(conf)}
    analyzer = subprocess.Popen(GPUSCOPE + ["analyzer"], stderr=subprocess.PIPE, text=True,
                                env={**env, "GPUSCOPE_ANALYZER_LISTEN": f"127.0.0.1:{p_env}"})
    agent = subprocess.Popen(GPUSCOPE + ["agent", "--host", "host-from-flag"], stderr=subprocess.PIPE, text=True,
                             env={**env, "GPUSCOPE_AGENT_HOST": "host-from-env"})
    try:
        deadline, st = time.time() + 45, {}
        while time.time() < deadline:
            r = run("status", "--server", f"127.0.0.1:{p_env}", "--insecure", "--json")
            if r.returncode == 0:
                st = json.loads(r.stdout)
                if st["samples_committed"] > 50:
                    break
            time.sleep(0.5)
        assert st.get("samples_committed", 0) > 50, st
        assert {g["host"] for g in st["gpus"]} == {"host-from-flag"}
        assert run("status", "--server", f"127.0.0.1:{p_file}", "--insecure").returncode == 1   # not the file's port
    finally:
        for p in (agent, analyzer):
            p.send_signal(2)
        _, agent_err = agent.communicate(timeout=30)
        _, analyzer_err = analyzer.communicate(timeout=30)
    assert agent.returncode == 0 and analyzer.returncode == 0, analyzer_err + agent_err
    assert db.exists()
    assert '"window_s": 2.0' in analyzer_err                  # the file's window, in the analyzer's start line
    assert (f"settings from {conf} [analyzer] (db, duration, engine, insecure, window) and the environment "
            "(listen)") in analyzer_err, analyzer_err
    assert f"analyzer 127.0.0.1:{p_env}" in agent_err


@pytest.mark.parametrize("command, table, words", [
    ("analyzer", "[analyzer]\nwindw = 2\n", "[analyzer] windw: unknown key (did you mean window?)"),
    ("analyzer", "[analyzer]\nwindow = \"5s\"\n", "[analyzer] window: '5s' is not a number from 1 to 60 s"),
    ("analyzer", "[analyzer]\nthreads = 0\n", "[analyzer] threads: '0' is not a whole number from 1 to 1024"),
    ("analyzer", "[analyzer]\ndb = \"{plain}/x.duckdb\"\n", "[analyzer] db: {plain} is not a directory"),
    ("analyzer", "[analyzer]\ntls_dir = \"{tmp}/tls\"\n", "[analyzer] tls_dir: {tmp}/tls: no such directory"),
    ("agent", "[agent]\ninsecure = \"yes\"\n", "[agent] insecure: expected true or false, not a string ('yes')"),
    ("agent", "[agent]\ncapture_dir = \"{plain}/c\"\n", "[agent] capture_dir: cannot create {plain}/c"),
    ("up", "[up]\nalert_webhook = \"https://u:p@hooks.example/x\"\n",
     "[up] alert_webhook: holds a credential and {conf} is accessible to group or others (mode 0644)"),
])
def test_a_bad_file_is_refused_at_start_with_the_key(tmp_path, command, table, words):
    plain = write(tmp_path / "plain", "not a directory")
    conf = write(tmp_path / "gpuscope.toml", table.format(plain=plain, tmp=tmp_path), 0o644)
    db = tmp_path / "x.duckdb"
    flags = ["--db", str(db)] if command != "agent" and "db =" not in table else []
    r = run(command, "--config", str(conf), *flags, "--duration", "5s", timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"gpuscope {command}: error: {conf}: {words.format(plain=plain, tmp=tmp_path, conf=conf)}" in r.stderr
    assert "listening" not in r.stderr and "Traceback" not in r.stderr and not db.exists(), r.stderr


def test_the_environment_is_checked_at_start_too(tmp_path):
    r = run("agent", "--insecure", "--duration", "1s", env={"GPUSCOPE_AGENT_FLUSH_INTERVAL": "0"})
    assert r.returncode == 2 and r.stderr.strip() == (
        "gpuscope agent: error: $GPUSCOPE_AGENT_FLUSH_INTERVAL: '0' is not a number from 0.1 to 60 s"), r.stderr


def test_config_check_says_every_problem_and_exits_2(tmp_path):
    good = write(tmp_path / "good.toml", 'server = "analyzer.example"\n[agent]\nanalyzer = "a:9403"\n'
                                         '[analyzer]\nretention = "30d"\nalertmanager = ["http://am:9093"]\n', 0o644)
    r = run("config", "check", str(good))
    assert (r.returncode, r.stdout) == (0, f"{good}: ok ([agent] 1 setting, [analyzer] 2 settings)\n"), r.stderr
    bad = write(tmp_path / "bad.toml", '[agent]\ninterval = 0\nanalyzr = "a:1"\n[analyzer]\nwindow = 0\n')
    r = run("config", "check", str(bad))
    assert r.returncode == 2 and r.stdout.splitlines() == [
        f"{bad}: [agent] interval: '0' is not a number from 0.1 to 60 s",
        f"{bad}: [agent] analyzr: unknown key (did you mean analyzer?)",
        f"{bad}: [analyzer] window: '0' is not a number from 1 to 60 s",
        f"{bad}: 3 problems"], r.stdout
    r = run("config", "check", str(bad), "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 2 and not out["ok"] and [(p["table"], p["key"]) for p in out["problems"]] == [
        ("agent", "interval"), ("agent", "analyzr"), ("analyzer", "window")]
    r = run("config", "check", str(tmp_path / "none.toml"))
    assert r.returncode == 2 and f"{tmp_path / 'none.toml'}: no such file" in r.stdout


def test_config_show_says_where_each_value_came_from_and_no_secret(tmp_path):
    hooks = write(tmp_path / "hooks", "https://hooks.slack.com/services/T0001/B0001/abcdefghijklmnopqrstuvwx\n")
    conf = write(tmp_path / "gpuscope.toml", f'[analyzer]\nwindow = 2\nthreads = 3\nmemory_limit = "2GB"\n'
                                             f'alert_webhook_file = "{hooks}"\n', 0o644)
    env = {"GPUSCOPE_CONFIG": str(conf), "GPUSCOPE_ANALYZER_THREADS": "4", "GPUSCOPE_ANALYZER_WINDOW": "3"}
    r = run("config", "show", "analyzer", "--window", "10", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["file"] == str(conf)
    got = {k: (v["value"], v["source"]) for k, v in out["commands"]["analyzer"]["settings"].items()}
    assert got["window"] == (10.0, "flag")
    assert got["threads"] == (4, "env:GPUSCOPE_ANALYZER_THREADS")
    assert got["memory_limit"] == ("2GB", f"file:{conf}")
    assert got["max_streams"] == (10000, "default")
    assert got["alert_webhook"] == (f"<redacted from {hooks}>", f"file:{conf}")
    assert "abcdefghijklmnopqrstuvwx" not in r.stdout
    r = run("config", "show", env=env)                    # people's form: agent and analyzer
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line and not line.startswith("g")}
    assert r.returncode == 0 and r.stdout.startswith(f"gpuscope agent: settings file {conf}\n"), r.stdout
    assert f"gpuscope analyzer: settings file {conf}" in r.stdout
    assert rows["memory_limit"] == ["2GB", f"file:{conf}"] and rows["threads"] == ["4", "env:GPUSCOPE_ANALYZER_THREADS"]
    assert rows["host_cooldown"] == ["10m", "default"] and "abcdefghijklmnopqrstuvwx" not in r.stdout


def test_the_shipped_example_and_reference_are_what_the_parsers_say():
    """deploy/gpuscope.toml and the key tables of docs/configuration.md are
    written by `gpuscope config example`: a new or changed flag fails here
    until both are written again:
        gpuscope config example > deploy/gpuscope.toml
        gpuscope config example --markdown   (between the markers of docs/configuration.md)"""
    r = run("config", "example", env={"HOME": str(Path.home())})
    assert r.returncode == 0 and r.stdout == (ROOT / "deploy" / "gpuscope.toml").read_text()
    r = run("config", "example", "--markdown")
    doc = (ROOT / "docs" / "configuration.md").read_text()
    begin, end = "<!-- keys: gpuscope config example --markdown -->\n", "<!-- end of keys -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == r.stdout
