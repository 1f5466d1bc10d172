"""deploy/prometheus/scrape.yml, checked without promtool (not installable
here): every key is one Prometheus' configuration documents for where it
sits, the keep rules select exactly the chart's metrics Service of each
component (applied to the labels Prometheus' endpoints discovery derives
from the rendered Services), and TLS is set as the ServiceMonitors set it,
with the files the Secret from make-secrets.sh holds."""
import re

import yaml

from tests.conftest import ROOT

from .chart import one, render

SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"
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


def _jobs() -> dict:
    return {j["job_name"]: j for j in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}


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


def test_every_key_is_one_prometheus_knows():
    for job in _jobs().values():
        assert set(job) <= KNOWN["scrape"], set(job) - KNOWN["scrape"]
        assert set(job["tls_config"]) <= KNOWN["tls"]
        for sd in job["kubernetes_sd_configs"]:
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
