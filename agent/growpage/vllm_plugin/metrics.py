"""``growpage_vllm_decisions_degraded_total``: decisions vLLM could not enforce as decided.

The contract's ``quantize`` (and ``defer``) cannot be applied per request in vLLM: ``kv_cache_dtype``
is deployment-wide and the scheduler has no "wait for budget" state. The scheduler-side enforcer
applies ``evict`` or ``allocate`` instead (see :mod:`~growpage.vllm_plugin.enforcer`);
``growpage_decisions_total`` counts what was *enforced*, this counter counts each degradation as
``{decided, enforced}``. It lives in the plugin, not the catalog, because only the vLLM home
degrades; scraping it never raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

DEGRADED_METRIC = "growpage_vllm_decisions_degraded"


class DegradedDecisionsCollector:
    """A ``prometheus_client`` collector over ``observer.degraded_total`` (``{(decided, enforced): n}``)."""

    def __init__(self, observer: Any, model: str):
        self._observer = observer
        self._model = model

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            DEGRADED_METRIC, "Page-boundary decisions vLLM applied differently than decided (quantize and "
            "defer cannot be per-request in vLLM), by decided and enforced kind.",
            labels=("model_name", "decided", "enforced"))
        try:
            for (decided, enforced), count in sorted(dict(self._observer.degraded_total).items()):
                family.add_metric((self._model, decided, enforced), float(count))
        except Exception:  # a scrape never raises
            self._observer.stats.record_error("plugin")
        yield family
