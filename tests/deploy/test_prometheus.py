"""deploy/prometheus/scrape.yml and scrape-systemd.yml, checked without
promtool (not installable here): every key is one Prometheus' configuration
documents for where it sits, the keep rules select exactly the chart's
metrics Service of each component (applied to the labels Prometheus'
endpoints discovery derives from the rendered Services), TLS is set as the
ServiceMonitors set it, with the files the Secret from make-secrets.sh
holds, and every agent job gives its series the `host` the dashboard
groups by."""
import re

import yaml

from tests.conftest import ROOT

from .chart import one, render

SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"
SYSTEMD = ROOT / "deploy" / "prometheus" / "scrape-systemd.yml"
# From Prometheus' configuration reference (scrape_config, tls_config,
# kubernetes_sd_config, relabel_config): the keys this file may use.
KNOWN = {
    "scrape": {"job_name", "scheme", "honor_labels", "tls_config", "kubernetes_sd_configs", "relabel_configs",
               "static_configs", "scrape_interval", "scrape_timeout", "metrics_path", "metric_relabel_configs"},
    "tls": {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify", "min_version"},
    "sd": {"role", "namespaces", "selectors", "attach_metadata"},
    "relabel": {"source_labels", "separator", "regex", "modulus", "target_label", "replacement", "action"},
}
ACTIONS = {"replace", "keep", "drop", "keepequal", "dropequal", "hashmod", "labelmap", "labeldrop", "labelkeep",
           "lowercase", "uppercase"}


def _jobs(path=SCRAPE) -> dict:
    return {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}


def _sd_labels(service: dict) -> dict:
    """The labels endpoints discovery gives a target of this Service's metrics port."""
    labels = {"__meta_kubernetes_service_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
              for k, v in service["metadata"]["labels"].items()}
    labels["__meta_kubernetes_endpoint_port_name"] = "metrics"
    return labels


def _kept(job: dict, labels: dict) -> bool:
    for rule in job["relabel_configs"]:
        if rule.get("action", "replace") != "keep":
            continue
        value = rule.get("separator", ";").join(labels.get(l, "") for l in rule["source_labels"])
        if not re.fullmatch(rule["regex"], value):
            return False
    return True


def _relabel(job: dict, labels: dict) -> dict:
    """The target's labels after the job's replace rules, as Prometheus
    applies them (the regex anchored, $1 or ${1} for its groups)."""
    labels = dict(labels)
    for rule in job["relabel_configs"]:
        if rule.get("action", "replace") != "replace":
            continue
        value = rule.get("separator", ";").join(labels.get(l, "") for l in rule["source_labels"])
        m = re.fullmatch(rule.get("regex", "(.*)"), value)
        if m:
            labels[rule["target_label"]] = re.sub(r"\$\{?(\w+)\}?", lambda g: m.group(int(g.group(1))) or "",
                                                  rule.get("replacement", "$1"))
    return labels


def test_every_key_is_one_prometheus_knows():
    for job in [*_jobs().values(), *_jobs(SYSTEMD).values()]:
        assert set(job) <= KNOWN["scrape"], set(job) - KNOWN["scrape"]
        assert set(job["tls_config"]) <= KNOWN["tls"]
        for sd in job.get("kubernetes_sd_configs", []):
            assert set(sd) <= KNOWN["sd"] and sd["role"] == "endpoints"
        for rule in job["relabel_configs"]:
            assert set(rule) <= KNOWN["relabel"] and rule.get("action", "replace") in ACTIONS
            for label in rule["source_labels"]:
                assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label)


def test_each_job_keeps_exactly_its_components_metrics_service():
    objs = render("default")
    services = [o for o in objs if o["kind"] == "Service"]
    for name, component in (("gpuscope-analyzer", "analyzer"), ("gpuscope-agent", "agent")):
        job = _jobs()[name]
        kept = [s for s in services if _kept(job, _sd_labels(s))]
        assert [s["metadata"]["labels"]["app.kubernetes.io/component"] for s in kept] == [component]
        assert "metrics" in {p["name"] for p in kept[0]["spec"]["ports"]}
        assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [kept[0]["metadata"]["namespace"]]
        assert not _kept(job, {**_sd_labels(kept[0]), "__meta_kubernetes_endpoint_port_name": "grpc"})


def test_tls_is_what_the_service_monitors_use():
    objs = render("default", "serviceMonitor.enabled=true")
    for name, suffix in (("gpuscope-analyzer", "-analyzer"), ("gpuscope-agent", "-agent")):
        job = _jobs()[name]
        ep = one(objs, "ServiceMonitor", suffix)["spec"]["endpoints"][0]
        assert job["scheme"] == ep["scheme"] == "https" and job["honor_labels"] is ep["honorLabels"] is True
        tls = job["tls_config"]
        assert tls["server_name"] == ep["tlsConfig"]["serverName"] and not tls.get("insecure_skip_verify")
        files = [tls[k].rpartition("/")[2] for k in ("ca_file", "cert_file", "key_file")]
        assert files == [ep["tlsConfig"]["ca"]["secret"]["key"], ep["tlsConfig"]["cert"]["secret"]["key"],
                         ep["tlsConfig"]["keySecret"]["key"]]
        relabel = {r.get("target_label") for r in job["relabel_configs"]}
        assert ("host" in relabel) == ("relabelings" in ep)


def test_systemd_agents_are_labelled_with_their_host():
    """Without `host` the dashboard's agent panels add up every host's GPU 0
    into one line: the target's name without its port is the host's."""
    [job] = _jobs(SYSTEMD).values()
    assert job["job_name"] == "gpuscope-agent-hosts" and "kubernetes_sd_configs" not in job
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets
    for target in targets:
        host, _, port = target.rpartition(":")
        assert port == "9464", target
        assert _relabel(job, {"__address__": target})["host"] == host
    for address, host in (("gpu-host-7.example.com:9464", "gpu-host-7.example.com"), ("gpu-host-7", "gpu-host-7"),
                          ("[fd00::7]:9464", "[fd00::7]")):
        assert _relabel(job, {"__address__": address})["host"] == host


def test_systemd_agents_are_scraped_as_the_cluster_agents_are():
    """The same client certificate and the same honor_labels as scrape.yml's
    agent job; no server_name: each certificate names its host, the target."""
    [job] = _jobs(SYSTEMD).values()
    k8s = _jobs()["gpuscope-agent"]
    assert job["scheme"] == "https" and job["honor_labels"] is k8s["honor_labels"] is True
    assert job["tls_config"] == {k: v for k, v in k8s["tls_config"].items() if k != "server_name"}
