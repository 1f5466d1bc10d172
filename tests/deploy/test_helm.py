"""The Helm chart (deploy/helm/gpuscope), rendered by a real helm for its
default values and for each non-default values file (ci/*-values.yaml):
every object is valid against the Kubernetes API's schemas (strict, at the
oldest and newest versions the chart admits), ServiceMonitors against the
fields of prometheus-operator's CRD, and the objects say what the issue
asks: agents on GPU nodes only, with the host's PIDs and the kubelet's
socket, no GPU taken, no privilege beyond need; one analyzer on a volume;
ingress only from agents, on-call tools and Prometheus; mutual TLS everywhere.
Every flag the chart passes is parsed by gpuscope's own command line."""
import copy
import shlex

import jsonschema
import kubernetes_validate
import pytest

from gpuscope.collectors.kubelet import DEFAULT_SOCKET
from gpuscope.daemon.cli import build_parser

from .chart import CHART, KUBE_VERSIONS, VALUES, container, expand, one, pod_spec, render, servicemonitor_schema
from .tools import run

NODE_ENV = {"NODE_NAME": "gpu-node-1", "NODE_IP": "10.0.0.7"}


@pytest.fixture(params=sorted(VALUES), ids=str)
def objects(request):
    return render(request.param)


def _validate(obj: dict, version: str) -> None:
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, servicemonitor_schema())
    else:
        kubernetes_validate.validate(obj, version, strict=True)


def test_there_is_a_non_default_values_file():
    assert len(VALUES) >= 2, VALUES


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint_strict(values):
    args = ["lint", "--strict", str(CHART)]
    if VALUES[values]:
        args += ["--values", str(VALUES[values])]
    run("helm", *args)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_is_valid_against_the_api_schemas(objects, version):
    kinds = sorted({o["kind"] for o in objects})
    for must in ("DaemonSet", "StatefulSet", "Service", "ServiceAccount", "NetworkPolicy"):
        assert must in kinds
    for obj in objects:
        _validate(obj, version)


def test_the_validation_can_fail():
    """A misspelt field, a wrong type, a CRD field that does not exist: each is refused."""
    objs = render("default", "serviceMonitor.enabled=true")
    ds = copy.deepcopy(one(objs, "DaemonSet"))
    pod_spec(ds)["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE_VERSIONS[-1], strict=True)
    sts = copy.deepcopy(one(objs, "StatefulSet"))
    sts["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[0], strict=True)
    sm = copy.deepcopy(one(objs, "ServiceMonitor", "-agent"))
    sm["spec"]["endpoints"][0]["tlsconfig"] = sm["spec"]["endpoints"][0].pop("tlsConfig")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, servicemonitor_schema())


def test_a_misspelt_value_is_refused():
    out = run("helm", "template", "gpuscope", str(CHART), "--set", "agent.jobDiscvery=true", check=False)
    assert out.returncode != 0 and "jobDiscvery" in out.stderr, out.stderr


# -- the agent ------------------------------------------------------------------------------

def test_the_agent_runs_on_gpu_nodes_without_taking_a_gpu(objects):
    ds = one(objects, "DaemonSet", "-agent")
    spec = pod_spec(ds)
    assert spec["nodeSelector"], "agents on GPU nodes only"
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" for t in spec["tolerations"])
    for c in spec["containers"]:
        res = c["resources"]
        assert res["requests"] and res["limits"]["memory"]
        assert not any(k.startswith("nvidia.com/") for part in res.values() for k in part), \
            "requesting a GPU would take it from the jobs"
    env = {e["name"]: e.get("value") for e in container(ds)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_the_agent_sees_the_hosts_processes_and_the_kubelets_socket(objects):
    ds = one(objects, "DaemonSet", "-agent")
    spec = pod_spec(ds)
    assert spec["hostPID"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    socket_dir = DEFAULT_SOCKET.rpartition("/")[0]
    assert volumes["pod-resources"]["hostPath"]["path"] in (socket_dir, "/var/snap/microk8s/common" + socket_dir)
    assert mounts["pod-resources"]["mountPath"] == socket_dir and mounts["pod-resources"]["readOnly"] is True
    ns = build_parser().parse_args(expand(container(ds)["args"], NODE_ENV))
    assert ns.kubelet_socket == DEFAULT_SOCKET
    assert ns.host == NODE_ENV["NODE_NAME"], "the agent speaks for its node, which its certificate names"


def test_containers_hold_no_privilege_beyond_need(objects):
    for workload in (one(objects, "DaemonSet"), one(objects, "StatefulSet")):
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostIPC")
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert not sc.get("privileged")
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert set(sc["capabilities"].get("add", [])) <= {"SYS_PTRACE", "DAC_READ_SEARCH"}
            if workload["kind"] == "StatefulSet":
                assert "add" not in sc["capabilities"]
    sts = one(objects, "StatefulSet")
    assert pod_spec(sts)["securityContext"]["runAsNonRoot"] is True
    for sa in (o for o in objects if o["kind"] == "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False
    assert not [o for o in objects if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]


def test_job_discovery_adds_only_the_two_capabilities():
    caps = container(one(render("default", "agent.jobDiscovery=true"), "DaemonSet"))["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    caps = container(one(render("default"), "DaemonSet"))["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"]}


# -- the analyzer ---------------------------------------------------------------------------

def test_the_analyzer_is_one_replica_on_a_persistent_volume(objects):
    sts = one(objects, "StatefulSet", "-analyzer")
    assert sts["spec"]["replicas"] == 1
    ns = build_parser().parse_args(container(sts)["args"])
    db_dir = ns.db.rpartition("/")[0]
    mount = next(m for m in container(sts)["volumeMounts"] if m["mountPath"] == db_dir)
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert mount["name"] in claims and claims[mount["name"]]["spec"]["resources"]["requests"]["storage"]
    assert {e["name"]: e.get("value") for e in container(sts)["env"]}["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_without_persistence_the_db_lives_in_an_empty_dir():
    sts = one(render("default", "analyzer.persistence.enabled=false"), "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {v["name"]: v for v in pod_spec(sts)["volumes"]}["data"] == {"name": "data", "emptyDir": {}}


def test_services_select_their_pods_and_name_their_ports(objects):
    workloads = [o for o in objects if o["kind"] in ("DaemonSet", "StatefulSet")]
    for svc in (o for o in objects if o["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        [target] = [w for w in workloads if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        ports = {p["name"] for c in pod_spec(target)["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, (svc["metadata"]["name"], p)
    sts = one(objects, "StatefulSet")
    assert sts["spec"]["serviceName"] in {s["metadata"]["name"] for s in objects if s["kind"] == "Service"}


# -- TLS everywhere -------------------------------------------------------------------------

def test_every_link_is_mutual_tls(objects):
    for workload in (one(objects, "DaemonSet"), one(objects, "StatefulSet")):
        args = expand(container(workload)["args"], NODE_ENV)
        assert "--insecure" not in args
        ns = build_parser().parse_args(args)
        assert ns.tls_dir and ns.metrics_listen and not ns.metrics_listen.startswith("127.")
    ds_args = build_parser().parse_args(expand(container(one(objects, "DaemonSet"))["args"], NODE_ENV))
    assert ds_args.analyzer and ds_args.tls_server_name
    sts_args = build_parser().parse_args(container(one(objects, "StatefulSet"))["args"])
    assert sts_args.listen.startswith("0.0.0.0:")


@pytest.mark.parametrize("kind", ["DaemonSet", "StatefulSet"])
def test_probes_ask_grpc_health_over_mutual_tls(objects, kind):
    c = container(one(objects, kind))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        words = shlex.split(command[2]) if command[:2] == ["sh", "-c"] else command
        words = words[1:] if words[0] == "exec" else words
        assert words[0] == "gpuscope-health"
        assert all(f in words for f in ("--ca", "--cert", "--key"))
        port = build_parser().parse_args(expand(c["args"], NODE_ENV)).listen.rpartition(":")[2]
        assert words[1] == f"127.0.0.1:{port}"


# -- who may connect ------------------------------------------------------------------------

def _rules(objects, suffix):
    return one(objects, "NetworkPolicy", suffix)["spec"]["ingress"]


def test_only_agents_on_call_tools_and_prometheus_reach_the_analyzer(objects):
    sts = one(objects, "StatefulSet")
    ds = one(objects, "DaemonSet")
    np = one(objects, "NetworkPolicy", "-analyzer")
    assert np["spec"]["podSelector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    rules = _rules(objects, "-analyzer")
    for rule in rules:
        assert rule["from"], "a rule without peers would admit everyone"
        assert {p["port"] for p in rule["ports"]} <= {"grpc", "metrics", "oncall"}
    agent_rule = rules[0]
    assert agent_rule["from"][0]["podSelector"]["matchLabels"].items() <= \
        ds["spec"]["template"]["metadata"]["labels"].items()
    assert [p["port"] for p in agent_rule["ports"]] == ["grpc"]
    metrics_rules = [r for r in rules if "metrics" in {p["port"] for p in r["ports"]}]
    assert all([p["port"] for p in r["ports"]] == ["metrics"] for r in metrics_rules)


def test_an_empty_peer_list_admits_nobody():
    objs = render("default", "networkPolicy.oncallFrom=null", "networkPolicy.prometheusFrom=null")
    assert len(_rules(objs, "-analyzer")) == 1             # the agents' alone
    assert _rules(objs, "-agent") == []                    # the agents' pods: nobody


def test_on_call_rule_by_default_is_labelled_pods():
    rules = _rules(render("default"), "-analyzer")
    peers = [p for r in rules for p in r["from"]]
    assert {"namespaceSelector": {}, "podSelector": {"matchLabels": {"gpuscope.io/oncall": "true"}}} in peers


# -- Prometheus Operator --------------------------------------------------------------------

def test_service_monitors_scrape_over_tls_with_the_names_the_certificates_carry():
    objs = render("default", "serviceMonitor.enabled=true")
    services = {s["metadata"]["name"]: s for s in objs if s["kind"] == "Service"}
    for suffix, server_name in (("-analyzer", "gpuscope-analyzer.gpuscope.svc"), ("-agent", "gpuscope-agent")):
        sm = one(objs, "ServiceMonitor", suffix)
        jsonschema.validate(sm, servicemonitor_schema())
        [svc] = [s for s in services.values()
                 if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        [ep] = sm["spec"]["endpoints"]
        assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
        assert ep["scheme"] == "https" and ep["honorLabels"] is True
        tls = ep["tlsConfig"]
        assert tls["serverName"] == server_name and not tls.get("insecureSkipVerify")
        assert (tls["ca"]["secret"]["key"], tls["cert"]["secret"]["key"], tls["keySecret"]["key"]) == \
            ("ca.pem", "client.pem", "client.key")
    assert not [o for o in render("default") if o["kind"] == "ServiceMonitor"], "off unless asked: it needs the CRD"


# -- the fleet tier -------------------------------------------------------------------------

def _analyzer_ns(objects):
    return build_parser().parse_args(container(one(objects, "StatefulSet", "-analyzer"))["args"])


def test_publishing_is_off_by_default():
    objs = render("default")
    ns = _analyzer_ns(objs)
    assert ns.publish is None and ns.cluster is None
    assert [e["name"] for e in container(one(objs, "StatefulSet"))["env"]] == ["NVIDIA_VISIBLE_DEVICES"]
    assert not [sa for sa in objs if sa["kind"] == "ServiceAccount" and sa["metadata"].get("annotations")]


@pytest.mark.parametrize("values", ["fleet", "publish-dir"])
def test_publish_values_become_flags_the_analyzer_accepts(values):
    """The rendered flags parse, and make a PublishConfig as the analyzer's
    start-up does (cluster name, URL, interval checked); the objects' strict
    validation is test_every_object_is_valid_against_the_api_schemas'."""
    from gpuscope.analyzers.publish import PublishConfig

    objs = render(values)
    ns = _analyzer_ns(objs)
    assert ns.publish and ns.cluster
    PublishConfig(url=ns.publish, cluster=ns.cluster, state_dir=f"{ns.db}.publish",
                  interval_s=ns.publish_interval, delay_s=ns.publish_delay)
    data = next(m for m in container(one(objs, "StatefulSet"))["volumeMounts"] if m["name"] == "data")
    assert f"{ns.db}.publish".startswith(data["mountPath"] + "/"), "the outbox must outlive the pod, beside the DB"


def test_fleet_values_publish_to_s3_with_keys_from_a_secret():
    objs = render("fleet")
    ns = _analyzer_ns(objs)
    assert ns.publish.startswith("s3://") and ns.cluster == "us-east-h200"
    env = {e["name"]: e for e in container(one(objs, "StatefulSet"))["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[key] and env[key]["valueFrom"]["secretKeyRef"]["name"], key
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void", "the chart's own env stays"


def test_a_directory_target_is_mounted_and_the_account_annotated():
    objs = render("publish-dir")
    sts = one(objs, "StatefulSet")
    ns = _analyzer_ns(objs)
    mounts = {m["mountPath"]: m["name"] for m in container(sts)["volumeMounts"]}
    assert mounts[ns.publish] in {v["name"] for v in pod_spec(sts)["volumes"]}
    annotated = {sa["metadata"]["name"]: sa["metadata"].get("annotations") for sa in objs if sa["kind"] == "ServiceAccount"}
    assert annotated[pod_spec(sts)["serviceAccountName"]] == \
        {"iam.gke.io/gcp-service-account": "gpuscope@lab.iam.gserviceaccount.com"}
    assert annotated[pod_spec(one(objs, "DaemonSet"))["serviceAccountName"]] is None, "only the analyzer publishes"


def test_publish_without_a_cluster_is_refused_by_name():
    out = run("helm", "template", "gpuscope", str(CHART), "--set", "analyzer.publish.url=s3://b/p", check=False)
    assert out.returncode != 0 and "analyzer.publish.cluster" in out.stderr, out.stderr


def test_env_set_on_the_command_line_passes_the_schema():
    objs = render("default", "analyzer.env[0].name=AWS_REGION", "analyzer.env[0].value=us-east-1")
    env = container(one(objs, "StatefulSet"))["env"]
    assert env[-1] == {"name": "AWS_REGION", "value": "us-east-1"}
    for version in KUBE_VERSIONS:
        _validate(one(objs, "StatefulSet"), version)


@pytest.mark.parametrize("bad", ["analyzer.publish.clustr=x", "analyzer.publish.url=s3://user:pw@bucket/p",
                                 "analyzer.publish.cluster=-lead", "analyzer.env[0].nam=X",
                                 "analyzer.serviceAccount.annotation.x=y"])
def test_misspelt_or_unsafe_fleet_values_are_refused(bad):
    out = run("helm", "template", "gpuscope", str(CHART), "--set", bad, check=False)
    assert out.returncode != 0 and "schema" in out.stderr, (bad, out.stderr)
