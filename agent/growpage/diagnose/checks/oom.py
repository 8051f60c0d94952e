"""Checklist step 4: OOMs or preemptions while the GPU framebuffer is not full -> fragmentation.

In a paged pool, fragmentation is slack inside written pages (tail slack, holes left by eviction),
not address-space holes: PagedAttention needs no contiguous pages. When requests are preempted
while DCGM shows the framebuffer under 80 % and ``growpage_page_table_fragmentation`` is high, pages
are stranded by that slack.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, pct, unknown
from growpage.diagnose.findings import ScopeFinding, Severity, Status
from growpage.diagnose.observations import Scope, Window

NO_GROWPAGE_IN_VLLM_NOTE = ("No vLLM release contains GrowPage (there is no \"vLLM >= v0.6.3 GrowPage "
                            "patch\"); GrowPage is a plugin with its own minimum vLLM version.")


def oom_fragmentation(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.OOM_EVENTS.name
    preempt = scope.decisions.get("preempt") if scope.decisions else None
    if scope.oom_events is None and preempt is None:
        return unknown(metric, f"neither {metric} nor growpage_decisions_total{{decision=\"preempt\"}} found",
                       window)
    ooms, preemptions = scope.oom_events or 0.0, preempt or 0.0
    fb_used = scope.gpu_framebuffer_used_max
    fragmentation = scope.fragmentation.max if scope.fragmentation is not None else None
    frag_limit, fb_limit = t.checklist.fragmentation_high, t.checklist.gpu_framebuffer_used_low
    proof = evidence(
        metric, ooms, 0, window, preemptions=preemptions, gpu_framebuffer_used_max=fb_used,
        gpu_framebuffer_threshold=fb_limit, fragmentation_max=fragmentation, fragmentation_threshold=frag_limit,
        fragmentation_mean=scope.fragmentation.mean if scope.fragmentation else None,
        mode=scope.build_value("mode"), base_pages=scope.build_value("base_pages"),
        block_size=scope.build_value("block_size"))
    fragmented = fragmentation is not None and fragmentation >= frag_limit
    events = f"{ooms:,.0f} OOM events, {preemptions:,.0f} preemptions"
    if ooms == 0 and preemptions == 0:
        if fragmented:
            return ScopeFinding(Status.OK, f"no OOM or preemption; fragmentation is high ({fragmentation:.2f} "
                                f">= {frag_limit}), watch it", proof,
                                ("High fragmentation strands pages before the pool is empty: see the runbook.",),
                                Severity.INFO)
        return ScopeFinding(Status.OK, "no OOM or preemption in the window", proof)
    gpu_full = fb_used is not None and fb_used >= fb_limit
    if fragmented and not gpu_full:
        gpu = (f"GPU framebuffer at most {pct(fb_used)} (< {pct(fb_limit)})" if fb_used is not None
               else "GPU framebuffer unknown (pass --dcgm to confirm it was not full)")
        return ScopeFinding(Status.CRITICAL, f"{events} while fragmentation reached {fragmentation:.2f} "
                            f"(>= {frag_limit}); {gpu}", proof, _fragmentation_steps(scope, t))
    if gpu_full:
        return ScopeFinding(Status.WARNING, f"{events}; GPU framebuffer reached {pct(fb_used)}: memory is "
                            "genuinely full, not fragmented", proof,
                            ("Add capacity: more replicas, or fewer concurrent sequences (vLLM max_num_seqs).",
                             "Run mode=enforce so compression keeps more requests resident."))
    frag_text = (f"fragmentation {fragmentation:.2f} is low" if fragmentation is not None
                 else f"{catalog.FRAGMENTATION.name} not found")
    return ScopeFinding(Status.WARNING, f"{events}; {frag_text}", proof,
                        ("The pool is smaller than the traffic needs: raise vLLM gpu_memory_utilization if "
                         "the GPU has room, or add replicas.",
                         "Pass --dcgm (or scrape the DCGM exporter) to see how full the GPU was."))


def _fragmentation_steps(scope: Scope, t: Thresholds) -> tuple[str, ...]:
    base_pages, block_size = scope.build_value("base_pages"), scope.build_value("block_size")
    mode = scope.build_value("mode")
    steps = [f"Lower base_pages (now {base_pages or 'unknown'}): smaller grants strand fewer slots; the "
             "over-granting check suggests a value.",
             f"Lower block_size (now {block_size or 'unknown'}): tail slack is up to block_size - 1 tokens "
             "per request."]
    if mode != "enforce":
        steps.append(f"Run mode=enforce (now {mode or 'unknown'}): eviction compacts pages and frees the holes.")
    steps.append(f"Upgrade to vLLM >= {t.min_vllm_version}, the oldest release this GrowPage supports. "
                 + NO_GROWPAGE_IN_VLLM_NOTE)
    return tuple(steps)
