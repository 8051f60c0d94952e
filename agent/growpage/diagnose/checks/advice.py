"""Remediation steps that change a setting, shared by every check so one report gives one
recommendation per setting, conditioned on what the deployment runs now (mode, vLLM version,
block size read from ``growpage_build_info``).

:func:`setting_of` names the setting a step changes; ``run_checks`` keeps the first step per setting
(most severe finding first) and drops the rest, so "set --block-size 32" never sits next to
"lower block_size".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from growpage.diagnose.checks.base import Thresholds
from growpage.diagnose.observations import Scope

NO_GROWPAGE_IN_VLLM_NOTE = ("No vLLM release contains GrowPage (there is no \"vLLM >= v0.6.3 GrowPage "
                            "patch\"); GrowPage is a plugin with its own minimum vLLM version.")
_ACTIONS = ("Set ", "Lower ", "Raise ", "Run ", "Upgrade ")
# Keyword in a step's first clause -> the setting it changes.
_SETTINGS = (("block-size", "block_size"), ("block_size", "block_size"), ("base_pages", "base_pages"),
             ("mode=", "mode"), ("vLLM >=", "vllm_version"), ("max_growth_rate", "max_growth_rate"),
             ("gpu_memory_utilization", "gpu_memory_utilization"))


def setting_of(step: str) -> str | None:
    """The setting ``step`` changes, or None for steps that change nothing (checks, reading)."""
    if not step.startswith(_ACTIONS):
        return None
    clause = step.split(":", 1)[0]
    return next((setting for keyword, setting in _SETTINGS if keyword in clause), None)


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"0.32.1"`` -> ``(0, 32, 1)``; ``"v0.10.1rc2"`` -> ``(0, 10, 1)``; None when unreadable."""
    if not text:
        return None
    numbers = re.findall(r"\d+", text.split("+")[0])[:3]
    return tuple(int(n) for n in numbers) if numbers else None


def recommended_block_size(gpu_names: tuple[str, ...], by_gpu: Mapping[str, int]) -> tuple[str | None, int | None]:
    """``(GPU family, block size)`` for the first name that mentions a known family (e.g. "H100")."""
    for name in gpu_names:
        # Longest key first, so a future "H100 NVL" entry wins over "H100".
        for family in sorted(by_gpu, key=len, reverse=True):
            if family.upper() in name.upper():
                return family, by_gpu[family]
    return None, None


def gpu_names(scope: Scope) -> tuple[str, ...]:
    # DCGM's modelName is the real GPU; build info's device may only say "cuda".
    return scope.gpu_models or tuple(str(device) for device in scope.build_values("device"))


def block_size_step(scope: Scope, t: Thresholds, only_if_smaller: bool = False) -> str | None:
    """Set the GPU's recommended block size, when it is known and differs from the one in use.

    Args:
        only_if_smaller: recommend only a smaller block (fragmentation: tail slack grows with it).
    """
    block_size = scope.build_value("block_size")
    family, recommended = recommended_block_size(gpu_names(scope), t.block_size_by_gpu)
    if block_size is None or recommended is None or block_size == recommended:
        return None
    if only_if_smaller and recommended > block_size:
        return None
    return (f"Set vLLM --block-size {recommended} (now {block_size}): GrowPage's recommendation for {family} "
            "(GrowPage guidance, not a vLLM rule).")


def enforce_step(scope: Scope, why: str) -> str | None:
    """Run mode=enforce, unless every pod here already does (or the mode is unknown)."""
    mode = scope.build_value("mode")
    if mode in (None, "enforce"):
        return None
    return f"Run mode=enforce (now {mode}): {why}"


def upgrade_step(scope: Scope, t: Thresholds) -> str | None:
    """Upgrade vLLM, only when the running vLLM is older than the oldest one GrowPage supports."""
    if scope.build_value("engine") != "vllm":
        return None
    running = scope.build_value("engine_version")
    current, minimum = version_tuple(running), version_tuple(t.min_vllm_version)
    if current is None or minimum is None or current >= minimum:
        return None
    return (f"Upgrade to vLLM >= {t.min_vllm_version} (now {running}), the oldest release this GrowPage "
            f"supports. {NO_GROWPAGE_IN_VLLM_NOTE}")


def stranded_pages(scope: Scope, t: Thresholds) -> tuple[str, ...]:
    """Steps for requests failing while pages are stranded (reserved-but-empty grants, slack)."""
    base_pages = scope.build_value("base_pages")
    steps = [f"Lower base_pages (now {base_pages or 'unknown'}): smaller admission grants strand fewer "
             "reserved slots; the over-granting check suggests a value.",
             block_size_step(scope, t, only_if_smaller=True),
             enforce_step(scope, "eviction compacts pages and frees the holes."),
             upgrade_step(scope, t)]
    return tuple(step for step in steps if step)


def genuinely_full(scope: Scope, t: Thresholds) -> tuple[str, ...]:
    """Steps for a pool that is full of live tokens: more memory, or fewer tokens per request."""
    steps = ["Add capacity: more replicas (HPA), or fewer concurrent sequences (vLLM max_num_seqs).",
             enforce_step(scope, "compression keeps more requests resident in the same pages."),
             upgrade_step(scope, t)]
    return tuple(step for step in steps if step)
