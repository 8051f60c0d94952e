"""GrowPage's configuration inside vLLM.

One source: ``vllm_config.additional_config["growpage"]`` (``--additional-config '{"growpage":
{...}}'`` or ``LLM(..., additional_config={"growpage": {...}})``) over the ``GROWPAGE_*``
environment over defaults, merged as :func:`growpage.config.load_config` merges them in every home. The
few keys that only mean something inside vLLM (the exporter's address, head sampling) are split off
into :class:`PluginSettings` first; ``block_size`` always follows vLLM's cache block size.

Inside vLLM's own processes settings are read through :mod:`~growpage.vllm_plugin.resolve`, which never
raises: settings GrowPage cannot honour leave it off (vLLM pages on its own) with the reason to report.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from growpage.config import DEFAULT_ATTENTION_COVERAGE, GrowPageConfig, Mode, merged_values, min_base_pages
from growpage.core.admission import ADMIT_PRIOR, LOOK_AHEAD_PRIOR, StepCosts, token_share_prior
from growpage.core.methods import VLLM_METHOD_NAMES
from growpage.errors import ConfigError

ADDITIONAL_CONFIG_KEY = "growpage"
DEFAULT_EXPORTER_PORT = 9464
NAMESPACE_ARG = "growpage_namespace"  # SamplingParams.extra_args key (``vllm_xargs`` over HTTP)
CLIENT_CHOICES = ("auto", "honour", "ignore")
MODE_ARG = "growpage_mode"  # a request may ask for less than the deployment runs
# Inside vLLM, unless set: a request is never compressed below this many tokens of KV, nor below the
# tokens holding this share of its observed attention (GrowPage's methods). The floor is small
# because the attention need, not the floor, keeps answers: measured on retrieval under KV
# pressure, GrowPage at 128 tokens + 0.95 answered 16 of 16 on both traces (vLLM alone 16, the best
# fixed cap 6) at 0.94x vLLM alone's wall time; at 1,024 tokens alone it compressed nothing there.
DEFAULT_FLOOR_TOKENS = 128
_CONFIG_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(GrowPageConfig)}


def request_namespace(extra_args: Mapping[str, Any] | None) -> str | None:
    """A request's namespace (for ``enforce_namespaces``) from ``SamplingParams.extra_args``."""
    value = (extra_args or {}).get(NAMESPACE_ARG)
    return str(value) if value not in (None, "") else None


# Monitor and enforce observe one step in this many unless observe_every_steps says otherwise. In
# monitor, observing every step cost 4-5 % of vLLM alone's tokens/s on an AVX2 host. In enforce,
# whatever the admission: every step cost a 30 ms step 3-4 ms on an AVX-512 host, and with readings
# every READINGS_EVERY_STEPS engine steps the sampled observation decides as every step does (vLLM's
# admission on two unseen decode-heavy traces: +0.003 and +0.006 nats/token against +0.003 and
# -0.001, at 1.07-1.16x the speed per round; docs/BENCHMARKS.md, "Every step observed no longer
# pays"). The step that ends a prompt is observed whatever the stride (prompt-anchored scores start
# there).
OBSERVE_EVERY_STEPS = 4
# Readings of the observed requests' summaries and attention needs, unless readings_every_steps says
# otherwise: one in this many *engine* steps, whatever the stride (a reading is a host copy, ~3 ms on
# a loaded CPU; at a stride of 4 every other observed step). A floor is raised to its request's need
# only when the need is read, so it lags a decoding request by up to this many tokens: read once in 8
# observed steps (32 engine steps at a stride of 4) the decode-heavy traces lost 2-8x more nats/token
# (+0.025-0.038 against +0.004-0.012) at the same speed; make run is about 5 % slower with fresh
# readings, its admission's prior holding longer (docs/BENCHMARKS.md, "Fresh readings").
READINGS_EVERY_STEPS = 8
MAX_OBSERVATION_WINDOW = 128  # queries per request at a prompt's end: scores grow with it, linearly
KEEP_SETS = ("request", "kv_head")  # one kept set per request, or one per KV head
# admission under enforce: measured on the host, vLLM's own, growth-aware always, or once vLLM preempts
ADMISSION_CHOICES = ("auto", "vllm", "projected", "after_preemption")
# auto looks ahead where the engine's own steps say a preemption's recompute costs more than the
# batch width holding gives up (growpage.core.admission.lookahead_pays). An AVX-512 or AMX CPU
# batches a recompute cheaply and decodes a wider batch faster, so it admits as vLLM does on
# decode-heavy work there (0.97-0.98x vLLM alone where looking ahead always ran 0.75-0.85x) and looks
# ahead on long prompts with short answers; an AVX2 CPU's step times put a recompute above the width
# (predicted, not run with the fit: docs/BENCHMARKS.md). Until the fit can price a token (8 warm
# steps, one prefilling), the same rule runs on the host's prior, a prefilled token's cost as a share
# of a step's fixed part: the median of the fits on this project's hosts, 0.9 % with AMX (0.7-1.5 %
# over about 150 fits) and 2.8 % with AVX-512 (2.5-3.5 %). A CPU without either (AVX2, or one not
# measured) looks ahead, and a prior that looks ahead still starts a request or two beyond it until
# the fit answers (growpage.vllm_plugin.admission.AdmissionGate.measuring_start); a GPU admits as
# vLLM does (it decodes a wide batch for about the cost of a narrow one; not measured here).
PRIOR_TOKEN_SHARE_BY_CPU = {"amx": 0.009, "avx512": 0.028}
VLLM_METHODS = VLLM_METHOD_NAMES
"""Methods enforce can run inside vLLM, as registered (quantizing ones cannot: ``kv_cache_dtype`` is
deployment-wide)."""


@dataclasses.dataclass(frozen=True)
class PluginSettings:
    """Knobs of the vLLM home only.

    Attributes:
        exporter_port: port of the scheduler's standalone ``/metrics/growpage`` exporter (EngineCore,
            from start-up); 0 picks a free one, -1 disables it. The API server's
            ``/metrics/growpage`` route reads this exporter.
        exporter_host: listen address of that exporter.
        observed_heads: query heads sampled per observed layer (evenly spaced).
        observe_every_steps: observe attention on one step in this many (1: every step); None:
            :data:`OBSERVE_EVERY_STEPS` in ``monitor`` and ``enforce`` whatever the admission
            (``gpctl bench vllm --part overhead`` measures monitor's cost, ``--part sampling``
            what it does to the decisions, ``--part headline`` enforce's). The summaries'
            windows count observed steps, so they span this many times more decode steps;
            boundaries are still counted every step. Under vLLM's ``FULL_AND_PIECEWISE`` (or
            ``FULL_DECODE_ONLY``) CUDA graphs the due step runs without its full graph
            (:mod:`~growpage.vllm_plugin.graph_steps`), so decode steps are observed too.
        observe_skipped_steps: with a stride above 1, keep the newest query of every request on
            the steps in between (one small copy per observed layer) and score them at the next
            observed step, each against the keys it saw then
            (:mod:`~growpage.vllm_plugin.skipped_queries`): keep sets and attention needs then
            rank by every step's attention, for about a third of what scoring every step costs
            (about 0.4 ms of a 30 ms step at 8 requests on a CPU). Off by default: on top of the
            default readings it is the *fidelity profile* (docs/BENCHMARKS.md, "Floors that keep
            up"), which costs throughput where its higher floors narrow the batch.
        grow_with_room_for_all: under enforce, while the pool holds every running request to its
            full length (prompt and ``max_tokens``) and every waiting one besides, GrowPage's
            methods grow at a boundary where they would compress, and the workers observe only the
            steps that end a prompt: nothing freed then could avoid a preemption or widen the batch,
            so GrowPage costs little more than its bookkeeping and keeps full KV's answers (at room
            for all it had cost 8 % of the step and compacted for nothing). Conservative: a request
            is counted at its ``max_tokens`` and shared prefix blocks once per request. False keeps
            the contract compressing at every boundary whatever the pool (the tests of compaction do).
        compression_gate: under enforce, GrowPage's methods compress at decode boundaries, relieve
            pressure and observe decode steps only while that work pays: for
            :data:`~growpage.core.compression_gate.GATE_WINDOW_STEPS` engine steps after the pages
            compactions hold free reach one more request's, or after vLLM preempts a request whose
            recompute (at the engine's measured price of a token) outweighs that work twice over.
            Otherwise boundaries grow, vLLM preempts as it would alone, and the workers observe
            only prompt ends; a fresh prompt is still compressed for admission. On a CPU host
            enforce had run 0.94-0.96x vLLM alone on decode-heavy traces where its compactions
            bought no step (docs/BENCHMARKS.md). False compresses wherever the contract decides.
        readings_every_steps: engine steps between two readings of the observed requests'
            summaries and attention needs (what the scheduler's decisions and floors read), at
            most this many apart whatever the stride (a whole number of observed steps), so a
            floor lags its need by at most this many tokens. Default
            :data:`READINGS_EVERY_STEPS` (8); 32 at a stride of 4 is the cadence benchmarks ran
            before it, as fast and 2-8x further from full KV on decode-heavy traces.
        observe_max_requests: requests one observed step scores at most; with more in the batch,
            a rotating subset (every request in turn), so a step's cost stops growing with the batch.
        observe_chunk_mib: transient device memory (MiB) one chunk of a step's observation may hold
            (the sampled heads' keys being scored and the chunk's probabilities); requests and
            blocks are scored in as many chunks as that takes. Outside vLLM's profiled KV budget.
        compaction_chunk_mib: transient device memory (MiB) one chunk of a compaction's token
            moves may hold (the gathered K and V of every layer and their indices); a compaction
            moves its survivors in as many chunks as that takes. Outside vLLM's profiled KV budget,
            so keep it, with ``observe_chunk_mib``, inside the memory vLLM leaves free.
        observation_window_tokens: at the step that ends a prompt, score the request by its last
            this many queries (an observation window, SnapKV's: the end of a prompt, where the
            question usually is, says which of its tokens matter), causally; decode steps score the
            newest query. 1: the newest query only. Costs scores, not key reads: keys are gathered
            once per head whatever the window.
        fault_injection: test hook (fault isolation): ``"observe"`` makes every observation raise,
            ``"report"`` every worker report; ``"report@rank2"`` only tensor-parallel rank 2's.
        client_mode: honour a request's ``vllm_xargs.growpage_mode`` (which can only lower the
            mode): ``honour``, ``ignore``, or ``auto`` (ignore when the deployment enforces).
        client_namespaces: honour a namespace the client chose (``vllm_xargs.growpage_namespace``
            or the OpenAI ``user`` field): ``honour``, ``ignore``, or ``auto`` (ignore when the
            deployment enforces, so a client cannot pick an unenforced namespace).
        namespace_header: the header a trusted gateway sets to the namespace; always honoured
            (the gateway must overwrite it); ``""`` trusts no header.
        method: what enforce does at a block boundary: ``growpage`` (the growth contract),
            ``growpage_when_it_pays`` (the contract, compressing only under pressure or with a
            request waiting), or a
            fixed cap for comparison under the same admission, pressure relief and floors:
            ``streaming_llm`` (sinks + the most recent tokens), ``h2o`` (accumulated attention),
            ``snapkv`` (windowed attention; the cached prompt is compressed to the cap once),
            ``tova`` (the newest query's attention alone).
            The cap is ``base_pages``.
        keep_sets: what a compaction keeps: ``request`` (one set of tokens for every KV head) or
            ``kv_head`` (each KV head its own highest-scored tokens, as H2O and SnapKV select: every
            head keeps as many, in the same slots' count; the observer then samples at least one
            query head per KV head). Scored methods only; recency keeps the same tokens either way.
        shared_keep_fraction: with ``kv_head``, the share of each head's unprotected survivors that
            every KV head keeps in common: the tokens the request ranks highest (the mean of its
            heads' scores), so one head's few sampled readers cannot drop what the answer needs;
            each head fills the rest by its own ranking. 0: each head alone; 1: the request's
            ranking wherever a head still holds the token.
        redundancy_weight: R-KV's redundancy term for generated tokens (``1 - lambda``; 0: off,
            R-KV uses 0.9-0.93): a compaction ranks a request's generated tokens (past its prompt,
            before the recent window) by R-KV's mix of attention and key redundancy, so repeated
            phrases of a long decode give way first (:mod:`~growpage.vllm_plugin.redundancy`).
        admission: under enforce, when a waiting request may start. ``vllm``: vLLM's
            own (a waiting request starts when its prompt fits now). ``projected``: only while the
            running requests' projected KV at their ends, with it, fits the pool, each compressed to
            its floor (GrowPage's) or whole (requests it does not compress), with output and
            attention-need shares learned from finished requests
            (:mod:`~growpage.vllm_plugin.admission`), so a batch admitted on its prompts does not
            outgrow the pool and thrash in preemptions. ``after_preemption``: the same, only within
            a few hundred steps of a vLLM preemption. ``auto`` (the default): the same, in the steps
            where the engine's measured step costs say a recompute costs more than the batch width
            holding gives up (``measured``: :meth:`admission_on`; the host's prior,
            :meth:`prior_step_costs`, until they are measured). A trade: fewer preemptions
            (recomputes) for a narrower batch, and a held request is not made room for by
            compressing the others; which pays depends on the traffic and the hardware
            (docs/BENCHMARKS.md has the table). Monitor and off never change admission.
    """

    exporter_port: int = DEFAULT_EXPORTER_PORT
    exporter_host: str = "0.0.0.0"
    observed_heads: int = 4
    observe_every_steps: int | None = None
    observe_skipped_steps: bool = False
    grow_with_room_for_all: bool = True
    compression_gate: bool = True
    readings_every_steps: int = READINGS_EVERY_STEPS
    observe_max_requests: int = 64
    observe_chunk_mib: int = 256
    compaction_chunk_mib: int = 64
    observation_window_tokens: int = 1
    fault_injection: str = ""
    client_mode: str = "auto"
    client_namespaces: str = "auto"
    namespace_header: str = "x-growpage-namespace"
    method: str = "growpage"
    keep_sets: str = "request"
    shared_keep_fraction: float = 0.0
    redundancy_weight: float = 0.0
    admission: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.exporter_port, int) or not -1 <= self.exporter_port <= 65535:
            raise ConfigError(f"exporter_port must be an int in [-1, 65535], got {self.exporter_port!r}; "
                              "try 9464, 0 for a free port or -1 to disable the exporter")
        self._check_observation()
        if not isinstance(self.compaction_chunk_mib, int) or self.compaction_chunk_mib < 1:
            raise ConfigError(f"compaction_chunk_mib must be an int >= 1, got {self.compaction_chunk_mib!r}; "
                              "try 64")
        self._check_selection()
        if self.admission not in ADMISSION_CHOICES:
            raise ConfigError(f"admission must be one of {', '.join(ADMISSION_CHOICES)}, got {self.admission!r}; "
                              "auto weighs a recompute against a wider batch on this host, vllm is vLLM's own, "
                              "projected looks ahead always, after_preemption once vLLM preempts")
        for name in ("client_mode", "client_namespaces"):
            if getattr(self, name) not in CLIENT_CHOICES:
                raise ConfigError(f"{name} must be one of {', '.join(CLIENT_CHOICES)}, got {getattr(self, name)!r}; "
                                  "auto ignores clients when the deployment enforces")

    def _check_observation(self) -> None:
        """What the workers observe, how often, and at what memory."""
        if not isinstance(self.observed_heads, int) or self.observed_heads < 1:
            raise ConfigError(f"observed_heads must be an int >= 1, got {self.observed_heads!r}; try 4")
        if self.observe_every_steps is not None and (not isinstance(self.observe_every_steps, int)
                                                     or self.observe_every_steps < 1):
            raise ConfigError(f"observe_every_steps must be an int >= 1, got {self.observe_every_steps!r}; "
                              f"try 1 (every step) or {OBSERVE_EVERY_STEPS} (the default)")
        if not isinstance(self.observe_skipped_steps, bool):
            raise ConfigError(f"observe_skipped_steps must be true or false, got {self.observe_skipped_steps!r}; "
                              "true scores the skipped steps' queries at the next observed step")
        if not isinstance(self.grow_with_room_for_all, bool):
            raise ConfigError(f"grow_with_room_for_all must be true or false, got {self.grow_with_room_for_all!r}; "
                              "true (the default) leaves the cache alone while the pool holds every request")
        if not isinstance(self.compression_gate, bool):
            raise ConfigError(f"compression_gate must be true or false, got {self.compression_gate!r}; "
                              "true (the default) leaves decode-time compression idle while it buys nothing")
        if not isinstance(self.readings_every_steps, int) or self.readings_every_steps < 1:
            raise ConfigError(f"readings_every_steps must be an int >= 1, got {self.readings_every_steps!r}; "
                              "try 8 (the default)")
        if not isinstance(self.observe_max_requests, int) or self.observe_max_requests < 1:
            raise ConfigError(f"observe_max_requests must be an int >= 1, got {self.observe_max_requests!r}; "
                              "try 64")
        if not isinstance(self.observe_chunk_mib, int) or self.observe_chunk_mib < 1:
            raise ConfigError(f"observe_chunk_mib must be an int >= 1, got {self.observe_chunk_mib!r}; try 256")
        if (not isinstance(self.observation_window_tokens, int)
                or not 1 <= self.observation_window_tokens <= MAX_OBSERVATION_WINDOW):
            raise ConfigError(f"observation_window_tokens must be an int in [1, {MAX_OBSERVATION_WINDOW}], got "
                              f"{self.observation_window_tokens!r}; try 32 (1 scores the newest query only)")

    def admission_on(self, device: str) -> str:
        """The admission enforce runs: ``auto`` resolved (``measured``, whatever the device: on
        ``device``, vLLM's ``device_type``, only the prior before the costs are measured differs,
        :meth:`prior_step_costs`)."""
        return "measured" if self.admission == "auto" else self.admission

    @staticmethod
    def prior_step_costs(device: str, cpu_kind: str) -> StepCosts:
        """What ``measured`` admission takes a step to cost before its fit can price a token, on
        ``device`` (vLLM's ``device_type``) with KV on a CPU of ``cpu_kind``
        (:func:`growpage.provenance.cpu_kind`): :data:`PRIOR_TOKEN_SHARE_BY_CPU`."""
        if device != "cpu":
            return ADMIT_PRIOR
        share = PRIOR_TOKEN_SHARE_BY_CPU.get(cpu_kind)
        return token_share_prior(share) if share is not None else LOOK_AHEAD_PRIOR

    def observation_stride(self, mode: Mode) -> int:
        """Steps per observed step in a deployment running ``mode`` (see ``observe_every_steps``)."""
        if self.observe_every_steps is not None:
            return self.observe_every_steps
        return OBSERVE_EVERY_STEPS if mode in (Mode.MONITOR, Mode.ENFORCE) else 1

    def readings_every_observed(self, stride: int) -> int:
        """Observed steps between two readings at ``stride``: ``readings_every_steps`` engine steps at
        most (a reading is taken on an observed step)."""
        return max(1, self.readings_every_steps // stride)

    def _check_selection(self) -> None:
        """What enforce keeps: the method, keep sets and R-KV's term."""
        if self.method not in VLLM_METHODS:
            raise ConfigError(f"method must be one of {', '.join(VLLM_METHODS)}, got {self.method!r}; "
                              "growpage is the contract, the others are fixed caps at base_pages")
        if self.keep_sets not in KEEP_SETS:
            raise ConfigError(f"keep_sets must be one of {', '.join(KEEP_SETS)}, got {self.keep_sets!r}; "
                              "kv_head lets each KV head keep its own tokens")
        if not _is_number(self.shared_keep_fraction) or not 0.0 <= self.shared_keep_fraction <= 1.0:
            raise ConfigError(f"shared_keep_fraction must be a number in [0, 1], got {self.shared_keep_fraction!r}; "
                              "try 0.5 (half of each KV head's survivors chosen by the request's ranking)")
        if self.shared_keep_fraction and self.keep_sets != "kv_head":
            raise ConfigError(f"shared_keep_fraction {self.shared_keep_fraction!r} applies only to per-head keep sets; "
                              "set keep_sets to kv_head, or drop shared_keep_fraction")
        if not _is_number(self.redundancy_weight) or not 0.0 <= self.redundancy_weight < 1.0:
            raise ConfigError(f"redundancy_weight must be a number in [0, 1), got {self.redundancy_weight!r}; "
                              "try 0 (off) or 0.9 (R-KV's lambda of 0.1)")

    @property
    def exporter_enabled(self) -> bool:
        return self.exporter_port >= 0


def _is_number(value: Any) -> bool:
    """An int or float, not a bool (JSON's ``true`` is not a fraction)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


PLUGIN_FIELDS = tuple(f.name for f in dataclasses.fields(PluginSettings))
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PluginSettings)}


def honours(choice: str, deployment_mode: Mode) -> bool:
    """Whether a client choice setting (``honour``/``ignore``/``auto``) honours clients."""
    return choice == "honour" or (choice == "auto" and deployment_mode is not Mode.ENFORCE)


def split_settings(raw: Mapping[str, Any] | None, env: Mapping[str, str] | None = None,
                   block_size: int | None = None) -> tuple[GrowPageConfig, PluginSettings]:
    """Build ``(GrowPageConfig, PluginSettings)`` from ``additional_config["growpage"]``.

    Args:
        raw: the ``growpage`` mapping (None or empty: environment and defaults only).
        env: environment to read (``os.environ`` by default).
        block_size: vLLM's cache block size; overrides any ``block_size`` given. Unless
            ``base_pages`` is set (here, in ``GROWPAGE_BASE_PAGES`` or a config file), the floor is
            :func:`default_base_pages` of this block size and the protected tokens.
            ``attention_coverage`` defaults to :data:`~growpage.config.DEFAULT_ATTENTION_COVERAGE`
            inside vLLM either way (``GrowPageConfig``'s own default is 0).

    Raises:
        ConfigError: a key is unknown or a value invalid (the message says how to fix it). Inside
            vLLM's processes use :func:`~growpage.vllm_plugin.resolve.resolve_settings`, which never raises.
    """
    env = os.environ if env is None else env
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f'additional_config["growpage"] must be a JSON object, got {type(raw).__name__}; '
                          'e.g. --additional-config \'{"growpage": {"mode": "monitor"}}\'')
    raw = dict(raw or {})
    plugin_values: dict[str, Any] = {}
    for name in PLUGIN_FIELDS:
        env_name = f"GROWPAGE_VLLM_{name.upper()}"
        if env_name in env:
            plugin_values[name] = coerce_plugin_env(name, env[env_name])
        if name in raw:
            plugin_values[name] = raw.pop(name)
    if block_size is not None:
        raw["block_size"] = block_size
    values = merged_values(env=config_env(env), overrides=raw,
                           defaults={"attention_coverage": DEFAULT_ATTENTION_COVERAGE})
    if block_size is not None and "base_pages" not in values:
        values["base_pages"] = default_base_pages(block_size, **_protection(values))
    return GrowPageConfig(**values), PluginSettings(**plugin_values)


def resolved_settings(raw: Mapping[str, Any] | None, block_size: int,
                      env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting a deployment given ``raw`` (``additional_config["growpage"]``) runs with, at
    vLLM's ``block_size``, defaults included: what a benchmark records, so its JSON says what ran
    rather than what was asked for.

    Args:
        env: the environment the engines read (``GROWPAGE_*`` overrides); None: this process's,
            which the engines a benchmark starts inherit.

    Raises:
        ConfigError: ``raw`` is invalid (as :func:`split_settings`).
    """
    config, plugin = split_settings(raw, env=os.environ if env is None else env, block_size=block_size)
    values = dataclasses.asdict(config)
    values["mode"] = config.mode.value
    values["enforce_namespaces"] = list(config.enforce_namespaces)
    return {"growpage": values, "plugin": dataclasses.asdict(plugin)}


def default_base_pages(block_size: int, sink_tokens: int = _CONFIG_DEFAULTS["sink_tokens"],
                       recent_window_tokens: int = _CONFIG_DEFAULTS["recent_window_tokens"],
                       evict_min_pages: int = _CONFIG_DEFAULTS["evict_min_pages"]) -> int:
    """The floor inside vLLM when none is given, in vLLM's blocks: :data:`DEFAULT_FLOOR_TOKENS`
    rounded up to whole blocks, and never fewer than :func:`~growpage.config.min_base_pages` (an
    eviction at the floor must keep the sinks and the recent window), so the defaults hold at every
    block size: 8 blocks of 16, 4 of 32, 3 of 64, 2 of 128, 2 of 256 with the default 68
    protected tokens and ``evict_min_pages`` 1.

    Inside vLLM a GrowPage page is one of vLLM's blocks. The reference engine's default floor, 128
    pages of 16 tokens, taken as 128 blocks would mean a different number of tokens on each backend
    (vLLM's blocks are 16 tokens on most GPUs, 128 on CPU), and 128 blocks of 32 (4,096 tokens) is
    longer than most requests: enforce would never compress.
    """
    return max(-(-DEFAULT_FLOOR_TOKENS // block_size),
               min_base_pages(block_size, sink_tokens, recent_window_tokens, evict_min_pages))


def _protection(values: Mapping[str, Any]) -> dict[str, int]:
    """The settings :func:`default_base_pages` reads, from ``values`` where set and usable (a bad
    value keeps its default here and is rejected by validation with its own message)."""
    minimum = {"sink_tokens": 0, "recent_window_tokens": 0, "evict_min_pages": 1}
    out: dict[str, int] = {}
    for name, least in minimum.items():
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            out[name] = value
        else:
            out[name] = int(_CONFIG_DEFAULTS[name])
    return out


def config_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the plugin's own ``GROWPAGE_VLLM_*`` variables (not config fields)."""
    return {k: v for k, v in env.items() if not k.startswith("GROWPAGE_VLLM_")}


_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
# default None (the mode decides), else a value of this type
_OPTIONAL_FIELDS: dict[str, type] = {"observe_every_steps": int}


def coerce_plugin_env(name: str, text: str) -> Any:
    """An environment value as its field's type (the field's default says which: bool, int, float, str)."""
    kind = _OPTIONAL_FIELDS.get(name) or type(_FIELD_DEFAULTS[name])
    if kind is bool:
        answer = _BOOLEAN_WORDS.get(text.strip().lower())
        if answer is None:
            raise ConfigError(f"GROWPAGE_VLLM_{name.upper()} must be true or false, got {text!r}")
        return answer
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"GROWPAGE_VLLM_{name.upper()} must be an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"GROWPAGE_VLLM_{name.upper()} must be a number, got {text!r}; "
                              f"try {_FIELD_DEFAULTS[name]:g} (the default)") from None
    return text
