"""Progress reporting for long stages, without tying the library to a UI.

Stages call :func:`reporter` and report through it. The default logs every
10 %; the CLI installs a terminal progress bar with :func:`set_reporter`.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

logger = logging.getLogger(__name__)


class Reporter(Protocol):
    """Receives progress of one stage at a time."""

    def start(self, stage: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def finish(self) -> None: ...


class LogReporter:
    """Logs progress at every 10 % step."""

    def __init__(self) -> None:
        self.stage = ""
        self.total = 0
        self.done = 0
        self._last_decile = -1

    def start(self, stage: str, total: int) -> None:
        self.stage, self.total, self.done, self._last_decile = stage, total, 0, -1

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.total:
            decile = 10 * self.done // self.total
            if decile != self._last_decile:
                self._last_decile = decile
                logger.info("%s: %d/%d", self.stage, self.done, self.total)

    def finish(self) -> None:
        pass


_lock = threading.Lock()
_reporter: Reporter = LogReporter()


def set_reporter(new: Reporter) -> Reporter:
    """Install a reporter; returns the previous one so callers can restore it."""
    global _reporter
    with _lock:
        old, _reporter = _reporter, new
    return old


def reporter() -> Reporter:
    """The reporter currently installed."""
    return _reporter
