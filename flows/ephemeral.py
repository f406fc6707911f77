"""Prefect's ephemeral API server must not outlive the ragpipe process that started it.

Prefect starts it as a child process (``python -m uvicorn ...``) and stops it
at a normal exit (atexit); a SIGKILLed or OOM-killed ingest leaves it running,
re-parented to init, ~220 MB each time. ``guard_ephemeral_server`` makes the
child run under ``ragpipe.orphan_guard``, which ends it when its parent is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

_GUARDED = "_ragpipe_guarded"


def guard_ephemeral_server() -> None:
    """Wrap the command of Prefect's ephemeral server (idempotent)."""
    from prefect.server.api import server

    cls = server.SubprocessASGIServer
    original = cls._run_uvicorn_command
    if getattr(original, _GUARDED, False):
        return

    def guarded(self: Any) -> subprocess.Popen[Any]:
        real_popen = subprocess.Popen
        parent = str(os.getpid())

        def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
            if list(args[:3]) == [sys.executable, "-m", "uvicorn"]:
                args = [sys.executable, "-m", "ragpipe.orphan_guard", parent, *args[2:]]
            return real_popen(args, **kwargs)

        # Prefect calls subprocess.Popen from its module: swapped for the one call only.
        setattr(subprocess, "Popen", popen)  # noqa: B010
        try:
            return original(self)
        finally:
            setattr(subprocess, "Popen", real_popen)  # noqa: B010

    setattr(guarded, _GUARDED, True)
    setattr(cls, "_run_uvicorn_command", guarded)  # noqa: B010
