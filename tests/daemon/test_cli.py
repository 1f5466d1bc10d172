"""The command line as users run it: real subprocesses, real servers."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, free_port

GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]


def run(*args, timeout=120, tls_dir=None, env=None):
    env = {**os.environ, **({"GPUSCOPE_TLS_DIR": str(tls_dir)} if tls_dir else {}), **(env or {})}
    return subprocess.run(GPUSCOPE + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def test_classify_json_shape(fixture_dir):
    r = run("classify", str(SAMPLES), "--window", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    w = out["windows"][0]
    assert set(w) >= {"gpu", "start", "end", "verdict", "confidence", "evidence"}
    assert w["end"] - w["start"] == 2 and 1.79e9 < w["start"] < 1.8e9
    verdicts = {x["verdict"] for x in out["windows"]}
    assert {"compute-bound", "memory-bound", "communication-bound", "idle"} <= verdicts


@pytest.mark.parametrize("args,message", [
    (["classify", "/nonexistent.csv", "--json"], "no such file"),
    (["classify", str(SAMPLES), "--window", "0.2"], "1 to 60"),
    (["up", "--source", "replay:/nonexistent.csv", "--duration", "1s"], "no such file"),
    (["up", "--source", "bogus", "--duration", "1s"], "expected nvml, dcgm[:HOST[:PORT]], dcgm-exporter:URL, replay:FILE or auto"),
    (["agent", "--source", "nvml", "--duration", "1s"], "replay:FILE"),
    (["findings", "--server", "127.0.0.1:1"], "cannot reach 127.0.0.1:1"),
    (["query", "--server", "127.0.0.1:1", "--metric", "nope"], "unknown 'nope'"),
    (["status", "--limit", "0"], "'0' is not a whole number from 1"),
    # found in a trial: tracebacks
    (["analyzer", "--insecure", "--listen", "127.0.0.1:0", "--db", "/etc/passwd/x.duckdb"],
     "--db /etc/passwd/x.duckdb: /etc/passwd is not a directory"),
    (["agent", "--insecure", "--metrics-listen", "bogus", "--source", f"replay:{SAMPLES}"],
     "--metrics-listen: 'bogus' is not HOST:PORT"),
    # found in a trial: an empty --job fell through to a --pid capture (TypeError), an empty job listed
    # the first job seen with no ranks
    (["capture", "--job", ""], "--job: empty"), (["capture", "--jax", " "], "--jax: empty"),
    (["job", ""], "JOB: empty"),
])
def test_bad_input_gets_a_clear_message_and_nonzero_exit(fixture_dir, args, message, tmp_path):
    r = run(*args, "--db", str(tmp_path / "x.duckdb")) if args[0] == "up" else run(*args)
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_up_replays_without_a_gpu_and_answers_on_call_queries(fixture_dir, tmp_path):
    from tests.analyzers.test_alerts import Receiver_
    port = free_port()
    db = tmp_path / "up.duckdb"
    hook = Receiver_()
    proc = subprocess.Popen(GPUSCOPE + ["up", "--db", str(db), "--listen", f"127.0.0.1:{port}",
                                        "--speed", "10", "--duration", "60s",   # window and interval follow --speed
                                        "--alert-webhook", hook.url + "/gpus"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = f"127.0.0.1:{port}"
    tls = tmp_path / "tls"          # `up` provisions its CA and certificates beside the DB
    try:
        deadline = time.time() + 60
        findings = []
        while time.time() < deadline:
            r = run("findings", "--server", server, "--json", tls_dir=tls)
            if r.returncode == 0:
                findings = json.loads(r.stdout)["findings"]
                if {f["verdict"] for f in findings} >= {"compute-bound", "memory-bound"}:
                    break
            time.sleep(1)
        assert {f["verdict"] for f in findings} >= {"compute-bound", "memory-bound"}, findings
        f = findings[0]
        assert set(f) >= {"host", "gpu", "verdict", "start", "end", "confidence", "evidence"}
        st = json.loads(run("status", "--server", server, "--json", tls_dir=tls).stdout)
        assert st["kind"] == "analyzer" and st["gpus"][0]["name"].startswith("replay of h200-run1")
        assert st["gpus_total"] == st["gpus_matching"] == len(st["gpus"])
        other = run("status", "--server", server, "--host", "no-such-host", tls_dir=tls)
        assert other.returncode == 0 and "no GPUs of host 'no-such-host'" in other.stdout, other.stderr
        q = json.loads(run("query", "--server", server, "--metric", "power_watts", "--since", "5m",
                           "--aggregate", "p95", "--json", tls_dir=tls).stdout)
        assert q["unit"] == "watts" and q["series"][0]["value"] > 100
        q = json.loads(run("query", "--server", server, "--metric", "pcie_rx_bytes_total", "--since", "5m",
                           "--aggregate", "mean", "--json", tls_dir=tls).stdout)
        assert q["unit"] == "bytes/s" and q["rate"] and 0 < q["series"][0]["value"] < 1e11      # a rate, not a total
        q = json.loads(run("query", "--server", server, "--metric", "pcie_rx_bytes_total", "--since", "5m",
                           "--aggregate", "max", "--raw", "--json", tls_dir=tls).stdout)
        assert q["unit"] == "bytes" and not q["rate"]
        one = run("findings", "--server", server, "--verdict", "memory-bound", "--json", tls_dir=tls)
        assert {x["verdict"] for x in json.loads(one.stdout)["findings"]} == {"memory-bound"}
        # nothing found is said, with what exists (found in a trial: silence and exit 0)
        host = st["gpus"][0]["host"]
        none = run("query", "--server", server, "--metric", "power_watts", "--host", "nosuchhost", tls_dir=tls)
        assert none.returncode == 0 and none.stdout.startswith(
            "no power_watts samples for host 'nosuchhost' in the last hour (--since for longer); the analyzer knows "
            f"no host 'nosuchhost' (hosts: {host})"), none.stdout
        none = run("findings", "--server", server, "--host", host, "--gpu", "7", "--since", "1h", tls_dir=tls)
        assert none.stdout.startswith(f"no findings for host {host!r}, GPU 7 in the last 1h; host {host!r} has "
                                      "GPUs 0"), none.stdout
        assert json.loads(run("anomalies", "--server", server, "--host", "x", "--json", tls_dir=tls).stdout) == {
            "anomalies": []}
    finally:
        proc.send_signal(2)   # Ctrl-C
        out, err = proc.communicate(timeout=30)
        hook.close()
    assert proc.returncode == 0, err
    assert "replaying the bundled NVIDIA H200 recording" in err
    assert f"alerts (json) to {hook.url}/gpus: warning and above, findings once they last 120 s" in err
    # the replay's episodes last seconds and a compute-bound one is the GPU doing its job: none pages (found in
    # a trial: each was a separate alert, on open and again on close)
    assert not [b for _, b in hook.posts if b["kind"] == "finding"], hook.posts
    assert db.exists()


def test_agent_and_analyzer_as_separate_processes(fixture_dir, tmp_path):
    aport, gport = free_port(), free_port()
    pki = tmp_path / "pki"
    for args in (["init", str(pki)], ["agent", str(pki), "--host", "gpu-host-7"],
                 ["client", str(pki), "--name", "tester", "--role", "reader"]):
        assert run("certs", *args).returncode == 0
    analyzer = subprocess.Popen(GPUSCOPE + ["analyzer", "--db", str(tmp_path / "c.duckdb"), "--listen",
                                            f"127.0.0.1:{aport}", "--window", "1", "--duration", "60s",
                                            "--tls-dir", str(pki)],
                                stderr=subprocess.PIPE, text=True)
    agent = subprocess.Popen(GPUSCOPE + ["agent", "--analyzer", f"127.0.0.1:{aport}", "--listen",
                                         f"127.0.0.1:{gport}", "--source", f"replay:{SAMPLES}", "--speed", "4",
                                         "--interval", "0.2", "--host", "gpu-host-7", "--duration", "60s",
                                         "--tls-dir", str(pki)],
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 45
        while time.time() < deadline:
            r = run("status", "--server", f"127.0.0.1:{aport}", "--json", tls_dir=pki)
            if r.returncode == 0 and int(json.loads(r.stdout)["samples_committed"]) > 50:
                break
            time.sleep(0.5)
        st = json.loads(run("status", "--server", f"127.0.0.1:{aport}", "--json", tls_dir=pki).stdout)
        assert st["samples_committed"] > 50 and st["gpus"][0]["host"] == "gpu-host-7"
        assert all(isinstance(st[k], int) for k in ("samples_committed", "batches_committed", "samples_stored"))
        ag = json.loads(run("status", "--server", f"127.0.0.1:{gport}", "--json", tls_dir=pki).stdout)
        assert ag["kind"] == "agent" and ag["uplink_connected"] and isinstance(ag["samples"], int)
        # the wrong kind of server says which it is and where to ask (found in a trial: a raw UNIMPLEMENTED)
        r = run("findings", "--server", f"127.0.0.1:{gport}", tls_dir=pki)
        assert r.returncode == 1 and (f"127.0.0.1:{gport} is the agent of host gpu-host-7, not an analyzer" in r.stderr
                                      and f"pass --server 127.0.0.1:{aport}" in r.stderr), r.stderr
        r = run("jobs", "--server", f"127.0.0.1:{aport}", tls_dir=pki)
        assert r.returncode == 1 and f"127.0.0.1:{aport} is an analyzer, not an agent" in r.stderr, r.stderr
        # where to ask, from a config file (no --server, no flags)
        conf = tmp_path / "gpuscope.toml"
        conf.write_text(f'server = "127.0.0.1:{aport}"\ntls_dir = "{pki}"\n')
        r = run("status", "--json", env={"GPUSCOPE_CONFIG": str(conf)})
        assert r.returncode == 0 and json.loads(r.stdout)["kind"] == "analyzer", r.stderr
        # ... the environment beats the file
        r = run("status", "--json", env={"GPUSCOPE_CONFIG": str(conf), "GPUSCOPE_SERVER": f"127.0.0.1:{gport}"})
        assert r.returncode == 0 and json.loads(r.stdout)["kind"] == "agent", r.stderr
    finally:
        for p in (agent, analyzer):
            p.send_signal(2)
        for p in (agent, analyzer):
            p.communicate(timeout=30)
    assert agent.returncode == 0 and analyzer.returncode == 0


def test_captures_go_beside_the_db_unless_told_otherwise(tmp_path):
    """Found in two trials: `up --db /elsewhere` wrote its captures under
    ~/.local/state/gpuscope/captures."""
    from gpuscope.daemon.cli import build_parser
    from gpuscope.daemon.cliutil import default_db
    from gpuscope.daemon.cmd_serve import capture_dir
    parse = build_parser().parse_args
    assert capture_dir(parse(["up", "--db", str(tmp_path / "x.duckdb")])) == tmp_path / "captures"
    assert capture_dir(parse(["up", "--db", str(tmp_path / "x.duckdb"), "--capture-dir", "/c"])) == Path("/c")
    assert capture_dir(parse(["agent"])) == Path(default_db()).parent / "captures"


def test_trace_summarize_of_a_directory_of_several_says_which_it_read(tmp_path):
    """Found against a real vLLM: its trace directory held 18 traces and one
    was summarized without a word about the others; then the first by name
    was read, the oldest session's. The newest session's largest trace (the
    worker's, with the GPU's kernels, not the API server's) is read."""
    import gzip
    import json
    import os
    import shutil
    data = Path(__file__).resolve().parents[1] / "data" / "h200-torch-2.11"
    old, new = tmp_path / "rank0.1000.pt.trace.json.gz", tmp_path / "rank0.2000.pt.trace.json.gz"
    shutil.copy(data / "matmul_bf16.pt.trace.json.gz", old)
    shutil.copy(data / "stream_f32.pt.trace.json.gz", new)
    api = tmp_path / "vm_1.async_llm.2001.pt.trace.json.gz"
    api.write_bytes(gzip.compress(json.dumps({"traceEvents": [
        {"ph": "X", "name": "generate", "pid": 1, "tid": 1, "ts": 0, "dur": 10}]}).encode()))
    now = time.time()
    os.utime(old, (now - 3600, now - 3600))
    os.utime(new, (now - 5, now - 5))
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "trace", "summarize", *a],
                                    capture_output=True, text=True, timeout=60)
    r = run(str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path} holds 3 traces; summarizing {new}, the newest session's largest" in r.stderr
    assert "memory-bound" in r.stdout
    r = run(str(tmp_path), "--json")
    assert json.loads(r.stdout)["traces_found"] == [str(new), str(api), str(old)]
    (tmp_path / "broken.pt.trace.json").write_text("{not json")
    r = run(str(tmp_path), "--all", "--json")
    each = {Path(t["source"]).name: t for t in json.loads(r.stdout)["traces"]}
    assert r.returncode == 0 and "error" in each["broken.pt.trace.json"]              # said, and the rest still read
    assert (each[new.name]["verdict"], each[api.name]["verdict"], each[old.name]["verdict"]) == (
        "memory-bound", None, "compute-bound")


def test_where_to_ask_defaults_and_bare_hosts(tmp_path, monkeypatch):
    """Found in a trial: --server was required on every on-call command, and
    `--server localhost` went to port 443."""
    import argparse
    from gpuscope.daemon import client_config as cc
    from gpuscope.daemon.cliutil import UsageError
    assert cc.with_port("localhost", 9403) == "localhost:9403"
    assert cc.with_port("node17", 9401) == "node17:9401"
    assert cc.with_port("10.0.0.5:7000", 9403) == "10.0.0.5:7000"
    assert cc.with_port("::1", 9403) == "[::1]:9403" and cc.with_port("[::1]", 9403) == "[::1]:9403"
    assert cc.with_port("[::1]:9", 9403) == "[::1]:9"
    for bad in ("http://a:1", "a:0", "a:99999", "a:", ":80", " "):
        with pytest.raises(UsageError, match="--server"):
            cc.with_port(bad, 9403)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GPUSCOPE_SERVER", raising=False)
    monkeypatch.delenv("GPUSCOPE_CONFIG", raising=False)
    monkeypatch.delenv("GPUSCOPE_TLS_DIR", raising=False)
    monkeypatch.delenv("GPUSCOPE_TOKEN", raising=False)

    def resolved(command="findings", **flags):
        ns = argparse.Namespace(command=command, server=None, tls_dir=None, ca=None, cert=None, key=None,
                                token_file=None, tls_server_name=None, insecure=False)
        vars(ns).update(flags)
        cc.apply(ns)
        return ns
    assert resolved().server == "127.0.0.1:9403"
    assert resolved(server="gpu-7").server == "gpu-7:9403" and resolved("jobs", server="gpu-7").server == "gpu-7:9401"
    (tmp_path / "gpuscope").mkdir()
    conf = tmp_path / "gpuscope" / "config.toml"
    conf.write_text('server = "analyzer.example"\ntls_dir = "/etc/gs"\ntoken_file = "~/tok"\n')
    ns = resolved()
    assert (ns.server, ns.tls_dir, ns.token_file) == ("analyzer.example:9403", "/etc/gs", os.path.expanduser("~/tok"))
    assert resolved(insecure=True).tls_dir is None                 # a flag decides, the file does not add to it
    monkeypatch.setenv("GPUSCOPE_SERVER", "other:1")
    assert resolved().server == "other:1" and resolved(server="x:2").server == "x:2"
    conf.write_text('server = "a"\nsevrer = "b"\n')
    with pytest.raises(UsageError, match="unknown key 'sevrer'"):
        resolved()
    conf.write_text('server = [1]\n')
    with pytest.raises(UsageError, match="server must be a non-empty string"):
        resolved()
    conf.write_text('server = "a\n')
    with pytest.raises(UsageError, match="not TOML"):
        resolved()


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("gpuscope ") and r.stdout.split()[1][0].isdigit()


@pytest.mark.parametrize("flag, value, words", [
    ("--window", "100", "'100' is not a number from 1 to 60 s"), ("--fleet-fraction", "7", "above 0 and at most 1"),
    ("--capture-duration-ms", "-5", "whole number from 1 to 600000"), ("--job-captures", "-1", "from 0 to 10000"),
    ("--retention", "forever", "expected an age like 14d"), ("--serving-interval", "0.5", "(0: off)"),
])
def test_up_refuses_bad_flags_before_it_says_anything_else(tmp_path, flag, value, words):
    """Found in a trial: the 'no GPU here, replaying' banner came before the
    error; some values (-5 ms captures, a fleet fraction of 7) were taken."""
    r = run("up", "--no-view", "--insecure", "--db", str(tmp_path / "x.duckdb"), flag, value, timeout=30)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith(f"gpuscope up: error: argument {flag}: ")
    assert words in r.stderr, r.stderr
    assert "no GPU source here" not in r.stderr and not (tmp_path / "x.duckdb").exists()


def test_an_error_names_where_a_setting_came_from(tmp_path):
    """Found in a trial: `--tls-dir ...: no such directory` for a directory
    set in the config file, and `cannot reach` an address without saying it
    came from $GPUSCOPE_SERVER."""
    (tmp_path / "gpuscope").mkdir()
    (tmp_path / "gpuscope" / "config.toml").write_text(f'tls_dir = "{tmp_path / "nowhere"}"\n')
    r = run("findings", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 1 and f"{tmp_path / 'nowhere'} (`tls_dir` in {tmp_path / 'gpuscope' / 'config.toml'})" \
        in r.stderr and "--tls-dir" not in r.stderr, r.stderr
    r = run("findings", "--insecure", env={"GPUSCOPE_SERVER": f"127.0.0.1:{free_port()}"})
    assert r.returncode == 1 and "(the address came from $GPUSCOPE_SERVER)" in r.stderr, r.stderr


def test_up_prints_the_on_call_command_that_works(tmp_path):
    """Found in a trial: with --db outside the default place, the command `up`
    printed was refused (the client looked for its TLS files elsewhere)."""
    from gpuscope.daemon.cli import build_parser
    from gpuscope.daemon.cmd_serve import _client_security_words
    parse = build_parser().parse_args
    assert _client_security_words(parse(["up", "--db", str(tmp_path / "x.duckdb")])) == f" --tls-dir {tmp_path}/tls"
    assert _client_security_words(parse(["up", "--insecure"])) == " --insecure"
    assert _client_security_words(parse(["up"])) == ""


@pytest.mark.parametrize("args, said", [
    (["findings", "--since", "0"], "no time at all"), (["top", "--since", "0"], "no time at all"),
    (["query", "--metric", "power_watts", "--since", "0"], "no time at all"),
    (["up", "--duration", "0"], "no time at all"), (["findings", "--gpu", "-1"], "from 0 to 65535"),
    (["findings", "--limit", "-3"], "from 1 to"), (["anomalies", "--limit", "0"], "from 1 to"),
])
def test_ranges_that_ask_for_nothing_are_refused_at_the_flag(args, said):
    """Found in a trial: `--since 0` answered three ways, `--gpu -1` gave a
    raw 'Value out of range: -1', `up --duration 0` ran for 6 s."""
    r = run(*args, timeout=30)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_trace_summarize_counts_profiling_sessions_and_reads_each_once(fixture_dir, tmp_path):
    """Found in a trial: six JAX profiles were `18 traces`, and --all
    summarized each session three times, disagreeing (memory-bound 0.95 from
    the XSpace, 0.67 from the JSON)."""
    traces = fixture_dir / "traces"
    trace = lambda *a: run("trace", "summarize", *a, timeout=300)
    r = trace(str(traces), "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)["traces_found"]
    assert len(found) == 6 and all(f.endswith("vm.xplane.pb") for f in found)
    assert f"{traces} holds 6 traces" in r.stderr and "XSpace" in r.stderr
    hbm = traces / "hbm_stream"
    r = trace(str(hbm), "--all", "--json")
    each = json.loads(r.stdout)["traces"]
    assert r.returncode == 0 and len(each) == 1 and each[0]["source"].endswith("vm.xplane.pb"), r.stderr
    assert (each[0]["verdict"], round(each[0]["confidence"], 2)) == ("memory-bound", 0.95)
    r = trace(str(hbm))
    assert "vm.trace.json.gz" in r.stderr and "perfetto_trace.json.gz" in r.stderr     # said, not read
    assert r.stdout.startswith(str(next(hbm.rglob("vm.xplane.pb"))))


def test_trace_summarize_of_a_recording_says_it_is_not_a_trace(fixture_dir, tmp_path):
    (tmp_path / "weird.json").write_text('{"model": "llama"}')
    r = run("trace", "summarize", str(tmp_path))
    assert r.returncode != 0 and "no .xplane.pb or trace JSON below it" in r.stderr, r.stderr
    r = run("trace", "summarize", str(SAMPLES))
    assert r.returncode != 0 and "not an XSpace" not in r.stderr
    assert f"{SAMPLES}: not a trace" in r.stderr and "gpuscope classify reads recordings" in r.stderr
