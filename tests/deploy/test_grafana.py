"""deploy/grafana/gpuscope.json against what gpuscope exports: a real
`gpuscope up` (the agent's and the analyzer's collectors, as `agent` and
`analyzer` serve them) replays the bundled recording until it has verdicts,
its /metrics is parsed, and every metric each PromQL expression of the
dashboard selects must be among the names there, with the labels it
matches on. promtool is not installable here: the metric names come out of
the expressions by a regex that knows PromQL's functions, keywords,
matchers, ranges and grouping clauses (its own test below shows what it
takes and leaves)."""
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.daemon.cliutil import VERDICTS
from gpuscope.daemon.report_html import VERDICT_COLOURS
from tests.conftest import ROOT, free_port

DASHBOARD = ROOT / "deploy" / "grafana" / "gpuscope.json"
# PromQL's aggregations, functions and keywords: never metric names
KEYWORDS = set("""sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
by without on ignoring group_left group_right bool and or unless offset atan2 abs absent absent_over_time ceil
changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year days_in_month delta deriv exp floor
histogram_quantile holt_winters hour idelta increase irate label_join label_replace ln log2 log10 minute month
predict_linear rate resets round scalar sgn sort sort_desc sqrt time timestamp vector year avg_over_time
min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time last_over_time
present_over_time label_values inf nan""".split())
# labels a series gets from its scrape, not from gpuscope: `host` by the relabelling of
# deploy/prometheus/scrape.yml, scrape-systemd.yml and the chart's agent ServiceMonitor
TARGET_LABELS = {"job", "instance", "host"}


def metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if m.group() in KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, the labels its matchers name) for each `metric{...}`."""
    return [(m.group(1), set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2))))
            for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)]


def grouped_by(expr: str) -> set[str]:
    return {l.strip() for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr) for l in m.group(1).split(",") if l.strip()}


def test_the_name_regex_takes_metrics_and_leaves_promql():
    expr = ('sum by (host, gpu) (rate(foo_total{job=~"$agents", x="y(z) bar"}[$__rate_interval])) * 1e3 '
            '+ max by (a) (bar_ratio{verdict="idle"}) / bool on(gpu) group_left() baz offset 5m - qux')
    assert metric_names(expr) == {"foo_total", "bar_ratio", "baz", "qux"}
    assert selectors(expr)[0] == ("foo_total", {"job", "x"})


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _expressions(d: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(d) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            exprs.append(re.fullmatch(r"label_values\((.*),\s*\w+\)", q).group(1))
    return exprs


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Sample name -> label names, from a running `gpuscope up`'s /metrics."""
    tmp = tmp_path_factory.mktemp("up")
    metrics = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "up", "--no-view", "--speed", "5",
                             "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{metrics}",
                             "--db", str(tmp / "g.duckdb"), "--duration", "120"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        names: dict[str, set[str]] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            names = {}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    names.setdefault(s.name, set()).update(s.labels)
            if any("1.0" in line for line in text.splitlines() if line.startswith("gpuscope_gpu_verdict{")) \
                    and "gpuscope_gpu_sm_active_ratio" in names:
                return names
        pytest.fail(f"no verdict on /metrics in 90 s: {sorted(names)[:20]}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_every_metric_the_dashboard_asks_for_is_exported(exported):
    for expr in _expressions(_dashboard()):
        missing = metric_names(expr) - set(exported)
        assert not missing, f"{missing} in {expr!r}: gpuscope exports no such metric"
        for metric, labels in selectors(expr):
            assert labels <= exported[metric] | TARGET_LABELS, (metric, labels - exported[metric], expr)
        used = {m for m in metric_names(expr)}
        for label in grouped_by(expr):
            assert any(label in exported[m] | TARGET_LABELS for m in used), (label, expr)


def test_a_misspelt_metric_would_be_caught(exported):
    assert metric_names('sum(gpuscope_findings_opened{job="x"})') - set(exported) == {"gpuscope_findings_opened"}


def test_it_shows_verdicts_over_time_findings_and_the_agents_health():
    d = _dashboard()
    used = set().union(*(metric_names(e) for e in _expressions(d)))
    assert {"gpuscope_gpu_verdict", "gpuscope_findings_open", "gpuscope_gpu_up", "gpuscope_agent_samples_total",
            "gpuscope_agent_dropped_samples_total", "gpuscope_agent_unacked_samples",
            "gpuscope_agent_send_lag_seconds", "process_cpu_seconds_total",
            "process_resident_memory_bytes"} <= used
    [timeline] = [p for p in _panels(d) if p["type"] == "state-timeline"]
    expr = timeline["targets"][0]["expr"]
    codes = {v: int(c) for v, c in re.findall(r'verdict="([^"]+)"\}\) \* (\d+)', expr)}
    assert codes == {v: i for i, v in enumerate(VERDICTS, 1)}, "one code per verdict, every verdict"
    names = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {int(k): m["text"] for k, m in names.items()} == {0: "no verdict", **{c: v for v, c in codes.items()}}


def test_the_dashboard_is_whole():
    d = _dashboard()
    panels = _panels(d)
    assert len({p["id"] for p in panels}) == len(panels)
    defined = {v["name"] for v in d["templating"]["list"]} | {"__rate_interval", "__all"}
    text = DASHBOARD.read_text()
    assert set(re.findall(r"\$\{?(\w+)", text)) <= defined
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"]


def test_verdict_colours_are_the_html_reports():
    """A verdict is one colour everywhere (daemon/report_html.py's Okabe–Ito
    table): someone who reads the report and then the dashboard must not
    have to translate."""
    [timeline] = [p for p in _panels(_dashboard()) if p["type"] == "state-timeline"]
    options = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    colours = {m["text"]: m["color"] for m in options.values()}
    assert set(VERDICT_COLOURS) == set(VERDICTS)
    for verdict in VERDICTS:
        assert colours[verdict].upper() == VERDICT_COLOURS[verdict].upper(), verdict
    # ... and in every panel drawn by verdict (found in a trial: the bar gauge and the findings' series
    # took Grafana's own palette)
    by_verdict = [p for p in _panels(_dashboard()) if any("by (verdict)" in t.get("expr", "")
                                                           for t in p.get("targets", ()))]
    assert len(by_verdict) >= 2
    for panel in by_verdict:
        fixed = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
                 for o in panel["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byName"}
        assert {v: c.upper() for v, c in fixed.items()} == {v: VERDICT_COLOURS[v].upper() for v in VERDICTS}, \
            panel["title"]
