"""deploy/: the three rollout overlays and the once-per-cluster monitoring build, validate offline and
agree with the catalog."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml
from kustomize_render import build, kustomize_command, render_in_python
from monitoring_paths import DEPLOY_DIR

from growpage import catalog
from growpage.config import Mode, load_config
from growpage.monitoring.dashboards import dashboards
from growpage.monitoring.rules_file import rule_groups
from support.promstack import run_tool

KUBERNETES_VERSION = "1.30.0"  # schemas shipped with kubernetes-validate; strict: unknown fields fail
BUILT_IN_KINDS = {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
OVERLAYS = {"phase1-monitor": Mode.MONITOR, "phase2-namespaces": Mode.ENFORCE,
            "phase3-everywhere": Mode.ENFORCE}


MONITORING = DEPLOY_DIR / "monitoring"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: build(DEPLOY_DIR / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def monitoring() -> list[dict]:
    return build(MONITORING)


def _one(documents: list[dict], kind: str, name: str | None = None) -> dict:
    [document] = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return document


def _container(documents: list[dict]) -> dict:
    [container] = _one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _normalized(documents: list[dict]) -> dict:
    """Order-free view: kustomize and the Python render may order named list items differently."""
    def norm(value):
        if isinstance(value, dict):
            return {k: norm(v) for k, v in value.items()}
        if isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value):
            return {i["name"]: norm(i) for i in value}
        return [norm(v) for v in value] if isinstance(value, list) else value
    return {(d["kind"], d["metadata"]["name"]): norm(d) for d in documents}


@pytest.mark.skipif(kustomize_command(DEPLOY_DIR) is None, reason="kustomize / kubectl not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_python_render_matches_kustomize(rendered, overlay):
    # `rendered` is kustomize's output here; the Python render is what runs where it is missing.
    assert _normalized(render_in_python(DEPLOY_DIR / "overlays" / overlay)) == _normalized(rendered[overlay])


@pytest.mark.skipif(kustomize_command(DEPLOY_DIR) is None, reason="kustomize / kubectl not installed")
def test_python_render_matches_kustomize_for_the_monitoring_component(monitoring):
    assert _normalized(render_in_python(MONITORING)) == _normalized(monitoring)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cluster_wide_monitoring_is_not_in_an_application_overlay(rendered, overlay):
    # Two models would otherwise install two copies of the same cluster-wide rules and dashboards.
    kinds = {d["kind"] for d in rendered[overlay]}
    assert "PrometheusRule" not in kinds
    assert not [d for d in rendered[overlay] if d["metadata"].get("labels", {}).get("grafana_dashboard")]


def test_monitoring_holds_the_rules_and_dashboards_once(monitoring):
    # three dashboards (overview, troubleshooting, fleet), the datasource with exemplar links, the rules
    assert sorted(d["kind"] for d in monitoring) == ["ConfigMap"] * 4 + ["PrometheusRule"]
    for document in monitoring:
        if document["kind"] == "ConfigMap":
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_kinds_validate_against_the_kubernetes_schema(rendered, overlay):
    kinds = {d["kind"] for d in rendered[overlay]}
    assert BUILT_IN_KINDS | {"ServiceMonitor"} == kinds
    for document in rendered[overlay]:
        if document["kind"] in BUILT_IN_KINDS:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_configures_its_rollout_phase(rendered, overlay):
    container = _container(rendered[overlay])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["VLLM_PLUGINS"] == "growpage"
    [additional] = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--additional-config=")]
    config = load_config(env=env, overrides=json.loads(additional)["growpage"])  # validates, as the plugin will
    assert config.mode is OVERLAYS[overlay]
    if overlay == "phase2-namespaces":
        assert config.enforce_namespaces
    if overlay == "phase3-everywhere":
        assert config.enforce_namespaces == () and config.max_growth_rate == 0.3


def test_scrape_objects_match_the_catalog(rendered):
    documents = rendered["phase1-monitor"]
    service = _one(documents, "Service")
    monitor = _one(documents, "ServiceMonitor", "vllm-growpage")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == catalog.METRICS_PATH
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == catalog.SCRAPE_JOB
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert (port["name"], port["port"]) == (endpoint["port"], 8000)
    assert _container(documents)["ports"][0]["containerPort"] == 8000


def test_vllms_own_metrics_are_scraped_as_their_own_job(rendered):
    documents = rendered["phase1-monitor"]
    vllm = _one(documents, "ServiceMonitor", "vllm")
    [endpoint] = vllm["spec"]["endpoints"]
    assert endpoint["path"] == catalog.VLLM_METRICS_PATH and endpoint["port"] == "http"
    assert {"targetLabel": "job", "replacement": catalog.VLLM_SCRAPE_JOB} in endpoint["relabelings"]
    assert vllm["spec"]["selector"]["matchLabels"].items() <= _one(documents, "Service")["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_is_production_ready(rendered, overlay):
    documents = rendered[overlay]
    pod = _one(documents, "Deployment")["spec"]["template"]["spec"]
    container = _container(documents)
    assert pod["terminationGracePeriodSeconds"] == 60  # gpctl serve drains in 50 s inside it
    requests = container["resources"]["requests"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(requests)  # not BestEffort: not evicted first
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model loading takes minutes
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    [shm] = [v for v in pod["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    pdb = _one(documents, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == _one(documents, "Deployment")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruptions_and_rollouts_fit_one_gpu_pods(rendered, overlay):
    documents = rendered[overlay]
    deployment = _one(documents, "Deployment")["spec"]
    # A surge pod would wait for a second free GPU: replace pods one at a time instead.
    assert deployment["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    replicas = deployment["replicas"]
    hpa = _one(documents, "HorizontalPodAutoscaler")["spec"]
    pdb = _one(documents, "PodDisruptionBudget")["spec"]
    # A drain may never take the only serving pod: at least one stays, and there is more than one.
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb
    assert replicas >= 2 and hpa["minReplicas"] >= 2 and hpa["minReplicas"] <= replicas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_drains_and_has_writable_caches(rendered, overlay):
    documents = rendered[overlay]
    pod = _one(documents, "Deployment")["spec"]["template"]["spec"]
    container = _container(documents)
    assert container["command"] == ["vllm", "serve"]
    [timeout] = [int(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--shutdown-timeout=")]
    sleep_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert sleep_s + timeout < pod["terminationGracePeriodSeconds"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for variable in ("HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HF_HOME", "GROWPAGE_CACHE_DIR"):
        assert any(env[variable] == mount or env[variable].startswith(mount + "/") for mount in mounts), variable
    assert "gpctl serve" not in (DEPLOY_DIR / "base" / "deployment.yaml").read_text()


def test_hpa_and_adapter_scale_on_vllms_queue(rendered):
    documents = rendered["phase3-everywhere"]
    [metric] = _one(documents, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == catalog.HPA_METRIC and ":" not in catalog.HPA_METRIC
    assert metric["pods"]["target"] == {"type": "AverageValue",
                                        "averageValue": str(catalog.HPA_TARGET_WAITING_PER_POD)}
    adapter = yaml.safe_load(_one(documents, "ConfigMap", "growpage-prometheus-adapter-rules")["data"]["config.yaml"])
    [rule] = adapter["rules"]
    assert rule["seriesQuery"].startswith(catalog.HPA_SOURCE_SERIES + "{")
    assert rule["name"]["matches"] == f"^{catalog.HPA_SOURCE_SERIES}$" and rule["name"]["as"] == catalog.HPA_METRIC
    assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]


def test_prometheus_rule_holds_the_generated_groups_and_passes_promtool(monitoring, tmp_path):
    spec = _one(monitoring, "PrometheusRule")["spec"]
    assert spec["groups"] == rule_groups()
    rules_file = tmp_path / "prometheusrule-groups.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": spec["groups"]}))
    assert "SUCCESS" in run_tool("promtool", "check", "rules", str(rules_file)).stdout


def test_dashboard_configmaps_carry_the_generated_dashboards(monitoring):
    configmaps = [d for d in monitoring
                  if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    loaded = {name: json.loads(text) for cm in configmaps for name, text in cm["data"].items()}
    assert loaded == dashboards()


def _datasource_references(value) -> list:
    """Every ``datasource`` value in a dashboard, at any depth."""
    if isinstance(value, dict):
        found = [value["datasource"]] if "datasource" in value else []
        return found + [ref for item in value.values() for ref in _datasource_references(item)]
    return [ref for item in value for ref in _datasource_references(item)] if isinstance(value, list) else []


def test_the_datasource_is_growpages_own_and_the_dashboards_reach_it(monitoring):
    # kube-prometheus-stack provisions "Prometheus" (uid prometheus) as the default: ours must not
    # overwrite it nor become a second default.
    configmap = _one(monitoring, "ConfigMap", "growpage-grafana-datasource")
    [datasource] = yaml.safe_load(configmap["data"]["growpage-prometheus.yaml"])["datasources"]
    assert (datasource["name"], datasource["uid"], datasource["isDefault"]) == (
        "GrowPage Prometheus", "growpage-prometheus", False)
    for name, board in dashboards().items():
        [variable] = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert variable["type"] == "datasource" and variable["query"] == datasource["type"], name
        assert variable["current"].get("value") == datasource["uid"], name
        uids = {ref["uid"] for ref in _datasource_references(board) if isinstance(ref, dict)}
        assert uids <= {"${datasource}", datasource["uid"]}, (name, uids)
