"""deploy/overlays/fleet: the replicas and vLLM's router beside them validate offline, and the router finds
the replicas by their own labels and port and reads GrowPage's load."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kustomize_render import build, kustomize_command, render_in_python
from monitoring_paths import DEPLOY_DIR

from growpage import catalog

KUBERNETES_VERSION = "1.30.0"
FLEET = DEPLOY_DIR / "overlays" / "fleet"
ROUTER_KINDS = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"}


@pytest.fixture(scope="module")
def fleet() -> list[dict]:
    return build(FLEET)


def _named(documents: list[dict], kind: str, name: str) -> dict:
    [document] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return document


def _key(document: dict) -> tuple[str, str]:
    return document["kind"], document["metadata"]["name"]


@pytest.mark.skipif(kustomize_command(FLEET) is None, reason="kustomize / kubectl not installed")
def test_python_render_matches_kustomize(fleet):
    assert sorted(map(_key, render_in_python(FLEET))) == sorted(map(_key, fleet))


def test_the_fleet_is_the_phase3_replicas_plus_the_router(fleet):
    replicas = build(DEPLOY_DIR / "overlays" / "phase3-everywhere")
    router = [d for d in fleet if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm-router"]
    assert {d["kind"] for d in router} == ROUTER_KINDS
    assert sorted(map(_key, fleet)) == sorted(map(_key, replicas + router))
    for document in router:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_router_discovers_the_replicas_and_polls_their_load(fleet):
    replicas = _named(fleet, "Deployment", "vllm-reasoning")
    [container] = _named(fleet, "Deployment", "vllm-router")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--policy=power_of_two" in args and "--service-discovery" in args
    selector = args[args.index("--selector") + 1]
    key, value = selector.split("=")
    assert replicas["spec"]["template"]["metadata"]["labels"][key] == value
    [vllm] = replicas["spec"]["template"]["spec"]["containers"]
    replica_port = next(a for a in vllm["args"] if a.startswith("--port=")).split("=")[1]
    assert f"--service-discovery-port={replica_port}" in args
    # the replicas answer the router's poll: the plugin's endpoint is loaded there
    assert {"name": "VLLM_PLUGINS", "value": "growpage"} in vllm["env"]
    assert catalog.LOAD_PATH == "/get_load"


def test_the_router_may_read_pods_and_nothing_else(fleet):
    role = _named(fleet, "Role", "vllm-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _named(fleet, "RoleBinding", "vllm-router")
    pod = _named(fleet, "Deployment", "vllm-router")["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == "vllm-router"
    assert pod["securityContext"]["runAsNonRoot"] is True
