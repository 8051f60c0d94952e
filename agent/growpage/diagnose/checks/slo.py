"""Checklist step 1: the three SLOs (utilization, compress ratio, allocation latency)."""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import (
    Thresholds,
    evidence,
    idle,
    idle_reason,
    in_modes,
    is_idle,
    missing,
    ms,
    pct,
    pct_floor,
    to_read,
    unknown,
)
from growpage.diagnose.checks.burns import allocation_burn_slo, burn_finding
from growpage.diagnose.findings import ScopeFinding, Status, alert_finding
from growpage.diagnose.observations import Scope, Window

# FP16 -> INT8 with one FP16 scale per head per 16-token page: 256 / 128.125 bytes: INT8 alone cannot reach 2.0x.
INT8_RATIO_CEILING = 256 / 128.125


def utilization(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.UTILIZATION.name
    stats = scope.pooled_utilization or scope.utilization
    if stats is None:
        return missing(scope, metric, window, threshold=t.utilization_slo)
    if is_idle(scope):
        return idle(metric, idle_reason(window), window, t.utilization_slo)
    how = ("sum of live tokens / sum of granted token slots, mean over the window" if scope.pooled_utilization
           else "mean of all samples")
    proof = evidence(metric, stats.mean, t.utilization_slo, window, statistic=how,
                     min=stats.min, max=stats.max, last=stats.last, mode=scope.build_value("mode"))
    if not in_modes(scope, catalog.MODES_OBSERVING):
        return ScopeFinding(Status.OK, "mode off: GrowPage grants nothing here, nothing to utilize", proof)
    if stats.mean >= t.utilization_slo:
        return ScopeFinding(Status.OK, f"mean utilization {stats.mean:.2f} meets the SLO (>= {t.utilization_slo})",
                            proof)
    return alert_finding(
        ("GrowPageKVUtilizationLow",),
        f"mean utilization {stats.mean:.2f} is below the SLO {t.utilization_slo}",
        proof,
        ("Reference engine: grants hold unused token slots; see the over-granting check for a base_pages that "
         "fits the traffic. Inside vLLM pages are granted on demand: the empty slots are tail slack and "
         "eviction holes (the oom-fragmentation check).",
         "Reserved pages count as granted: compare growpage_pool_pages{state=\"reserved\"} with "
         "state=\"used\"."),
    )


def compress_ratio(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.INTRA_PAGE_COMPRESS_RATIO.name
    mode = scope.build_value("mode")
    bytes_in, bytes_out = scope.compress_input_bytes, scope.compress_output_bytes
    unreadable = [name for name in (catalog.COMPRESS_INPUT_BYTES.name, catalog.COMPRESS_OUTPUT_BYTES.name)
                  if name in scope.non_finite]
    if unreadable:  # a NaN counter is not "no compressions"
        return missing(scope, unreadable[0], window, threshold=t.compress_ratio_slo)
    if bytes_out is not None and bytes_out > 0 and bytes_in is not None:
        ratio, how = bytes_in / bytes_out, "input bytes / output bytes (counters)"
        metric = f"{catalog.COMPRESS_INPUT_BYTES.name} / {catalog.COMPRESS_OUTPUT_BYTES.name}"
    elif bytes_out is not None and bytes_out == 0:
        ratio, how = None, "counters: no compression in the window"
    elif scope.intra_page_compress_ratio is not None and scope.intra_page_compress_ratio.mean >= 1:
        ratio, how = scope.intra_page_compress_ratio.mean, "gauge mean (byte counters not exported)"
    elif scope.intra_page_compress_ratio is not None:
        ratio, how = None, "gauge: no compression in the window"
    else:
        return unknown(metric, f"neither {catalog.COMPRESS_OUTPUT_BYTES.name} nor {metric} found", window,
                       to_read(catalog.COMPRESS_OUTPUT_BYTES.name, window), t.compress_ratio_slo)
    proof = evidence(metric, ratio, t.compress_ratio_slo, window, method=how, mode=mode,
                     input_bytes=bytes_in, output_bytes=bytes_out)
    if ratio is not None and not in_modes(scope, catalog.MODES_ENFORCING):
        return ScopeFinding(Status.OK, f"mode {mode}: GrowPage changes no KV here, the ratio is not its SLO",
                            proof)
    if ratio is None:
        why = (f"mode {mode}: GrowPage does not compress" if mode in ("monitor", "off")
               else "no page boundary needed one, the pool held every request at its full length "
               f"({catalog.VLLM_ROOM_STEPS.name} counts those steps), or decode-time compression bought "
               f"nothing and stayed idle ({catalog.VLLM_IDLE_STEPS.name})")
        return ScopeFinding(Status.OK, f"no compressions in the window ({why}): nothing to measure", proof)
    if ratio >= t.compress_ratio_slo:
        return ScopeFinding(Status.OK, f"compress ratio {ratio:.2f}x meets the SLO (>= {t.compress_ratio_slo}x)",
                            proof)
    steps = ["Compress with INT4 (or let token eviction run): INT8 cannot reach 2.0x once its scales are "
             f"stored (at most {INT8_RATIO_CEILING:.3f}x with 16-token pages)."]
    if ratio < INT8_RATIO_CEILING - 0.2:
        steps.append("A ratio this low means most compressions save little: check growpage_decisions_total "
                     "{decision=\"quantize\"} vs {decision=\"evict\"} and the agent's logs.")
    return alert_finding(("GrowPageCompressRatioLow",),
                         f"compress ratio {ratio:.3f}x is below the SLO {t.compress_ratio_slo}x", proof, tuple(steps))


def allocation_latency_slo(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.ALLOCATION_LATENCY.name
    histogram = scope.allocation_latency
    if histogram is None:
        return missing(scope, metric, window, threshold=t.latency_slo_objective)
    if not in_modes(scope, catalog.MODES_OBSERVING):
        return ScopeFinding(Status.OK, "mode off: GrowPage grants no page here, its grant latency is not timed",
                            evidence(metric, None, t.latency_slo_objective, window, mode="off"))
    within = histogram.fraction_at_or_below(t.latency_slo_threshold_s)
    on_bound = any(abs(bound - t.latency_slo_threshold_s) < 1e-12 for bound, _ in histogram.buckets)
    proof = evidence(
        metric, within, t.latency_slo_objective, window, latency_threshold_s=t.latency_slo_threshold_s,
        grants=histogram.count, grants_within_threshold=round(within * histogram.count, 1) if within else None,
        p99_s=histogram.quantile(0.99),
        method=(f"bucket le={t.latency_slo_threshold_s:g} / all grants" if on_bound
                else "interpolated between buckets"))
    reading = (f"{pct_floor(within)} of {histogram.count:,.0f} grants took <= {ms(t.latency_slo_threshold_s)} "
               f"(SLO {pct(t.latency_slo_objective)}, {window.describe()})" if within is not None
               else f"no page grants ({window.describe()})")
    return burn_finding(scope, window, t, (allocation_burn_slo(t),), reading, proof,
                        ("See the allocation-latency check for the cause (block size, growth throttling, pool "
                         "exhaustion).",))
