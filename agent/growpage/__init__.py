"""GrowPage: per-request KV cache budgets that grow or compress at run time.

The package is layered one way: ``growpage.core`` (pool, summaries, policy, compression; pure
PyTorch) is imported by the homes (reference engine, vLLM plugin) and read by telemetry; it never
imports them back.
"""

__version__ = "0.1.0"

from growpage.config import GrowPageConfig, Mode, load_config
from growpage.errors import ConfigError, GrowPageError

__all__ = ["ConfigError", "GrowPageConfig", "GrowPageError", "Mode", "__version__", "load_config"]
