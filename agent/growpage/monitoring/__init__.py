"""Monitoring generated from :mod:`growpage.catalog`: dashboards, rules, promtool tests,
Alertmanager routing, runbook rule blocks and Kubernetes manifests (``gpctl dashboards|alerts build``).

Modules: ``recording_rules`` and ``alert_rules`` (what to evaluate), ``alert_tests`` (promtool
scenarios), ``alertmanager`` (routing, inhibitions), ``dashboards`` (grafanalib), ``kubernetes``
(sidecar ConfigMaps), ``runbook_sections``, ``artefacts`` (write / ``--check``), ``panel_queries``
(run every panel's PromQL against a Prometheus).
"""
