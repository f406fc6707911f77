"""`ragpipe index ...`: looking after the index itself (today: freeing a writer slot)."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli_common import ConfigOption, StorePathOption, fail, prefect_env
from ragpipe.config import load_config
from ragpipe.errors import ConfigError, RagpipeError

index_app = typer.Typer(help="Look after the index: free a writer slot a killed run left.",
                        no_args_is_help=True)  # fmt: skip


@index_app.command("unlock")
def unlock(
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Free the slot even when its holder may be alive (on another host, where it "
            "cannot be checked from here). Two writers at once corrupt nothing (the file locks "
            "stay underneath) but the second then refuses.",
        ),
    ] = False,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Free the index's writer slot when the ingest holding it is gone.

    Every ingest takes the index's Prefect writer slot (ragpipe-writer-<id>) and records
    itself beside it (host, pid, start time). An ingest waiting for the slot frees it by
    itself when its holder on this host no longer runs; this command does it by hand and
    says what it frees, e.g. for a holder that ran on another host. The file locks need no
    unlocking: the kernel releases them when their holder exits. Exit 0 when the slot is
    free afterwards, 2 when a live holder keeps it (without --force).
    """
    prefect_env(verbose)
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from flows.concurrency import describe_holder, free_slot, read_holder, writer_limit_name
    from ragpipe.locking import holder_alive, index_identity

    try:
        cfg = load_config(config, {"store": {"path": str(store_path)}} if store_path else {})
        name = writer_limit_name(cfg)
        with get_client(sync_client=True) as client:
            try:
                limit = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:  # no ingest ever ran here
                print(f"no writer slot for {index_identity(cfg)} yet ({name}): nothing to free")
                return
        holder = read_holder(name)
        if limit.active_slots == 0:
            print(f"the writer slot {name} of {index_identity(cfg)} is free: nothing to free")
            return
        alive = holder_alive(holder) if holder is not None else False
        who = describe_holder(holder)
        if alive and not force:
            raise ConfigError(
                f"the writer slot {name} is held by a running ingest ({who}): stop it (SIGTERM "
                "or Ctrl-C gives the slot back) and run this again"
            )
        if alive is None and not force:
            raise ConfigError(
                f"the writer slot {name} is held by {who}, which cannot be checked from this "
                "host: pass --force if you know that run is gone"
            )
        state = {True: "still running", None: "not checkable from here", False: "gone"}[alive]
        free_slot(name, f"ragpipe index unlock ({who}, {state})")
    except RagpipeError as exc:
        fail(exc, 2)
    print(
        f"freed the writer slot {name} of {index_identity(cfg)}, held by {who} ({state}). The "
        "file locks need no unlocking: the kernel releases them when their holder exits."
    )
