"""How ``make test`` spreads the suite over two pytest-xdist workers (``-n 2 --dist loadfile``).

A work unit is a test file, so a module fixture (a vLLM server, a Prometheus, the game day) starts once.
Files that share an expensive session fixture form one unit (``SHARED``), so it starts once per run
rather than once per worker. Units go out longest first (``EXPECTED_S``): the longest start at once on
different workers and the many short files fill in at the end. The numbers only set the order; a wrong
or missing one costs balance, never a result.

(Not ``--dist loadgroup`` with ``xdist_group`` marks: on pytest 9.2 xdist 3.8's loadgroup no longer
groups, because it renames node ids through a field pytest stopped reading; pytest-xdist issue #1386.)
"""

from __future__ import annotations

import warnings

import pytest
from xdist.scheduler import LoadFileScheduling

# Session fixtures that start something expensive: every file that uses one must be in one unit.
SHARED_SESSION_FIXTURES = ("vllm_runs", "vllm_default_block_runs", "backfilled_prometheus")

# file -> the unit it runs in (the files that use the same session fixture)
SHARED = {
    "tests/vllm_plugin/test_vllm_engine.py": "tests/vllm_plugin/test_vllm_enforce.py",  # vllm_runs
    "tests/monitoring/test_dashboards.py": "tests/monitoring/test_runbooks.py",  # backfilled_prometheus
}

# About how long each of the longest units takes on one of two workers, in seconds (fixtures included;
# the sums of --durations=0 of a two-worker run on the 2-core AVX2 host while other jobs shared it).
EXPECTED_S = {
    "tests/vllm_plugin/test_vllm_demo.py": 540,
    "tests/bench/test_comparison_bench.py": 470,
    "tests/vllm_plugin/test_vllm_enforce.py": 370,  # and test_vllm_engine.py: vllm_runs
    "tests/monitoring/test_gameday.py": 270,
    "tests/monitoring/test_rules.py": 230,
    "tests/vllm_plugin/test_vllm_default_block.py": 210,
    "tests/vllm_plugin/test_vllm_fleet_router.py": 200,
    "tests/vllm_plugin/test_vllm_data_parallel.py": 190,
    "tests/vllm_plugin/test_vllm_deployment.py": 175,
    "tests/monitoring/test_mixin_config.py": 160,
    "tests/vllm_plugin/test_vllm_served_api.py": 120,
    "tests/engine/test_engine.py": 110,
    "tests/engine/test_server_hardening.py": 75,
    "tests/vllm_plugin/test_vllm_kv_events.py": 55,
    "tests/monitoring/test_monitoring_live_engine.py": 45,
    "tests/diagnose/test_alert_replay.py": 40,
    "tests/diagnose/test_diagnose_live_engine.py": 35,
    "tests/engine/test_llama.py": 33,
    "tests/engine/test_server.py": 31,
    "tests/monitoring/test_build_cli.py": 30,
    "tests/bench/test_fidelity.py": 30,
}


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path, path)


def order_longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` (a worker's collection, which sets the order units are handed out in) longest
    unit first, keeping the collection order within a unit and among units of unknown length; warn
    when a file uses a shared session fixture outside that fixture's unit (it would start twice)."""
    units: dict[str, set[str]] = {}
    for item in items:
        for name in SHARED_SESSION_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                units.setdefault(name, set()).add(unit_of(item.nodeid))
    for name, found in units.items():
        if len(found) > 1:
            warnings.warn(pytest.PytestWarning(
                f"{name} is used in {sorted(found)}: add them to SHARED in tests/support/xdist_groups.py, "
                "or each xdist worker starts it"), stacklevel=1)
    items.sort(key=lambda item: -EXPECTED_S.get(unit_of(item.nodeid), 0))


class GroupedFileScheduling(LoadFileScheduling):
    """xdist's ``loadfile``, with the ``SHARED`` files in one unit and the units in collection order
    (the workers' collection is already longest first; xdist's reorder would sort by test count)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
