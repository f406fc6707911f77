"""One writer per index across every deployment: a Prefect global concurrency limit.

The nightly deployment cancels an overlapping run of itself, but a manual
re-index (another deployment, or a run with other parameters) of the same
index would meet the nightly's file lock and give up after
``index.lock_timeout_s``. Every ingest flow first takes the one slot of the
index's global concurrency limit, ``ragpipe-writer-<index id>``, created with
limit 1 on first use: a second writer is queued by Prefect (the run shows as
Running, its log says what it waits for) and starts when the first finishes.
The file locks stay underneath, for writers that share no Prefect server.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from ragpipe.config import RagpipeConfig
from ragpipe.locking import WAIT_NOTICE_S, index_identity

log = logging.getLogger("ragpipe.flows")

# A free slot is granted in one request; a run that waits longer says so at once.
FIRST_TRY_S = 2.0


def writer_limit_name(config: RagpipeConfig) -> str:
    """The global concurrency limit of the index ``config.store`` names."""
    digest = hashlib.sha256(index_identity(config).encode()).hexdigest()[:16]
    return f"ragpipe-writer-{digest}"


def _ensure_limit(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another writer created it first
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1)
                )


@contextmanager
def writer_slot(config: RagpipeConfig) -> Iterator[str]:
    """Hold the index's writer slot for the body; wait (saying so) while another holds it."""
    name = writer_limit_name(config)
    _ensure_limit(name)
    started = time.monotonic()
    with ExitStack() as stack:
        timeout = FIRST_TRY_S
        while True:
            try:
                stack.enter_context(
                    concurrency(name, occupy=1, timeout_seconds=timeout, strict=True)
                )
                break
            except TimeoutError:
                log.info(
                    "ingest: waiting for the writer slot %s of %s: another ingest of this "
                    "index is running (%.0f s so far)",
                    name, index_identity(config), time.monotonic() - started,
                )  # fmt: skip
                timeout = WAIT_NOTICE_S
        if timeout != FIRST_TRY_S:
            log.info("ingest: got the writer slot %s after %.0f s", name,
                     time.monotonic() - started)  # fmt: skip
        yield name
