"""``gpctl bench calibration-trace``: the monitoring phase of a rollout, on the reference engine.

Runs GrowPage in ``monitor`` mode (it computes and counts every decision, never touches the KV)
over a calibration trace of its own seed, reasoning, pass-key and summary requests that stop at the
model's own end of answer, and saves what the telemetry agent would serve on ``/metrics/growpage``
as a snapshot file. ``gpctl calibrate --snapshot FILE`` then sets the thresholds from it, exactly
as it would from a live deployment; the benchmarks run with that file (``--config``).

The trace's seed differs from the benchmarks' (0 and 1), so thresholds are not fitted to the
requests they are then judged on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from growpage.bench import harness
from growpage.bench.workloads import Task, reasoning_tasks, retrieval_tasks, summary_tasks
from growpage.engine.sampling import SamplingParams

SNAPSHOT_TIME_HEADER = "# growpage-snapshot-time: "  # what gpctl calibrate --snapshot dates a file by


@dataclasses.dataclass(frozen=True)
class CalibrationSettings:
    reasoning: int = 48
    reasoning_max_tokens: int = 192
    retrieval_context_tokens: tuple[int, ...] = (256, 512, 1024)
    retrieval_depths: tuple[float, ...] = (0.2, 0.5, 0.8)
    retrieval_max_tokens: int = 24
    summaries: int = 8
    summary_max_tokens: int = 48
    block_size: int = 16
    base_pages: int = 8
    max_num_seqs: int = 16
    seed: int = 100
    threads: int | None = None
    methods: tuple[str, ...] = ("growpage",)

    def tasks(self) -> list[Task]:
        return (reasoning_tasks(self.reasoning, self.reasoning_max_tokens, self.seed)
                + retrieval_tasks(self.retrieval_context_tokens, self.retrieval_depths, self.retrieval_max_tokens,
                                  self.seed)
                + summary_tasks(self.summaries, self.summary_max_tokens))


def run_calibration_trace(model_dir: str, settings: CalibrationSettings, output: Path,
                          progress: Callable[[str], None] = lambda _message: None,
                          loaded: harness.Loaded | None = None) -> dict:
    """Serve the trace in monitor mode and write the exposition to ``output``; returns a summary."""
    # deferred: growpage.telemetry loads OpenTelemetry and prometheus_client; only this trace scrapes
    from growpage.telemetry import TelemetryAgent

    loaded, tasks, prompts = harness.prepare(model_dir, settings, loaded)
    longest = max(len(prompts[t.task_id]) + t.max_tokens for t in tasks)
    num_pages = settings.max_num_seqs * (-(-longest // settings.block_size) + 1)  # nobody waits for a page
    engine, _ = harness.build_engine(loaded, "growpage", base_pages=settings.base_pages, num_pages=num_pages,
                                     block_size=settings.block_size, max_num_seqs=settings.max_num_seqs,
                                     seed=settings.seed, mode="monitor")
    agent = TelemetryAgent(engine.manager, model=Path(model_dir).name, engine="reference",
                           engine_version="calibration-trace")
    try:
        for task in tasks:
            engine.add_request(prompts[task.task_id], SamplingParams(max_tokens=task.max_tokens, temperature=0.0),
                               request_id=task.task_id)
        progress(f"{len(tasks)} requests in monitor mode")
        started = time.monotonic()
        while engine.has_unfinished_requests():
            engine.step()
            agent.on_step()
        agent.poll()
        body = agent.render().body
        text = body.decode("utf-8") if isinstance(body, bytes) else body
    finally:
        agent.close()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(f"{SNAPSHOT_TIME_HEADER}{time.time():.0f}\n{text}", encoding="utf-8")
    return {"snapshot": str(output), "requests": len(tasks), "seed": settings.seed,
            "wall_s": round(time.monotonic() - started, 1), "settings": dataclasses.asdict(settings)}
