"""The servers' configuration file, in process: its keys are the flags, its
values pass the flags' checks, each setting comes from the highest source
that has it, and everything wrong is refused naming where it is."""
import argparse
import os
import tomllib
from pathlib import Path

import pytest

from gpuscope.daemon import client_config, config_file, config_schema
from gpuscope.daemon.cli import build_parser
from gpuscope.daemon.cmd_config import check
from gpuscope.daemon.config_file import ConfigError

SLACK = "https://hooks.slack.com/services/T0001/B0001/abcdefghijklmnopqrstuvwx"


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def resolved(argv: list[str], environ: dict | None = None, config: Path | None = None):
    """What `gpuscope ARGV` would run with: (namespace, resolution)."""
    argv = [*argv, *(["--config", str(config)] if config else [])]
    parser = build_parser()
    ns = parser.parse_args(argv)
    res = config_file.apply(ns, parser, config_file.flags_given(build_parser, argv), environ or {})
    return ns, res


def problems(path: Path) -> list[str]:
    return [str(p) for p in check(build_parser(), path)[0]]


@pytest.mark.parametrize("command", config_file.TABLES)
def test_every_long_flag_of_a_server_is_a_key(command):
    """Derived from the parser, so a new flag is a new key the day it is
    added (and a flag of a shape the file cannot hold fails here)."""
    sp = config_schema.subparser(build_parser(), command)
    flags = {o for a in sp._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--config"}
    schema = config_schema.settings(build_parser(), command)
    assert {s.flag for s in schema.values()} == flags | {"--log-level", "--json-logs"}
    assert all(s.key == s.flag[2:].replace("-", "_") for s in schema.values())


@pytest.mark.parametrize("table, line, words", [
    # the messages the flags give (test_cli.py::test_up_refuses_bad_flags_before_it_says_anything_else)
    ("analyzer", "window = 100", "[analyzer] window: '100' is not a number from 1 to 60 s"),
    ("analyzer", "fleet_fraction = 7", "above 0 and at most 1"),
    ("analyzer", "capture_duration_ms = -5", "whole number from 1 to 600000"),
    ("analyzer", "job_captures = 2.5", "'2.5' is not a whole number from 0 to 10000"),
    ("analyzer", 'retention = "forever"', "expected an age like 14d"),
    ("agent", "serving_interval = 0.5", "(0: off)"),
    ("agent", "interval = true", "[agent] interval: expected a number, not a boolean (true)"),
    ("agent", 'interval = "fast"', "'fast' is not a number from 0.1 to 60 s"),
    ("agent", "listen = 9401", "[agent] listen: expected a string, not an integer (9401)"),
    ("analyzer", 'engine = "proc"', "'proc' is not one of process, thread"),
    ("analyzer", "alertmanager = 5", "expected an array of strings, not an integer (5)"),
    ("analyzer", 'dry_run = "yes"', "expected true or false, not a string ('yes')"),
    ("analyzer", 'host_cooldown = "soon"', "'soon' is not a duration like 90s, 15m, 1h, 2d"),
    ("up", 'log_level = "loud"', "[up] log_level: 'loud' is not one of debug, info, warning, error"),
    ("agent", "duration = 0", "no time at all"),
])
def test_values_pass_the_flags_own_checks(tmp_path, table, line, words):
    f = write(tmp_path / "g.toml", f"[{table}]\n{line}\n")
    said = problems(f)
    assert len(said) == 1 and said[0].startswith(f"{f}: [{table}] ") and words in said[0], said


def test_values_come_out_as_the_flags_would_store_them(tmp_path):
    f = write(tmp_path / "g.toml", '[analyzer]\nwindow = 2\nhost_cooldown = "10m"\nretention = 86400\n'
                                   'alert_webhook = "http://hook.example/x"\nno_rollup = true\njson_logs = false\n'
                                   '[agent]\nflush-interval = 5\nprofiler = ["h:1", "h:2"]\nkubelet_socket = ""\n')
    ns, res = resolved(["analyzer"], config=f)
    assert (ns.window, ns.host_cooldown, ns.retention, ns.alert_webhook, ns.no_rollup, ns.json_logs) == (
        2.0, 600.0, 86400.0, ["http://hook.example/x"], True, False)
    assert res.settings["window"].source == f"file:{f}" and res.settings["threads"].source == "default"
    ns, _ = resolved(["agent"], config=f)
    assert (ns.flush_interval, ns.profiler, ns.kubelet_socket) == (5.0, ["h:1", "h:2"], "")


def test_unknown_keys_and_tables_are_named_with_what_was_meant(tmp_path):
    f = write(tmp_path / "g.toml", 'interval = 2\nsevrer = "a"\n[agnet]\nx = 1\n[agent]\nintervl = 2\ndb = "/x"\n'
                                   'interval = 1\nflush-interval = 1\nflush_interval = 2\n')
    said = problems(f)
    assert f"{f}: interval: unknown key; it is a setting of [agent], [up]: put it under its table" in said
    assert any(s.startswith(f"{f}: sevrer: unknown key") and "(did you mean server?)" in s for s in said)
    assert f"{f}: [agnet]: unknown table; the tables are [agent], [analyzer], [up] (did you mean [agent]?)" in said
    assert f"{f}: [agent] intervl: unknown key (did you mean interval?)" in said
    assert f"{f}: [agent] db: unknown key; it is a setting of [analyzer], [up], not of gpuscope agent" in said
    assert f"{f}: [agent] flush_interval: given twice: as flush-interval too (give one)" in said
    assert len(said) == 6, said


def test_a_file_that_is_not_toml_or_not_there_is_refused(tmp_path):
    assert problems(write(tmp_path / "g.toml", "[agent\n"))[0].startswith(f"{tmp_path / 'g.toml'}: not TOML")
    with pytest.raises(ConfigError, match=r"nowhere.toml \(--config\): no such file"):
        resolved(["agent"], config=tmp_path / "nowhere.toml")
    with pytest.raises(ConfigError, match=r"nowhere.toml \(\$GPUSCOPE_CONFIG\): no such file"):
        resolved(["agent"], {"GPUSCOPE_CONFIG": str(tmp_path / "nowhere.toml")})


def test_the_default_file_is_read_only_when_it_is_there(tmp_path, monkeypatch):
    monkeypatch.setattr(config_file, "DEFAULT_PATH", tmp_path / "gpuscope.toml")
    ns, res = resolved(["agent"])
    assert res.path is None and ns.interval == 1.0
    write(tmp_path / "gpuscope.toml", "[agent]\ninterval = 2\n", 0o644)
    ns, res = resolved(["agent"])
    assert res.path == tmp_path / "gpuscope.toml" and ns.interval == 2.0
    other = write(tmp_path / "other.toml", "[agent]\ninterval = 3\n")
    assert resolved(["agent"], {"GPUSCOPE_CONFIG": str(other)})[0].interval == 3.0


def test_flag_beats_environment_beats_file_beats_default(tmp_path):
    f = write(tmp_path / "g.toml", '[agent]\ninterval = 2\nflush_interval = 3\nbuffer_samples = 1000\n'
                                   'serving = ["http://a:1=/t@0"]\n')
    env = {"GPUSCOPE_AGENT_INTERVAL": "4", "GPUSCOPE_AGENT_FLUSH_INTERVAL": "5",
           "GPUSCOPE_AGENT_SERVING": "http://b:1=/t@0 http://c:1=/u"}
    ns, res = resolved(["agent", "--interval", "1"], env, f)       # 1 is the default: given, it still wins
    src = {k: e.source for k, e in res.settings.items()}
    assert (ns.interval, src["interval"]) == (1.0, "flag")
    assert (ns.flush_interval, src["flush_interval"]) == (5.0, "env:GPUSCOPE_AGENT_FLUSH_INTERVAL")
    assert (ns.buffer_samples, src["buffer_samples"]) == (1000, f"file:{f}")
    assert (ns.capture_budget_mb, src["capture_budget_mb"]) == (2048, "default")
    assert ns.serving == ["http://b:1=/t@0", "http://c:1=/u"]                   # a list replaces, never merges
    ns, _ = resolved(["agent", "--serving", "http://d:1=/v"], env, f)
    assert ns.serving == ["http://d:1=/v"]
    # the global flags that shape logs are keys of each table too
    ns, res = resolved(["--log-level", "error", "up"], {"GPUSCOPE_UP_LOG_LEVEL": "debug",
                                                        "GPUSCOPE_UP_JSON_LOGS": "yes"})
    assert (ns.log_level, ns.json_logs, res.settings["json_logs"].source) == ("error", True,
                                                                              "env:GPUSCOPE_UP_JSON_LOGS")


def test_the_environment_is_checked_and_strangers_in_it_are_said(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolved(["agent"], {"GPUSCOPE_AGENT_INTERVAL": "0", "GPUSCOPE_AGENT_INSECURE": "maybe"})
    assert sorted(map(str, err.value.problems)) == [
        "$GPUSCOPE_AGENT_INSECURE: 'maybe' is not one of 1, 0, true, false, yes, no, on, off",
        "$GPUSCOPE_AGENT_INTERVAL: '0' is not a number from 0.1 to 60 s"]
    # not refused: the environment is shared; the units' extra flags and Kubernetes' service links are not ours
    _, res = resolved(["analyzer"], {"GPUSCOPE_ANALYZER_WINDOWS": "3", "GPUSCOPE_ANALYZER_ARGS": "--window 3",
                                     "GPUSCOPE_ANALYZER_SERVICE_HOST": "10.0.0.1",
                                     "GPUSCOPE_ANALYZER_PORT_9403_TCP_ADDR": "10.0.0.1",
                                     "GPUSCOPE_ANALYZER_PORT": "tcp://10.0.0.1:9403"})
    assert res.warnings == ["$GPUSCOPE_ANALYZER_WINDOWS is not a setting of gpuscope analyzer; ignored "
                            "(did you mean GPUSCOPE_ANALYZER_WINDOW?)"]


def test_insecure_and_tls_from_different_sources_the_higher_wins(tmp_path):
    """A file made for the fleet (TLS) runs with --insecure on a developer's
    loopback instead of 'cannot be combined', and the other way round."""
    f = write(tmp_path / "g.toml", f'[analyzer]\ntls_dir = "{tmp_path / "no-tls"}"\ntokens = "/none"\n')
    ns, res = resolved(["analyzer", "--insecure"], config=f)
    assert (ns.insecure, ns.tls_dir, ns.tokens) == (True, None, None)
    assert res.settings["tls_dir"].note == f"file:{f} set aside: insecure from flag"
    pki = tmp_path / "pki"
    from gpuscope.security import certs
    certs.create_ca(pki)
    certs.issue_server(pki, dns=["localhost"])
    f = write(tmp_path / "g.toml", "[analyzer]\ninsecure = true\n")
    ns, res = resolved(["analyzer"], {"GPUSCOPE_ANALYZER_TLS_DIR": str(pki)}, f)
    assert (ns.insecure, ns.tls_dir) == (False, str(pki)) and "set aside" in res.settings["insecure"].note
    f = write(tmp_path / "g.toml", f'[analyzer]\ninsecure = true\ntls_dir = "{pki}"\n')
    with pytest.raises(ConfigError, match=r"\[analyzer\] insecure: cannot be combined with .*\[analyzer\] tls_dir"):
        resolved(["analyzer"], config=f)


def test_paths_the_configuration_names_are_checked_before_start(tmp_path):
    afile = write(tmp_path / "plain", "x")
    f = write(tmp_path / "g.toml", f'[analyzer]\ndb = "{afile}/g.duckdb"\ntls_dir = "{tmp_path / "tls"}"\n'
                                   f'tokens = "{tmp_path / "tokens"}"\n[agent]\ncapture_dir = "{afile}/c"\n'
                                   f'cert = "{tmp_path / "agent.pem"}"\n')
    said = problems(f)
    assert f"{f}: [analyzer] db: {afile} is not a directory" in said
    assert f"{f}: [analyzer] tls_dir: {tmp_path / 'tls'}: no such directory (`gpuscope certs init DIR` makes one)" \
        in said
    assert any(s.startswith(f"{f}: [analyzer] tokens: tokens file {tmp_path / 'tokens'}: no such file") for s in said)
    assert f"{f}: [agent] capture_dir: cannot create {afile}/c: {afile} is not a directory" in said
    assert f"{f}: [agent] cert: {tmp_path / 'agent.pem'}: no such file" in said
    assert len(said) == 5, said
    # what the commands check where they use it, checked before start when it comes from the file
    f = write(tmp_path / "g.toml", '[agent]\nlisten = "nowhere"\nanalyzer = "a:b"\nsource = "bogus"\n'
                                   '[up]\nsource = "replay:/none.csv"\nmetrics_listen = "127.0.0.1:9464"\n')
    assert problems(f) == [f"{f}: [agent] listen: 'nowhere' is not HOST:PORT",
                           f"{f}: [agent] analyzer: 'a:b' is not HOST:PORT",
                           f"{f}: [agent] source: 'bogus', expected nvml, dcgm[:HOST[:PORT]], dcgm-exporter:URL, "
                           "replay:FILE or auto",
                           f"{f}: [up] source: /none.csv: no such file"]
    # a DB whose directory is still to be made is fine (the analyzer makes it), and so is `up`'s TLS directory
    f = write(tmp_path / "g.toml", f'[analyzer]\ndb = "{tmp_path}/new/g.duckdb"\n[up]\ntls_dir = "{tmp_path}/t"\n')
    assert problems(f) == []
    # the fleet tier (found in a trial: config check passed all of these)
    f = write(tmp_path / "g.toml", f'[analyzer]\npublish = "s3://u:p@bucket/x"\n')
    assert problems(f) == [f"{f}: [analyzer] publish: s3://bucket/...: credentials and options go in the "
                           "environment (docs/fleet.md), not in the URL",
                           f"{f}: [analyzer] publish: needs cluster too: every file is partitioned by cluster"]
    f = write(tmp_path / "g.toml", f'[analyzer]\npublish = "ftp://x/y"\ncluster = "c1"\n'
                                   f'publish_state = "{afile}/state"\n')
    assert problems(f) == [f"{f}: [analyzer] publish: 'ftp://x/y': expected a directory, s3://BUCKET/PREFIX or "
                           "gs://BUCKET/PREFIX",
                           f"{f}: [analyzer] publish_state: cannot create {afile}/state: {afile} is not a directory"]
    f = write(tmp_path / "g.toml", f'[analyzer]\npublish = "{afile}/fleet"\ncluster = "c1"\n')
    assert problems(f) == [f"{f}: [analyzer] publish: cannot create {afile}/fleet: {afile} is not a directory"]
    # flags keep their own behaviour: checked where they are used, as before
    resolved(["analyzer", "--db", f"{afile}/g.duckdb"])


def test_secrets_stay_out_of_files_others_can_read_and_are_never_shown(tmp_path):
    f = write(tmp_path / "g.toml", f'[analyzer]\nalert_webhook = ["{SLACK}"]\n', 0o644)
    assert problems(f) == [f"{f}: [analyzer] alert_webhook: holds a credential and {f} is accessible to group or "
                           f"others (mode 0644): run `chmod 600 {f}`, or put the value in a file of its own named "
                           "by alert_webhook_file"]
    f.chmod(0o600)
    ns, res = resolved(["analyzer"], config=f)
    assert ns.alert_webhook == [SLACK] and res.shown("alert_webhook") == f"<redacted from {f}>"
    # a URL without a key is no secret: fine in a readable file, and shown
    f = write(tmp_path / "g.toml", '[analyzer]\nalertmanager = "http://alertmanager:9093"\n', 0o644)
    assert resolved(["analyzer"], config=f)[1].shown("alertmanager") == ["http://alertmanager:9093"]
    # ... or a file of their own, held to the tokens file's rule
    hooks = write(tmp_path / "hooks", f"# the team's channel\n{SLACK}\n\nhttp://other.example/h?key=1\n", 0o640)
    f = write(tmp_path / "g.toml", f'[analyzer]\nalert_webhook_file = "{hooks}"\n', 0o644)
    assert problems(f) == [f"{f}: [analyzer] alert_webhook_file: {hooks} is accessible to group or others (mode "
                           f"0640); run `chmod 600 {hooks}`"]
    hooks.chmod(0o600)
    ns, res = resolved(["analyzer"], config=f)
    assert ns.alert_webhook == [SLACK, "http://other.example/h?key=1"]
    assert res.shown("alert_webhook") == f"<redacted from {hooks}>"
    ns, res = resolved(["analyzer"], {"GPUSCOPE_ANALYZER_ALERT_WEBHOOK_FILE": str(hooks)})
    assert ns.alert_webhook[0] == SLACK and res.settings["alert_webhook"].source == \
        "env:GPUSCOPE_ANALYZER_ALERT_WEBHOOK_FILE"
    _, res = resolved(["analyzer", "--alert-webhook", SLACK])
    assert res.shown("alert_webhook") == "<redacted from the command line>"
    # a key that looks like no key (found in a trial: shown in full)
    _, res = resolved(["analyzer", "--alert-webhook", "https://hooks.example/T1/B1/secretsecretsecret"])
    assert res.shown("alert_webhook") == "<redacted from the command line>"
    f = write(tmp_path / "g.toml", 'token = "s3cr3t"\n')
    assert problems(f) == [f"{f}: token: a token is never written in this file: put it in a file only you can read "
                           "(chmod 600) and name that file with token_file"]
    f = write(tmp_path / "g.toml", f'[analyzer]\nalert_webhook_file = "{hooks}"\nalert_webhook = "http://x/"\n')
    assert problems(f) == [f"{f}: [analyzer] alert_webhook: given twice: as alert_webhook_file too (give one)"]


def test_on_call_commands_read_the_same_file_and_leave_the_tables_alone(tmp_path, monkeypatch):
    f = write(tmp_path / "g.toml", 'server = "analyzer.example"\n[analyzer]\nwindow = 2\n[agent]\nintervl = 1\n')
    monkeypatch.setenv("GPUSCOPE_CONFIG", str(f))
    assert client_config.load_config() == {"server": "analyzer.example"}
    ns, _ = resolved(["analyzer"], {"GPUSCOPE_CONFIG": str(f)})
    assert ns.window == 2.0
    # ... and their keys are checked with the file's
    f.write_text('server = ""\n')
    assert problems(f) == [f"{f}: server: server must be a non-empty string, not ''"]


def test_values_from_the_environment_take_the_flags_forms():
    s = config_schema.settings(build_parser(), "analyzer")
    assert config_schema.from_text(s["dry_run"], "on") is True and config_schema.from_text(s["dry_run"], "0") is False
    assert config_schema.from_text(s["alertmanager"], " http://a:1  http://b:2 ") == ["http://a:1", "http://b:2"]
    assert config_schema.from_text(s["retention"], "36h") == 129600.0
    with pytest.raises(ValueError, match="is not a whole number"):
        config_schema.from_text(s["threads"], "2.5")


def test_flags_given_tells_a_default_from_a_flag_that_repeats_it():
    assert config_file.flags_given(build_parser, ["analyzer", "--window", "5", "--insecure"]) >= {"window", "insecure"}
    assert "window" not in config_file.flags_given(build_parser, ["analyzer"])
    assert "window" not in config_file.flags_given(build_parser, ["up"])    # up's set_defaults(window=None)


def test_the_shipped_example_holds_every_default_the_flags_have(tmp_path):
    """Uncommented, each line of deploy/gpuscope.toml that has a default
    passes `config check` and gives the flag's own default."""
    from tests.conftest import ROOT
    text = (ROOT / "deploy" / "gpuscope.toml").read_text()
    assert tomllib.loads(text) == {"agent": {}, "analyzer": {}, "up": {}}        # everything commented out
    placeholder = ('"HOST', '"DIR"', '"FILE"', '"NAME"', '"DURATION"', '["', '"SOURCE"', '"CAPTURE_DIR"',
                   '"INTERVAL"', '"WINDOW"', '"URL"')
    lines = [ln[1:] if ln.startswith("#") and " = " in ln and not ln[1:].split(" = ")[1].startswith(placeholder)
             and not ln.startswith(("#json_logs", "#alert_webhook_file", "#alertmanager_file")) else ln
             for ln in text.splitlines()]
    f = write(tmp_path / "all.toml", "\n".join(lines))
    assert problems(f) == []
    doc = tomllib.loads(f.read_text())
    parser = build_parser()
    for table in config_file.TABLES:
        ns = parser.parse_args([table])
        schema = config_schema.settings(parser, table)
        assert doc[table], table
        for key, value in doc[table].items():
            if key == "db" and os.environ.get("XDG_STATE_HOME"):
                continue                              # the example says the default of an unset one
            value = config_schema.from_toml(schema[key], value)
            value = os.path.expanduser(value) if isinstance(value, str) else value
            assert value == getattr(ns, schema[key].dest), (table, key)
