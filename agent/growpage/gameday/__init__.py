"""The game day: GrowPage's alerts, routing, runbooks and diagnose tested as incidents (``gpctl gameday``).

Tooling, not runtime: it imports the agent and the monitoring generators, and nothing in the agent
imports it. :mod:`~growpage.gameday.scenarios` says what each incident must and may page (pure);
:mod:`~growpage.gameday.runner` drives a real vLLM pod, Prometheus and Alertmanager through them.
"""
