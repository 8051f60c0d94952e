"""Assembles a serving stack: engine + telemetry agent + engine thread + HTTP app, and runs it.

Used by ``gpctl serve`` and by tests, so both run exactly the same wiring. :class:`GracefulServer`
is uvicorn with a bounded shutdown: the first SIGTERM/SIGINT drains the engine
(:meth:`AsyncEngine.drain`: queued requests refused, running ones given ``shutdown_timeout_s``, then
failed with 503), a second signal of either kind exits at once.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from growpage import __version__
from growpage.config import GrowPageConfig
from growpage.engine.async_engine import AsyncEngine
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.server import create_app
from growpage.engine.server_settings import ServerSettings

if TYPE_CHECKING:
    from growpage.engine.llama import LlamaModel
    from growpage.telemetry import TelemetryAgent

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServingStack:
    engine: LLMEngine
    async_engine: AsyncEngine
    telemetry: TelemetryAgent | None  # None without the telemetry extra, or when turned off
    app: FastAPI  # app.state.counters holds the server's counts
    settings: ServerSettings = dataclasses.field(default_factory=ServerSettings)

    def close(self) -> None:
        self.async_engine.stop()
        if self.telemetry is not None:
            self.telemetry.close()


def build_stack(engine_config: EngineConfig, growpage_config: GrowPageConfig, *, model: LlamaModel | None = None,
                tokenizer: Any = None,
                telemetry: bool = True, metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
                settings: ServerSettings | None = None) -> ServingStack:
    """Load the model, start nothing yet (the app's lifespan starts the engine thread).

    Args:
        telemetry: serve ``/metrics/growpage`` (needs ``growpage[telemetry]``).
        metrics_port: also run the standalone exporter on this port.
        metrics_host: the exporter's listen address (``gpctl serve`` passes ``--host``).
        settings: the HTTP server's settings (default: :meth:`ServerSettings.for_mode` of the mode).
    """
    settings = settings or ServerSettings.for_mode(growpage_config.mode)
    engine = LLMEngine(engine_config, growpage_config, model=model, tokenizer=tokenizer)
    engine_lock = threading.Lock()  # the engine thread holds it per step; scrapes may refresh under it
    agent = None
    if telemetry:
        # deferred: OpenTelemetry and prometheus_client load only when telemetry is on
        from growpage.telemetry import TelemetryAgent

        agent = TelemetryAgent.from_env(engine.manager, model=engine_config.model_name, engine="reference",
                                        engine_version=__version__, engine_lock=engine_lock)
        if metrics_port is not None:
            agent.serve(port=metrics_port, host=metrics_host)
    async_engine = AsyncEngine(engine, on_step=_telemetry_hook(agent), lock=engine_lock)
    app = create_app(async_engine, metrics=agent.render if agent is not None else None, settings=settings)
    return ServingStack(engine=engine, async_engine=async_engine, telemetry=agent, app=app, settings=settings)


class GracefulServer(uvicorn.Server):
    """uvicorn whose shutdown is bounded: the first signal drains, a second one forces the exit.

    Args:
        config: uvicorn's config; its ``timeout_graceful_shutdown`` is a backstop a few seconds
            past the drain deadline.
        stack: the stack to drain.
    """

    def __init__(self, config: uvicorn.Config, stack: ServingStack):
        super().__init__(config)
        self.stack = stack

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        if self.should_exit:
            logger.warning("second %s: exiting now, without waiting for requests", signal.Signals(sig).name)
            self.force_exit = True  # uvicorn forces only on a second SIGINT; Kubernetes sends SIGTERM
            self.stack.async_engine.stop(timeout_s=0)  # no lifespan shutdown follows a forced exit
            return
        timeout_s = self.stack.settings.shutdown_timeout_s
        logger.warning("%s: shutting down; running requests may finish within %g s, queued ones are refused "
                       "(send it again to exit at once)", signal.Signals(sig).name, timeout_s)
        self.stack.async_engine.drain(timeout_s)
        super().handle_exit(sig, frame)


def run_server(stack: ServingStack, host: str, port: int, log_level: str = "warning") -> None:
    """Serve ``stack`` in the foreground until a signal (see :class:`GracefulServer`)."""
    config = uvicorn.Config(stack.app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(stack.settings.shutdown_timeout_s) + 5)
    GracefulServer(config, stack).run()


def _telemetry_hook(agent: TelemetryAgent | None) -> Callable[[LLMEngine], None] | None:
    if agent is None:
        return None

    def on_step(engine: LLMEngine) -> None:
        agent.on_step()  # polls at most every poll_interval_s, busy or idle

    return on_step
