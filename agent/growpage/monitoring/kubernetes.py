"""Generated Kubernetes manifests in deploy/components/monitoring: Grafana dashboard ConfigMaps.

(The PrometheusRule comes from :mod:`growpage.monitoring.rules_file`; everything else in deploy/
is hand-written and checked against the catalog by tests/monitoring/test_deploy.py.)
"""

from __future__ import annotations

from growpage.monitoring.dashboards import dashboards, to_json_text
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.rules_file import dump_yaml, generated_header

# Grafana's dashboard sidecar (kube-prometheus-stack, grafana helm chart) loads ConfigMaps with it.
DASHBOARD_LABEL = {"grafana_dashboard": "1"}


def dashboard_configmaps_yaml(config: MixinConfig = DEFAULT_CONFIG) -> str:
    documents = []
    for file_name, document in dashboards(config).items():
        documents.append({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{file_name.removesuffix('.json')}-dashboard",
                "labels": {**DASHBOARD_LABEL, "app.kubernetes.io/name": "growpage"},
            },
            "data": {file_name: to_json_text(document)},
        })
    return generated_header("dashboards build") + "---\n".join(dump_yaml(d) for d in documents)
