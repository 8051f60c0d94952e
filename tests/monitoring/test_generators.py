"""Units under the generators: PromQL parsing, durations, Prometheus' humanize functions."""

from __future__ import annotations

import pytest

from growpage.monitoring.alert_templates import humanize, humanize_duration, humanize_percentage, render
from growpage.monitoring.panel_queries import substitute_variables
from growpage.monitoring.promql import duration_seconds, format_duration, le_value, metric_names


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (le) (rate(a_bucket{le="0.015", x=~"$x"}[$__rate_interval]))', {"a_bucket"}),
    ("b / on (pod) group_left(mode) c offset 5m", {"b", "c"}),
    ('label_replace(d, "namespace", "$1", "exported_namespace", "(.+)") > 1e3', {"d"}),
    ('absent(up{job="j"}) and ns:rule:rate5m', {"up", "ns:rule:rate5m"}),
    ('{__name__="e"}', {"e"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_durations_round_trip():
    assert duration_seconds("1h30m") == 5400 and format_duration(3660) == "61m" and format_duration(7200) == "2h"
    with pytest.raises(ValueError):
        duration_seconds("5 minutes")


def test_le_labels_match_prometheus_client():
    assert (le_value(0.015), le_value(1)) == ("0.015", "1.0")


@pytest.mark.parametrize(("function", "value", "text"), [
    (humanize, 1.97, "1.97"), (humanize, 0.0333, "33.3m"), (humanize, 12345, "12.35k"), (humanize, 0, "0"),
    (humanize_duration, 0.0497, "49.7ms"), (humanize_duration, 90, "1m 30s"), (humanize_duration, 2.5, "2.5s"),
    (humanize_percentage, 0.6, "60%"), (humanize_percentage, 0.09999999999999998, "10%"),
])
def test_humanize_like_prometheus(function, value, text):
    assert function(value) == text


def test_render_rejects_unknown_actions():
    assert render("{{ $labels.pod }}: {{ $value | humanizePercentage }}", {"pod": "p"}, 0.5) == "p: 50%"
    with pytest.raises(ValueError):
        render("{{ $value | printf }}", {}, 1)


def test_grafana_variables_are_substituted():
    assert substitute_variables('x{pod=~"$pod"}[${__rate_interval}]') == 'x{pod=~".*"}[5m]'
    with pytest.raises(KeyError):
        substitute_variables("$unknown")
