"""`ragpipe index ...`: looking after the index itself: its versions (list, promote,
discard) and its writer slot (unlock)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli_common import ConfigOption, StorePathOption, console, fail, prefect_env
from ragpipe.config import RagpipeConfig, load_config, relative_path_note
from ragpipe.errors import ConfigError, RagpipeError, StageError

index_app = typer.Typer(
    help="Look after the index: its versions (list, promote, discard; see index.gate) and "
    "its writer slot (unlock).",
    no_args_is_help=True,
)


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
                f"the writer slot {name} is held by {who}, which cannot be checked from here "
                "(another host, or another container): pass --force if you know that run "
                "is gone"
            )
        state = {True: "still running", None: "not checkable from here", False: "gone"}[alive]
        free_slot(name, f"ragpipe index unlock ({who}, {state})")
    except RagpipeError as exc:
        fail(exc, 2)
    print(
        f"freed the writer slot {name} of {index_identity(cfg)}, held by {who} ({state}). The "
        "file locks need no unlocking: the kernel releases them when their holder exits."
    )


def _versioned_config(config: Path | None, store_path: Path | None) -> RagpipeConfig:
    from ragpipe.ingest.gatekeep import require_versions

    cfg = load_config(config, {"store": {"path": str(store_path)}} if store_path else {})
    require_versions(cfg)
    return cfg


@index_app.command("list")
def list_versions(
    as_json: Annotated[bool, typer.Option("--json", help="Print the versions as JSON.")] = False,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """List the index's versions on disk, newest first: which one readers open (live),
    which the gate held or staged, and why.

    Without index.gate every ingest that changed the index publishes a version and only the
    live one is kept; with a gate, held versions stay (the newest 3) until promoted or
    discarded.
    """
    from ragpipe.store import versions as index_versions

    try:
        cfg = _versioned_config(config, store_path)
        versions = index_versions.list_versions(cfg.store)
        edge = cfg.store.backend.value == "edge"
        # Absolute, and where a relative path was taken from: `--config "other dir/..."`
        # run elsewhere looked for the working directory's data/store and said "yet", exit 0.
        where = os.path.abspath(cfg.store.path) if edge else cfg.store.collection
        behind = cfg.file_behind("store.path")
        note = relative_path_note(cfg.store.path, "store.path", behind) if edge else ""
        if edge and not versions and not cfg.store.path.exists():
            raise StageError(
                f"no index at {where}: run `ragpipe ingest` first (or point store.path at an "
                f"existing index){note}"
            )
    except RagpipeError as exc:
        fail(exc, 2)
    if as_json:
        print(json.dumps([asdict(v) for v in versions], indent=2))
        return
    if not versions:
        print(f"no published version of {where} yet: run `ragpipe ingest`{note}")
        return
    table = Table(title=f"index versions ({where})")
    for column in ("version", "status", "published", "files", "points", "gate"):
        table.add_column(column)
    working = index_versions.working_generation(cfg.store)
    for v in versions:
        verdict = v.verdict or {}
        why = "; ".join(verdict.get("reasons", [])) or (
            "passed" if verdict.get("passed")
            else "not gated" if v.status != "staged"
            else "not judged yet (the next ingest judges it)" if v.generation == working
            else "superseded before it was judged: promote or discard it by hand"
        )  # fmt: skip
        status = f"{v.status} (live)" if v.live else v.status
        table.add_row(v.generation[:12], status, v.published_at[:19].replace("T", " "),
                      str(v.files), str(v.points), why)  # fmt: skip
    console.print(table)


@index_app.command("promote")
def promote(
    version: Annotated[str, typer.Argument(help="The version (or a unique prefix) to make live.")],
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """Make VERSION live by hand: readers opened after this see it (a held version, or the
    one a promotion replaced, to roll back to: it is kept until the next promotion). Takes
    the index's writer lock, so never beside an ingest."""
    from ragpipe.ingest.gatekeep import promote_by_hand

    try:
        cfg = _versioned_config(config, store_path)
        decision = promote_by_hand(cfg, version)
    except RagpipeError as exc:
        fail(exc, 2)
    print(decision.line)
    if os.environ.get("PREFECT_API_URL"):  # a server automations listen on
        from flows.events import emit_index_decision

        emit_index_decision(cfg, decision, str(config) if config is not None else None)


@index_app.command("discard")
def discard(
    version: Annotated[str, typer.Argument(help="The version (or a unique prefix) to remove.")],
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """Remove VERSION (a held one, say) from disk; the live version cannot be discarded."""
    from ragpipe.ingest.gatekeep import discard_by_hand

    try:
        generation = discard_by_hand(_versioned_config(config, store_path), version)
    except RagpipeError as exc:
        fail(exc, 2)
    print(f"version {generation[:12]} removed")
