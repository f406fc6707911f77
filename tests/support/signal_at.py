"""Run one ``ragpipe`` command in this child process and SIGTERM it at a chosen point.

    python -m tests.support.signal_at MODULE:NAME[@N] [ARGS...]

``MODULE:NAME`` (a function, or a method as ``Class.method``) is replaced by one that, on
its N-th call (default the first), prints ``signal-at: POINT`` to stderr, sends this
process SIGTERM and waits for it to land, before doing its work: what happens then is
the command's own handling of SIGTERM. Where the command holds signals back
(``checkpoint.signals_deferred``), the work goes on and the signal lands as the block
ends. Left at its default, the process dies on the spot
(returncode -15): no ``finally`` runs, so a reader's copy of the index stays behind.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from typing import Any

MARK = "signal-at: "


def main(argv: list[str]) -> None:
    point, args = argv[0], argv[1:]
    target, _, nth = point.partition("@")
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    calls = [0]

    def signalled(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] == int(nth or 1):
            print(MARK + point, file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            if type(signal.getsignal(signal.SIGTERM)).__name__ == "_Held":  # signals_deferred:
                return real(*a, **k)  # it lands as the block it is in ends
            time.sleep(30)  # a handler that raises ends the sleep at once (PEP 475)
            raise AssertionError("SIGTERM did not stop the command within 30 s")
        return real(*a, **k)

    setattr(owner, name, signalled)
    from flows.cli import app

    app(args, prog_name="ragpipe")


if __name__ == "__main__":
    main(sys.argv[1:])
