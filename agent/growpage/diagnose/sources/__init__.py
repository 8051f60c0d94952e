"""Where observations come from: a live agent endpoint, a Prometheus server, or saved snapshots.

Each source returns :class:`~growpage.diagnose.observations.Observations` plus the raw material it
read (for ``--bundle``), and raises :class:`~growpage.diagnose.errors.DiagnoseError` with one line
that says what to check when it cannot.
"""
