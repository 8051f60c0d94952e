"""Real Prometheus and Alertmanager for tests: the game day's launcher (growpage.gameday.promstack)."""

from growpage.gameday.promstack import (  # noqa: F401 (re-exported for the tests)
    PATIENCE,
    Alertmanager,
    Prometheus,
    free_port,
    http_get_json,
    promtool_test_rules,
    require,
    run_alertmanager,
    run_prometheus,
    run_tool,
    wait_until,
)
