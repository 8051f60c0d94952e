"""The replica's KV headroom and router load inside vLLM (formula: :mod:`growpage.core.headroom`).

The scheduler agent (EngineCore) reads vLLM's scheduler after every step into a
:class:`~growpage.core.headroom.Headroom` (:func:`read_headroom`); its exporter serves it as
``growpage_kv_headroom_pages``, ``growpage_kv_reclaimable_pages`` and ``growpage_router_load``
(:class:`HeadroomCollector`). The API server is another process: its ``GET /get_load`` (the endpoint
plugin) reads ``growpage_router_load`` from the same exporter it relays ``/metrics/growpage`` from
(:func:`load_from_exposition`), so there is one channel between the two processes.

Scraping never raises; the reading runs on the engine's thread and the collector only reads the last
frozen :class:`Headroom`, so a scrape never walks vLLM's structures while a step changes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from growpage import catalog
from growpage.config import GrowPageConfig, Mode
from growpage.core.headroom import Floors, Headroom, RunningKV, headroom
from growpage.core.stats import StatsRecorder
from growpage.vllm_plugin.blocks import leading_shared_blocks, owns_tail, physical_tokens
from growpage.vllm_plugin.vllm_types import KVBlock, Request, Scheduler

if TYPE_CHECKING:  # for annotations only
    from prometheus_client.metrics_core import Metric


class HeadroomSource(Protocol):
    """The scheduler agent as the headroom collector reads it (a Protocol, not the class: the
    agent imports this module)."""

    @property
    def headroom(self) -> Headroom: ...

    @property
    def stats(self) -> StatsRecorder: ...


def floors_of(config: GrowPageConfig) -> Floors:
    return Floors(base_pages=config.base_pages, block_size=config.block_size, sink_tokens=config.sink_tokens,
                  recent_window_tokens=config.recent_window_tokens)


def idle_headroom(num_pages: int, config: GrowPageConfig) -> Headroom:
    """An empty pool: what the agent serves before the first step."""
    return headroom(running=0, waiting=0, free_pages=num_pages, used_pages=0, requests=(), floors=floors_of(config))


def read_headroom(scheduler: Scheduler, num_pages: int, config: GrowPageConfig, *,
                  enforced_mode: Callable[[str], Mode | None], can_compact: bool,
                  attention_tokens: Callable[[str], int] | None = None) -> Headroom:
    """The headroom of vLLM's ``scheduler`` now.

    Args:
        scheduler: vLLM's v1 ``Scheduler``.
        num_pages: usable blocks in vLLM's pool.
        config: GrowPage's config (floors).
        enforced_mode: ``request_id -> Mode`` of the requests GrowPage tracks (None: untracked).
        can_compact: the enforcer runs and its worker can move tokens (else nothing is reclaimable).
        attention_tokens: ``request_id -> int``, the tokens a request's attention needs
            (``attention_coverage``), kept like protected ones; None: none.
    """
    manager = scheduler.kv_cache_manager
    free = min(num_pages, manager.block_pool.get_num_free_blocks())
    req_to_blocks = manager.coordinator.single_type_managers[0].req_to_blocks
    requests = [running_kv(request, req_to_blocks.get(request.request_id, ()),
                           can_compact and enforced_mode(request.request_id) is Mode.ENFORCE,
                           attention_tokens(request.request_id) if attention_tokens is not None else 0)
                for request in scheduler.running]
    running, waiting = request_counts(scheduler)
    return headroom(running=running, waiting=waiting, free_pages=free, used_pages=num_pages - free,
                    requests=requests, floors=floors_of(config))


def request_counts(scheduler: Scheduler) -> tuple[int, int]:
    """Running and waiting requests as vLLM counts them (its waiting count includes requests that
    hold blocks while they wait, where the version has them)."""
    counts = getattr(scheduler, "get_request_counts", None)
    if callable(counts):
        running, waiting = counts()
        return int(running), int(waiting)
    return len(scheduler.running), len(scheduler.waiting)


def running_kv(request: Request, blocks: Iterable[KVBlock], enforced: bool, attention_tokens: int = 0) -> RunningKV:
    """One running request's record: its blocks, its physical tokens, its shared prefix run, and
    whether GrowPage may compact it now (enforced, past its prompt, nothing shared past the run)."""
    blocks = list(blocks)
    shared = leading_shared_blocks(blocks)
    physical = physical_tokens(request)
    compressible = (enforced and int(request.num_computed_tokens) >= int(request.num_prompt_tokens)
                    and owns_tail(blocks, shared))
    return RunningKV(pages_held=len(blocks), physical_tokens=physical, shared_prefix_pages=shared,
                     compressible=compressible, attention_tokens=attention_tokens)


class HeadroomCollector:
    """``growpage_kv_headroom_pages``, ``growpage_kv_reclaimable_pages`` and ``growpage_router_load``
    from the agent's last :class:`Headroom` (``agent.headroom``)."""

    def __init__(self, agent: HeadroomSource, model: str):
        self._agent = agent
        self._model = model

    def collect(self) -> Iterator[Metric]:
        # deferred: prometheus_client (and its exposition server) load with the exporter, not with this module
        from prometheus_client.core import GaugeMetricFamily

        families = {spec.name: GaugeMetricFamily(spec.name, spec.help, labels=[catalog.MODEL_LABEL])
                    for spec in catalog.ROUTER_METRICS}
        try:
            room: Headroom = self._agent.headroom
            values = {catalog.HEADROOM_PAGES.name: room.headroom_pages,
                      catalog.RECLAIMABLE_PAGES.name: room.reclaimable_pages,
                      catalog.ROUTER_LOAD.name: room.load}
            for name, value in values.items():
                families[name].add_metric([self._model], float(value))
        except Exception:  # a scrape never raises
            self._agent.stats.record_error("plugin")
            return
        yield from families.values()


def load_from_exposition(text: str) -> int | None:
    """``growpage_router_load``'s value in a Prometheus text exposition, or None when absent."""
    name = catalog.ROUTER_LOAD.name
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                return int(float(line.rsplit(maxsplit=1)[-1]))
            except ValueError:
                return None
    return None
