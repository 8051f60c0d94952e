"""deploy/overlays/fleet: the replicas and vLLM's router beside them validate offline; the router lists
every replica by a stable address (so it polls GrowPage's load), and the replicas are phase 3's pods.

vllm-router polls GET /get_load only of the workers given with --worker-urls (workers found by service
discovery are routed to but not polled), so the fleet runs its replicas as a StatefulSet behind a
headless Service; deploy/components/router alone keeps service discovery for replicas that scale.
"""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kustomize_render import build, kustomize_command, render_in_python
from monitoring_paths import DEPLOY_DIR

from growpage import catalog

KUBERNETES_VERSION = "1.30.0"
FLEET = DEPLOY_DIR / "overlays" / "fleet"
ROUTER_COMPONENT = DEPLOY_DIR / "components" / "router"
# No Role: a router given addresses reads no pods.
ROUTER_KINDS = {"ServiceAccount", "Deployment", "Service", "ServiceMonitor"}


@pytest.fixture(scope="module")
def fleet() -> list[dict]:
    return build(FLEET)


@pytest.fixture(scope="module")
def phase3() -> list[dict]:
    return build(DEPLOY_DIR / "overlays" / "phase3-everywhere")


def _named(documents: list[dict], kind: str, name: str) -> dict:
    [document] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return document


def _key(document: dict) -> tuple[str, str]:
    return document["kind"], document["metadata"]["name"]


def _args(documents: list[dict]) -> list[str]:
    [container] = _named(documents, "Deployment", "vllm-router")["spec"]["template"]["spec"]["containers"]
    return container["args"]


def _pod_template(workload: dict) -> dict:
    """The pod template with env as a mapping: its order carries no meaning (no $(VAR) refers to another)."""
    template = copy.deepcopy(workload["spec"]["template"])
    for container in template["spec"]["containers"]:
        container["env"] = {entry["name"]: entry for entry in container.get("env", [])}
    return template


@pytest.mark.skipif(kustomize_command(FLEET) is None, reason="kustomize / kubectl not installed")
def test_python_render_matches_kustomize(fleet):
    assert sorted(map(_key, render_in_python(FLEET))) == sorted(map(_key, fleet))


def test_the_fleet_is_phase3_with_addressable_replicas_plus_the_router(fleet, phase3):
    router = [d for d in fleet if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm-router"]
    assert {d["kind"] for d in router} == ROUTER_KINDS
    swapped = {("Deployment", "vllm-reasoning"), ("HorizontalPodAutoscaler", "vllm-gpu-hpa")}
    added = [("StatefulSet", "vllm-reasoning"), ("Service", "vllm-reasoning-peers")]
    assert swapped <= set(map(_key, phase3))
    assert sorted(map(_key, fleet)) == sorted([k for k in map(_key, phase3) if k not in swapped]
                                              + added + list(map(_key, router)))
    for document in [*router, *(_named(fleet, *key) for key in added)]:
        if document["kind"] != "ServiceMonitor":  # a CRD: no schema in kubernetes-validate
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_replicas_run_phase3s_pod(fleet, phase3):
    """statefulset.yaml repeats the pod of deploy/base with phase 3's settings: a change to either shows."""
    replicas = _named(fleet, "StatefulSet", "vllm-reasoning")
    deployment = _named(phase3, "Deployment", "vllm-reasoning")
    assert _pod_template(replicas) == _pod_template(deployment)
    assert replicas["spec"]["selector"] == deployment["spec"]["selector"]
    assert replicas["metadata"]["annotations"] == deployment["metadata"]["annotations"]  # the rollout phase
    # the PodDisruptionBudget and the scraped Service still select these pods
    labels = replicas["spec"]["template"]["metadata"]["labels"]
    for kind, name in (("PodDisruptionBudget", "vllm-reasoning"), ("Service", "vllm-service")):
        selector = _named(fleet, kind, name)["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), (kind, name)


def test_the_router_lists_every_replica_by_address_and_polls_its_load(fleet):
    replicas = _named(fleet, "StatefulSet", "vllm-reasoning")
    peers = _named(fleet, "Service", "vllm-reasoning-peers")
    args = _args(fleet)
    assert "--policy=power_of_two" in args and "--service-discovery" not in args
    [vllm] = replicas["spec"]["template"]["spec"]["containers"]
    port = next(a for a in vllm["args"] if a.startswith("--port=")).split("=")[1]
    start = args.index("--worker-urls") + 1
    urls = args[start:next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))]
    name, service = replicas["metadata"]["name"], replicas["spec"]["serviceName"]
    assert urls == [f"http://{name}-{ordinal}.{service}:{port}" for ordinal in range(replicas["spec"]["replicas"])]
    # the names resolve: a headless Service of that name selects the replicas, before they are ready
    assert service == peers["metadata"]["name"] and peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["selector"] == replicas["spec"]["selector"]["matchLabels"]
    assert peers["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in peers["spec"]["ports"]] == [int(port)]
    # they answer the poll: the plugin (and its /get_load route) is loaded there
    assert {"name": "VLLM_PLUGINS", "value": "growpage"} in vllm["env"]
    assert catalog.LOAD_PATH == "/get_load"


def test_the_peers_service_is_not_a_second_scrape_target(fleet):
    peers = _named(fleet, "Service", "vllm-reasoning-peers")
    for monitor in (d for d in fleet if d["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert not selector.items() <= peers["metadata"]["labels"].items(), monitor["metadata"]["name"]


def test_the_fleets_router_reads_no_pods(fleet):
    assert not [d for d in fleet if d["kind"] in ("Role", "RoleBinding")]
    pod = _named(fleet, "Deployment", "vllm-router")["spec"]["template"]["spec"]
    assert _named(fleet, "ServiceAccount", pod["serviceAccountName"])
    assert pod["securityContext"]["runAsNonRoot"] is True


def _component_documents() -> list[dict]:
    return [doc for path in sorted(Path(ROUTER_COMPONENT).glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_router_component_alone_discovers_replicas_and_may_read_pods_only(phase3):
    """For replicas that scale (a Deployment with its HPA): found by label, routed by requests in flight."""
    documents = _component_documents()
    args = _args(documents)
    assert "--service-discovery" in args and "--worker-urls" not in args
    key, value = args[args.index("--selector") + 1].split("=")
    replicas = _named(phase3, "Deployment", "vllm-reasoning")
    assert replicas["spec"]["template"]["metadata"]["labels"][key] == value
    [vllm] = replicas["spec"]["template"]["spec"]["containers"]
    port = next(a for a in vllm["args"] if a.startswith("--port=")).split("=")[1]
    assert f"--service-discovery-port={port}" in args
    role = _named(documents, "Role", "vllm-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _named(documents, "RoleBinding", "vllm-router")
    assert binding["subjects"][0]["name"] == "vllm-router"


def _flag(args: list[str], name: str) -> str:
    [value] = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    return value


@pytest.mark.parametrize("where", ["component", "fleet"])
def test_the_routers_scrape_target_resolves_to_its_prometheus_port(fleet, where):
    """ServiceMonitor port -> Service port -> container port -> the port the router serves metrics on."""
    documents = _component_documents() if where == "component" else fleet
    monitor = _named(documents, "ServiceMonitor", "vllm-router")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == catalog.ROUTER_METRICS_PATH
    assert {"targetLabel": "job", "replacement": catalog.ROUTER_SCRAPE_JOB} in endpoint["relabelings"]
    service = _named(documents, "Service", "vllm-router")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    deployment = _named(documents, "Deployment", "vllm-router")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    [container_port] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    args = _args(documents)
    assert container_port["containerPort"] == int(_flag(args, "prometheus-port")) == catalog.ROUTER_METRICS_PORT
    assert _flag(args, "prometheus-host") == "0.0.0.0"  # reachable from Prometheus, not loopback only
    # only the router's Service: the replicas' ServiceMonitors never select it, nor this one theirs
    for other in (d for d in documents if d["kind"] == "ServiceMonitor" and d is not monitor):
        assert not other["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
