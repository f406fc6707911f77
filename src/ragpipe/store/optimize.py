"""Build a Qdrant Edge store's HNSW index in a child process.

``python -m ragpipe.store.optimize PARENT_PID PATH`` loads the shard at PATH,
optimizes it (builds the HNSW index over the points outside it), flushes and
closes it. ``EdgeStore.build_index`` runs it so: the engine holds Python's GIL
for the whole build (6 minutes at a million points on 2 cores), so in the
ingest process no other thread would run meanwhile (no progress, no log
shipping) and Ctrl-C would wait for the end. The parent closes its shard
first and loads it again after.

On Linux the child asks the kernel to kill it when its parent dies
(``PR_SET_PDEATHSIG``): an orphaned build must not go on writing a store that
the next run opens. A kill mid-build loses only the build: the engine swaps a
new segment in when it is complete.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the line above took effect
        raise SystemExit("ragpipe.store.optimize: the process that started this build is gone")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m ragpipe.store.optimize PARENT_PID STORE_PATH")
    die_with_parent(int(argv[0]))
    import qdrant_edge

    shard = qdrant_edge.EdgeShard.load(argv[1])
    shard.optimize()
    shard.flush()
    shard.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
