"""Assembles a serving stack: engine + telemetry agent + engine thread + HTTP app.

Used by ``gpctl serve`` and by tests, so both run exactly the same wiring.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from growpage import __version__
from growpage.config import GrowPageConfig
from growpage.engine.async_engine import AsyncEngine
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.server import create_app

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServingStack:
    engine: LLMEngine
    async_engine: AsyncEngine
    telemetry: object | None  # growpage.telemetry.TelemetryAgent when the extra is installed
    app: object  # FastAPI

    def close(self) -> None:
        self.async_engine.stop()
        if self.telemetry is not None:
            self.telemetry.close()


def build_stack(engine_config: EngineConfig, growpage_config: GrowPageConfig, *, model=None, tokenizer=None,
                telemetry: bool = True, metrics_port: int | None = None) -> ServingStack:
    """Load the model, start nothing yet (the app's lifespan starts the engine thread).

    Args:
        telemetry: serve ``/metrics/growpage`` (needs ``growpage[telemetry]``).
        metrics_port: also run the standalone exporter on this port.
    """
    engine = LLMEngine(engine_config, growpage_config, model=model, tokenizer=tokenizer)
    engine_lock = threading.Lock()  # the engine thread holds it per step; scrapes may refresh under it
    agent = None
    if telemetry:
        from growpage.telemetry import TelemetryAgent

        agent = TelemetryAgent.from_env(engine.manager, model=engine_config.model_name, engine="reference",
                                        engine_version=__version__, engine_lock=engine_lock)
        if metrics_port is not None:
            agent.serve(port=metrics_port)
    async_engine = AsyncEngine(engine, on_step=_telemetry_hook(agent), lock=engine_lock)
    app = create_app(async_engine, metrics=agent.render if agent is not None else None)
    return ServingStack(engine=engine, async_engine=async_engine, telemetry=agent, app=app)


def _telemetry_hook(agent):
    if agent is None:
        return None

    def on_step(engine: LLMEngine) -> None:
        agent.on_step()  # polls at most every poll_interval_s, busy or idle

    return on_step
