"""ragpipe's own log lines (stage counts, the ingest summary, warnings) in Prefect run logs.

Every flow calls ``library_logs()`` first: it gives the ``ragpipe`` logger
Prefect's handlers (what ``PREFECT_LOGGING_EXTRA_LOGGERS=ragpipe`` does, which
the CLI and the Makefile set, but a worker started as the docs say, with
``prefect worker start``, had not: no ragpipe line reached a run's logs) and
the INFO level (the logger kept the root's WARNING, so the lines a team reads
on a run page were dropped). The CLI asks for WARNING unless ``--verbose``:
its console shows progress bars, not log lines.
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
    from prefect.settings import PREFECT_LOGGING_EXTRA_LOGGERS

    ours = logging.getLogger("ragpipe")
    ours.setLevel(_level if _level is not None else logging.INFO)
    if "ragpipe" in PREFECT_LOGGING_EXTRA_LOGGERS.value():
        return  # Prefect gave it its handlers already (those of its last logging setup)
    for handler in logging.getLogger("prefect.extra").handlers:  # as Prefect's extra loggers
        if handler not in ours.handlers:
            ours.addHandler(handler)
