"""The plan stage: diff the discovered files against the store.

* A point's ID is UUIDv5 over (file path, source SHA, index fingerprint,
  chunk index): a changed file, or an unchanged file under a changed config,
  gets new points; re-writing the same version is idempotent.
* Only complete versions count as indexed (every chunk stored).
* The diff reads the store in one scroll, except when the Edge store has not
  been written since the last scroll (its generation token is unchanged):
  then the saved result of that scroll is the store's content, and a no-op
  run costs only hashing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe import checkpoint
from ragpipe.config import EmbedProvider, RagpipeConfig, StoreBackend
from ragpipe.errors import ConfigError
from ragpipe.ingest import runner
from ragpipe.ingest.chunk import chunk_fingerprint
from ragpipe.ingest.objects import HOLDING_CATEGORIES
from ragpipe.models.embedders import (
    embedder_fingerprint,
    embedder_name,
    make_embedder,
)
from ragpipe.schemas import Failure, PlanEntry, SourceFile
from ragpipe.store import (
    FileVersions,
    StoreMeta,
    VersionStats,
    Where,
    check_store_settings,
    check_store_space,
    peek_meta,
    store_generation,
)
from ragpipe.web.pages import GONE_CATEGORIES

logger = logging.getLogger(__name__)


# Discovery failures of a folder: files indexed below a missing root or an unreadable
# directory are kept (the run says why, and exits 1), never removed as if deleted.
UNLISTED = frozenset({"missing_root", "unreadable"})

POINT_NAMESPACE = uuid.UUID("5d1f0c9e-3b7a-4c2e-9a61-0f8e2b4d7c13")

# The payload field (and embeddings column) naming the other files whose points hold the
# texts a file's chunks skipped as duplicates (``embed.dedupe_chunks``), on the first point
# the file keeps. Its chunk_total counts only the chunks it keeps, so its version is
# complete without them: a change to such another file deleted the only copy of the text,
# and the unchanged file never got it back. The plan re-indexes it instead.
HELD_BY = "dedupe_held_by"


def index_fingerprint(config: RagpipeConfig) -> str:
    """Everything that shapes a stored point: converter, cleaner, chunker, embedder."""
    return checkpoint.combine_fingerprints(
        [chunk_fingerprint(config), embedder_fingerprint(config.embed)]
    )


def point_id(file_path: str, source_sha: str, index_fp: str, chunk_index: int) -> str:
    """Deterministic point ID of one chunk of one version of one file."""
    key = f"{file_path}\x1f{source_sha}\x1f{index_fp}\x1f{chunk_index}"
    return str(uuid.uuid5(POINT_NAMESPACE, key))


def _read_optional(path: Path, record_type: type) -> list[object]:
    return checkpoint.read_records(path, record_type) if path.is_file() else []


# -- plan ----------------------------------------------------------------------------

_VERSIONS_SCHEMA = pa.schema(
    [
        ("file_path", pa.string()),
        ("source_sha", pa.string()),
        ("config_fingerprint", pa.string()),
        ("points", pa.int64()),
        ("chunk_total", pa.int64()),
    ]
)


def _versions_key(config: RagpipeConfig, generation: str) -> dict[str, str]:
    return {"store": str(config.store.path.resolve()), "generation": generation}


def save_versions(config: RagpipeConfig, versions: FileVersions) -> None:
    """Remember the store's file versions under its current generation (Edge only)."""
    generation = store_generation(config.store)
    if generation is None:
        return
    rows = [
        (path, sha, fp, stats.points, stats.chunk_total)
        for path, by_version in versions.items()
        for (sha, fp), stats in by_version.items()
    ]
    columns: list[Sequence[object]] = [list(c) for c in zip(*rows, strict=True)] or [
        [] for _ in _VERSIONS_SCHEMA
    ]
    table = pa.table(
        [pa.array(c, f.type) for c, f in zip(columns, _VERSIONS_SCHEMA, strict=True)],
        schema=_VERSIONS_SCHEMA,
    ).replace_schema_metadata(_versions_key(config, generation))
    checkpoint.write_table(runner.WorkDir.of(config).store_versions, table)


def saved_versions(config: RagpipeConfig) -> FileVersions | None:
    """The saved versions when the store was not written since they were saved, else None."""
    generation = store_generation(config.store)
    path = runner.WorkDir.of(config).store_versions
    if generation is None or not path.is_file():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    stored = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if stored != _versions_key(config, generation):
        return None
    versions: FileVersions = {}
    for path_, sha, fp, points, total in zip(
        *(table.column(name).to_pylist() for name in _VERSIONS_SCHEMA.names), strict=True
    ):
        versions.setdefault(path_, {})[(sha, fp)] = VersionStats(points, total)
    return versions


def stored_versions(
    config: RagpipeConfig, run_store: runner.RunStore | None = None
) -> FileVersions:
    """Per file, the versions in the store: from one scroll, or its saved result.

    The saved result is used only while the Edge store's generation token is
    the one it was saved under; the embedder check of opening the store runs
    either way.
    """
    name = embedder_name(config.embed)
    cached = saved_versions(config)
    meta = peek_meta(config.store) if cached is not None else None
    if cached is not None and meta is not None:  # no metadata: opening the store rebuilds it
        StoreMeta(name, None).check(meta, str(config.store.path))
        return cached
    with runner.stage_store(config, run_store) as stores:
        store = stores.existing()
        if store is None:
            return {}
        versions = store.file_versions()
    save_versions(config, versions)
    return versions


@dataclass
class PlanCounts(runner.Counts):
    """The store as the plan found it, and how many files take each action."""

    indexed_files: int = 0
    points_total: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    cleanup: int = 0
    removed: int = 0
    # Of ``changed``: unchanged files re-indexed as a file holding their duplicate texts
    # changes or goes (``HELD_BY``).
    changed_for_duplicates: int = field(default=0, metadata={"optional": True})


def run_plan(
    config: RagpipeConfig,
    discovered: runner.StageSummary[Any],
    store: runner.RunStore | None = None,
) -> runner.StageSummary[PlanCounts]:
    """Diff discovered files against the store in one paginated scroll.

    Always runs: the store, not a checkpoint, is the truth about what is indexed.
    ``store``: the run's (see ``RunStore``); without it the plan opens its own.
    """
    started = time.perf_counter()
    check_store_space(config.store)  # a full disk stops the run here, not after converting
    check_store_settings(config.store)  # so does a setting the store cannot take
    if config.store.backend != StoreBackend.EDGE:
        from ragpipe.store.server_versions import check_alias, check_not_alias

        if config.index.gate is not None:
            check_alias(config.store)  # readers' alias is free, or is ours
        else:
            check_not_alias(config.store)  # and no gated index's alias is written through
    sources = runner.read_input(config, discovered, "files.parquet", SourceFile)
    # A source that failed discovery (unreadable file, page timing out) still exists,
    # unless the failure says it is gone (a page answering 404).
    failures = runner.read_input(config, discovered, "failures.parquet", Failure)
    # (A records file with some bad records is not itself present: its records are.)
    unreadable = {
        f.file_path for f in failures if f.category not in GONE_CATEGORIES | {"bad_records"}
    }
    # A root that is missing or could not be listed, and a directory that could not be
    # read, keep everything indexed below them; a records file with a failure row keeps
    # its records (FILE#ID) that did not come out this run.
    held = tuple(
        [
            "" if f.file_path == "." else f.file_path + "/"
            for f in failures
            if f.category in HOLDING_CATEGORIES | UNLISTED
        ]
        + [f.file_path + "#" for f in failures if f.category not in GONE_CATEGORIES]
    )
    index_fp = index_fingerprint(config)
    versions = stored_versions(config, store)
    todo: list[SourceFile] = []
    entries: list[PlanEntry] = []
    for source in sources:
        stored = versions.get(source.file_path, {})
        current = stored.get((source.sha256, index_fp))
        if current is not None and current.complete:
            action = "cleanup" if len(stored) > 1 else "unchanged"
        else:
            action = "changed" if stored else "added"
            todo.append(source)
        entries.append(PlanEntry(source.file_path, action, source.sha256, len(stored)))
    present = {s.file_path for s in sources} | unreadable
    for path in sorted(set(versions) - present):
        if held and path.startswith(held):
            continue
        entries.append(PlanEntry(path, "removed", None, len(versions[path])))
    redone = _redo_duplicates(config, store, entries, sources, todo)
    if todo and config.embed.provider in (EmbedProvider.OLLAMA, EmbedProvider.OPENAI):
        # A remote embedder that is down or lacks the model fails now, before any
        # conversion work, not after it (the probe embeds one short text).
        dim = make_embedder(config.embed).dim
        logger.info("plan: the %s embedder answers (%d dimensions)", config.embed.provider, dim)
    if not config.index.allow_mass_delete:
        _refuse_relabelled(todo, [e.file_path for e in entries if e.action == "removed"],
                           versions)  # fmt: skip
    actions = Counter(e.action for e in entries)
    counts = PlanCounts(
        indexed_files=len(versions),
        points_total=sum(v.points for file in versions.values() for v in file.values()),
        **{
            action: actions[action]
            for action in ("added", "changed", "unchanged", "cleanup", "removed")
        },
        changed_for_duplicates=redone,
    )
    return runner.finish_stage(
        runner.WorkDir.of(config).stage("plan"),
        "plan",
        index_fp,
        discovered.output_fingerprint,
        {"files": (todo, SourceFile), "plan": (entries, PlanEntry)},
        counts,
        started,
        plan_id(config, entries, todo),
    )


def _redo_duplicates(
    config: RagpipeConfig,
    run_store: runner.RunStore | None,
    entries: list[PlanEntry],
    sources: Sequence[SourceFile],
    todo: list[SourceFile],
) -> int:
    """Plan as changed (in place) every unchanged file that skipped a duplicate text held by
    a file whose stored points this run deletes or replaces (changed, cleaned up, removed):
    its points name those files (``HELD_BY``). Re-chunked, it keeps the text itself unless
    a point the run keeps holds it still. Returns how many files it re-planned.

    One filtered scroll, only in a run that deletes or replaces stored points; a store
    written before dedupe_chunks was ever on has no such field and answers nothing."""
    going = sorted(
        e.file_path
        for e in entries
        if e.action in ("changed", "cleanup", "removed") and e.stored_versions
    )
    if not going or not any(e.action in ("unchanged", "cleanup") for e in entries):
        return 0  # nothing deleted, or every file re-indexed anyway (a new fingerprint)
    skippers: set[str] = set()
    with runner.stage_store(config, run_store) as stores:
        store = stores.existing()
        if store is None:
            return 0
        for start in range(0, len(going), 1024):  # a bounded filter per scroll
            where = Where(must={HELD_BY: going[start : start + 1024]})
            skippers.update(
                str(hit.payload.get("file_path"))
                for hit in store.scroll(where, fields=["file_path"])
            )
    by_path = {s.file_path: s for s in sources}
    redone = 0
    for i, entry in enumerate(entries):
        if entry.file_path in skippers and entry.action in ("unchanged", "cleanup"):
            entries[i] = PlanEntry(
                entry.file_path, "changed", entry.source_sha256, entry.stored_versions
            )
            todo.append(by_path[entry.file_path])
            redone += 1
    if redone:
        todo.sort(key=lambda s: s.file_path)  # as discovered
        logger.info(
            "plan: re-indexing %d unchanged file(s) whose duplicate chunks (embed.dedupe_chunks) "
            "are held by a file this run changes or removes",
            redone,
        )
    return redone


def _refuse_relabelled(
    todo: Sequence[SourceFile], removed: Sequence[str], versions: FileVersions
) -> None:
    """ConfigError when files to add are indexed files under another spelling of their
    root (``docs`` then ``/home/me/docs``, or a symlink to it): a file's identity is its
    root as written, so each would be indexed twice (the mass-deletion guard held the old
    entries while the new ones were written), or re-embedded without a word.

    Told by the path below the root (a record's ``#id`` included) being the same and the
    two roots being one real folder; a file renamed or hard-linked under the same root is
    no such case."""
    below: dict[str, list[SourceFile]] = {}
    given: dict[str, list[SourceFile]] = {}  # roots that are files: "" or a record's "#id"
    for source in todo:
        if source.root == ".":  # files below the working directory are named as they are
            below.setdefault(source.file_path, []).append(source)
        elif "://" in source.file_path:
            continue  # a page or an object: no folder to be spelled otherwise
        elif source.file_path.startswith(source.root + "/"):
            below.setdefault(source.file_path[len(source.root) + 1 :], []).append(source)
        elif source.file_path == source.root or source.file_path.startswith(source.root + "#"):
            given.setdefault(source.file_path[len(source.root) :], []).append(source)
    if not below and not given:
        return
    real = functools.lru_cache(maxsize=None)(os.path.realpath)
    pairs: list[tuple[str, SourceFile, str]] = []
    for path in removed:
        if "://" in path or path not in versions:
            continue
        parts = path.split("/")
        splits = [  # every split of the path into a root folder and the path below it
            (("/".join(parts[:cut]) or "/") if cut else ".", below.get("/".join(parts[cut:])))
            for cut in range(len(parts))
        ]
        splits += [  # a root that is a file, and a record of it
            (path[:at], given.get(path[at:]))
            for at in [len(path), *(i for i, c in enumerate(path) if c == "#")]
        ]
        for old_root, sources in splits:
            for source in sources or []:
                if old_root != source.root and real(old_root) == real(source.root):
                    pairs.append((path, source, old_root))
    if not pairs:
        return
    old, source, was = pairs[0]
    raise ConfigError(
        f"discover.roots: {len(pairs)} indexed file(s) are the same files under another "
        f"spelling of their root ({old!r} is now {source.file_path!r}): a file's identity is "
        f"its root as written, so they would be indexed twice. Spell the root as before "
        f"({was!r}), or re-index them under the new spelling with --allow-mass-delete "
        "(index.allow_mass_delete: their old entries are deleted)"
    )


def plan_id(config: RagpipeConfig, entries: Sequence[PlanEntry], todo: Sequence[SourceFile]) -> str:
    """The plan's identity, which every later stage checks its input carries: a hash of what the
    plan says, of the store it says it of and of the settings it plans for. Two runs that plan
    the same work on the same store get the same id (their checkpoints are the same), so an
    unchanged night reuses, and Prefect caches, every stage after the plan; a run that planned
    anything else is told apart (``runner.checked_manifest``)."""
    store = config.store
    where = (
        f"{store.backend.value}\x1f{store.url or store.path.resolve()}\x1f{store.collection}"
        f"\x1f{index_fingerprint(config)}"
    )
    digest = hashlib.sha256(where.encode())
    for entry in entries:
        digest.update(repr(entry).encode())
    digest.update(b"\x1e")
    for source in todo:
        digest.update(repr(source).encode())
    return digest.hexdigest()[:32]
