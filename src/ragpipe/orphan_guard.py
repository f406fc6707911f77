"""Run a Python module as a child that dies with its parent.

``python -m ragpipe.orphan_guard PARENT_PID MODULE [ARGS...]`` runs MODULE
(like ``python -m MODULE ARGS``) in this process, with a watcher thread: when
PARENT_PID is no longer this process's parent (it exited, even by SIGKILL,
and the child was re-parented), the child terminates itself: SIGTERM first, so
a server shuts down cleanly, then a hard exit after a grace period.

ragpipe starts Prefect's ephemeral API server this way: Prefect stops it at a
normal exit, but a killed ingest would otherwise leave it running for good.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

POLL_S = 0.5
GRACE_S = 5.0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m ragpipe.orphan_guard PARENT_PID MODULE [ARGS...]")
    parent, module = int(argv[0]), argv[1]
    threading.Thread(target=_watch, args=(parent,), name="orphan-guard", daemon=True).start()
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
