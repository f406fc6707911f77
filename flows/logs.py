"""ragpipe's own log lines (stage counts, the ingest summary, warnings) in Prefect run logs.

``PREFECT_LOGGING_EXTRA_LOGGERS=ragpipe`` (set by prefect.yaml and the CLI)
attaches Prefect's handlers to the ``ragpipe`` logger, but the logger keeps
the root's level (WARNING), so the INFO lines a team reads on a run page were
dropped. Every flow calls ``library_logs()`` first. The CLI asks for WARNING
unless ``--verbose``: its console shows progress bars, not log lines.
"""

from __future__ import annotations

import logging

_level: int | None = None  # set by the CLI; flows on a worker use INFO


def set_library_level(level: int) -> None:
    """Used by the CLI before it runs a flow in this process."""
    global _level
    _level = level


def library_logs() -> None:
    """Let ragpipe's INFO lines through to Prefect's handlers (the run's logs)."""
    logging.getLogger("ragpipe").setLevel(_level if _level is not None else logging.INFO)
