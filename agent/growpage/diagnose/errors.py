"""The one error ``gpctl diagnose`` raises when it cannot diagnose at all (exit code 3)."""

from growpage.errors import GrowPageError


class DiagnoseError(GrowPageError):
    """The source could not be read: unreachable, timed out, not Prometheus data, no GrowPage series.

    The message is one line that says what was wrong and what to check. The CLI prints it and exits
    3; it never reaches the root group's generic exit 2.
    """
