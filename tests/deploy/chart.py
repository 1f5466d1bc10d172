"""The Helm chart rendered by a real helm (tests/deploy/tools.py), as
objects, and what the tests ask of them."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

from tests.conftest import ROOT

from .tools import run

CHART = ROOT / "deploy" / "helm" / "gpuscope"
# the non-default values files: chart-testing's convention, ci/*-values.yaml
VALUES = {"default": None, **{p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))}}
NAMESPACE = {"default": "gpuscope"}
# the oldest Kubernetes the chart admits (Chart.yaml kubeVersion) and the newest the validator knows
KUBE_VERSIONS = ("1.25.0", "1.37.0")


@functools.lru_cache(maxsize=None)
def _render(values: str | None, namespace: str, sets: tuple[str, ...]) -> str:
    args = ["template", "gpuscope", str(CHART), "--namespace", namespace]
    if values:
        args += ["--values", values]
    for s in sets:
        args += ["--set", s]
    return run("helm", *args).stdout


def render(name: str = "default", *sets: str, namespace: str | None = None) -> list[dict]:
    """The objects `helm template` makes with ci/NAME-values.yaml (or the
    defaults) and --set SETS."""
    path = VALUES[name]
    text = _render(str(path) if path else None, namespace or NAMESPACE.get(name, "ml-infra"), sets)
    return [d for d in yaml.safe_load_all(text) if d]


def one(objects: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict, name: str | None = None) -> dict:
    containers = pod_spec(workload)["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) in a container's args as the kubelet expands them."""
    out = []
    for a in args:
        for k, v in env.items():
            a = a.replace(f"$({k})", v)
        out.append(a)
    return out


def servicemonitor_schema() -> dict:
    return json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
