"""One writer per index across every deployment: a Prefect global concurrency limit.

The nightly deployment cancels an overlapping run of itself, but a manual
re-index (another deployment, or a run with other parameters) of the same
index would meet the nightly's file lock and give up after
``index.lock_timeout_s``. Every ingest flow first takes the one slot of the
index's global concurrency limit, ``ragpipe-writer-<index id>``, created with
limit 1 on first use: a second writer is queued by Prefect (the run shows as
Running, its log says what it waits for) and starts when the first finishes.
The file locks stay underneath, for writers that share no Prefect server.

A slot must not outlive its holder. Prefect leases slots, but in ephemeral mode
(the CLI) the lease lives in the memory of a server that dies with the run: a
SIGKILLed or OOM-killed ingest left its slot taken in the database, and every
later ingest of the index waited forever. So the holder records itself beside
the slot, as the Prefect variable ``<limit>-holder`` (host, pid, boot id and
process start time), and a waiting writer frees a slot whose holder is gone: a
process on this host that no longer runs (or a reused pid), or no record at all
for ``HOLDER_GRACE_S`` (a live holder records itself within milliseconds). A
holder on another host cannot be checked from here: its lease expires on a real
Prefect server, or ``ragpipe index unlock`` frees it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
    VariableCreate,
)
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from ragpipe.config import RagpipeConfig
from ragpipe.errors import StageError
from ragpipe.locking import WAIT_NOTICE_S, holder_alive, index_identity, process_identity

log = logging.getLogger("ragpipe.flows")

# A free slot is granted in one request; a run that waits longer says so at once.
FIRST_TRY_S = 2.0
# How often a waiting writer asks again, and looks at the holder.
CHECK_S = 5.0
# A taken slot with no holder record for this long has lost its holder.
HOLDER_GRACE_S = 10.0


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


def holder_variable(name: str) -> str:
    return f"{name}-holder"


def read_holder(name: str) -> dict[str, Any] | None:
    """The recorded holder of the slot ``name``, or None."""
    with get_client(sync_client=True) as client:
        variable = client.read_variable_by_name(holder_variable(name))
    value = variable.value if variable is not None else None
    return value if isinstance(value, dict) else None


def _record_holder(name: str) -> None:
    with get_client(sync_client=True) as client:
        with suppress(ObjectNotFound):
            client.delete_variable_by_name(holder_variable(name))
        client.create_variable(VariableCreate(name=holder_variable(name), value=process_identity()))


def _clear_holder(name: str) -> None:
    with get_client(sync_client=True) as client, suppress(ObjectNotFound):
        client.delete_variable_by_name(holder_variable(name))


def describe_holder(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "no recorded holder"
    return f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"


def free_slot(name: str, why: str) -> None:
    """Give the slot back on behalf of a holder that is gone."""
    log.warning("ingest: freeing the writer slot %s: %s", name, why)
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
        with suppress(ObjectNotFound):
            client.delete_variable_by_name(holder_variable(name))


def _gone(name: str, unrecorded_since: float | None) -> tuple[str | None, float | None]:
    """Why the slot's holder is gone (None: it may be alive), and since when it has had no
    record."""
    holder = read_holder(name)
    if holder is None:
        now = time.monotonic()
        since = unrecorded_since if unrecorded_since is not None else now
        if now - since >= HOLDER_GRACE_S:
            return f"no holder has recorded itself for {now - since:.0f} s", since
        return None, since
    if holder_alive(holder) is False:
        return f"its holder ({describe_holder(holder)}) is no longer running", None
    return None, None


class _SlotTimeouts(logging.Filter):
    """Drops Prefect's "service failed to process item" error for a slot request that
    timed out: ``writer_slot`` asked with a timeout and handles it (any other failure
    still reaches it as the exception), so it is no error for cron mail."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.msg == "Service %r failed to process item %r"
            and isinstance(record.args, tuple)
            and record.args[:1] == ("ConcurrencySlotAcquisitionWithLeaseService",)
        )


@contextmanager
def writer_slot(config: RagpipeConfig, wait_s: float | None = None) -> Iterator[str]:
    """Hold the index's writer slot for the body; wait (saying so) while a live writer
    holds it; free it from a holder that is gone.

    Args:
        wait_s: How long to wait for a live holder, then refuse (StageError, exit 2);
            None waits until it finishes (a deployment run queues behind the nightly).
    """
    name = writer_limit_name(config)
    _ensure_limit(name)
    started = time.monotonic()
    told = 0.0
    unrecorded: float | None = None
    quiet = _SlotTimeouts()
    prefect_log = logging.getLogger("prefect._internal.concurrency")
    with ExitStack() as stack:
        prefect_log.addFilter(quiet)
        stack.callback(prefect_log.removeFilter, quiet)
        timeout = FIRST_TRY_S
        while True:
            try:
                stack.enter_context(
                    concurrency(name, occupy=1, timeout_seconds=timeout, strict=True)
                )
                break
            except TimeoutError:
                why, unrecorded = _gone(name, unrecorded)
                if why is not None:
                    free_slot(name, why)
                    unrecorded = None
                    continue
                waited = time.monotonic() - started
                if wait_s is not None and waited >= wait_s and unrecorded is None:
                    raise StageError(
                        f"another ingest of this index holds its writer slot {name} "
                        f"({describe_holder(read_holder(name))}). Waited {waited:.0f} s "
                        "(index.lock_timeout_s). Runs never interleave: try again when it "
                        "has finished (a run of a deployment queues for the slot instead)."
                    ) from None
                if not told or waited - told >= WAIT_NOTICE_S:
                    told = waited
                    log.warning(
                        "ingest: waiting for the writer slot %s of %s: another ingest of this "
                        "index is running (%s; %.0f s so far)",
                        name, index_identity(config), describe_holder(read_holder(name)),
                        waited,
                    )  # fmt: skip
                timeout = CHECK_S if wait_s is None else min(CHECK_S, max(wait_s - waited, 1.0))
        # Released before the slot (LIFO): a recorded holder always holds the slot.
        _record_holder(name)
        stack.callback(_clear_holder, name)
        if timeout != FIRST_TRY_S:
            log.info("ingest: got the writer slot %s after %.0f s", name,
                     time.monotonic() - started)  # fmt: skip
        yield name
