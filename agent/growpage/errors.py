"""The one error family the library raises for user-facing problems.

The CLI catches :class:`GrowPageError` and prints its message as a single line; everything else is
a bug and keeps its traceback. Messages say what is wrong *and* how to fix it.
"""


class GrowPageError(Exception):
    """A problem the user can fix: bad input, missing file, unreachable endpoint."""


class ConfigError(GrowPageError, ValueError):
    """A configuration value is invalid. The message names the field and the fix."""
