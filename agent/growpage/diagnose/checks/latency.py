"""Checklist step 3: allocation latency p99 above 20 ms, and why.

Causes checked, most specific first: the page size (``block_size``) against GrowPage's own
recommendation for the GPU (A100 16, H100 32: GrowPage guidance, NOT a vLLM rule), growth throttled
by ``max_growth_rate``, and pool exhaustion (denied grants, free pages near 0).
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks import advice
from growpage.diagnose.checks.advice import recommended_block_size
from growpage.diagnose.checks.base import Thresholds, evidence, idle, in_modes, missing, ms, pct, throttle_share
from growpage.diagnose.findings import ScopeFinding, Severity, Status, alert_finding
from growpage.diagnose.observations import Scope, Window


def allocation_latency(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.ALLOCATION_LATENCY.name
    limit_s = t.checklist.allocation_latency_p99_critical_s
    histogram = scope.allocation_latency
    if histogram is None:
        return missing(scope, metric, window, threshold=limit_s)
    if histogram.count <= 0:
        return idle(metric, f"no page grants ({window.describe()})", window, limit_s)
    p99_s = histogram.quantile(0.99)
    block_size = scope.build_value("block_size")
    gpu_names = advice.gpu_names(scope)
    family, recommended = recommended_block_size(gpu_names, t.block_size_by_gpu)
    throttled = throttle_share(scope)
    denied = (scope.decisions or {}).get("denied")
    free_min = scope.pool_free_fraction_min
    proof = evidence(
        metric, p99_s, limit_s, window, statistic="p99 (histogram_quantile over bucket increases)",
        grants=histogram.count, block_size=block_size, gpu=gpu_names[0] if gpu_names else None,
        recommended_block_size=recommended, throttled_share=throttled,
        throttle_saturation_threshold=t.checklist.throttle_saturation, denied=denied,
        pool_free_fraction_min=free_min, pool_free_low_threshold=t.diagnose.pool_free_low_fraction)
    block_step = advice.block_size_step(scope, t)
    if p99_s is not None and p99_s > limit_s and not in_modes(scope, catalog.MODES_OBSERVING):
        return ScopeFinding(Status.OK, f"mode off: p99 {ms(p99_s)} is not GrowPage's", proof)
    if p99_s is not None and p99_s <= limit_s:
        summary = f"p99 {ms(p99_s)} <= {ms(limit_s)}"
        if block_step:
            return ScopeFinding(Status.OK, summary + f"; block_size {block_size} differs from GrowPage's "
                                f"recommendation for {family}", proof, (block_step,), Severity.INFO)
        return ScopeFinding(Status.OK, summary, proof)
    causes, steps = [], []
    if block_step:
        causes.append(f"block_size {block_size} on {family}")
        steps.append(block_step)
    if throttled is not None and throttled > t.checklist.throttle_saturation:
        causes.append(f"growth throttled ({pct(throttled)} of attempts)")
        steps.append("Growth is throttled: raise max_growth_rate (default 0.3, +30 % pages/s) "
                     "or lower base_pages so fewer requests must grow.")
    exhausted = free_min is not None and free_min <= t.diagnose.pool_free_low_fraction
    if exhausted or (denied or 0) > 0:
        causes.append(f"pool exhausted (free pages down to {pct(free_min)}, {denied or 0:,.0f} denied)")
        steps.append(f"The pool runs dry: add replicas (the HPA scales on {catalog.VLLM_REQUESTS_WAITING}), "
                     "raise vLLM's gpu_memory_utilization, or lower base_pages / max_num_seqs.")
    mixed = len(scope.build_values("block_size")) > 1 or len(gpu_names) > 1
    if mixed:
        steps.append(f"Pods here differ in block_size or GPU ({', '.join(map(str, scope.build_values('block_size')))}"
                     f"; {', '.join(gpu_names)}): the per-namespace/pod results name each one's cause.")
    elif not causes:
        steps.append("No GrowPage-side cause found: check CPU contention on the vLLM host and "
                     "growpage_agent_errors_total, and compare with `gpctl bench core` on that machine.")
    if block_size is None and not mixed:
        steps.append("growpage_build_info has no block_size: cannot compare the page size with the GPU.")
    cause_text = f"; likely: {', '.join(causes)}" if causes else ""
    return alert_finding(("GrowPageAllocationLatencyHigh",), f"p99 {ms(p99_s)} > {ms(limit_s)}{cause_text}", proof,
                         tuple(steps))
