"""A real Prometheus holding 30 minutes of synthetic GrowPage history, with the generated rules.

History is backfilled with ``promtool tsdb create-blocks-from openmetrics`` and ends now, so the
recording rules Prometheus evaluates at start-up already see it: panels that read recording rules
get data as well as those reading raw series.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from monitoring_paths import RULES_FILE
from synthetic_growpage import openmetrics_history

from growpage.monitoring import router_rules
from growpage.monitoring.recording_rules import recording_rule_names
from support.promstack import Prometheus, run_prometheus, run_tool, wait_until


@dataclasses.dataclass(frozen=True)
class BackfilledPrometheus:
    server: Prometheus
    at: float  # query time: after the recording rules ran, within the raw series' lookback

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="session")
def backfilled_prometheus(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("backfilled-prometheus")
    history = workdir / "history.om"
    history.write_text(openmetrics_history(end_s=round(time.time())), encoding="utf-8")
    storage = workdir / "tsdb"
    run_tool("promtool", "tsdb", "create-blocks-from", "openmetrics", str(history), str(storage))
    with run_prometheus(workdir, scrape_configs=[], rule_files=[RULES_FILE], storage_path=storage) as server:
        names = recording_rule_names() | {rule.record for rule in router_rules.recording_rules()}

        def every_rule_recorded() -> bool:
            return all(server.query(name) for name in names)
        wait_until(every_rule_recorded, timeout_s=30, what="every recording rule to have a sample")
        yield BackfilledPrometheus(server, at=time.time())
