"""Index versions on a Qdrant server (or qdrant-client's local mode): blue/green by alias.

With ``index.gate`` and ``store.backend: qdrant`` the ingest writes the working
collection ``<collection>-ragpipe-work`` (incrementally, as always). A changed
working collection is **staged** as a collection of its own,
``<collection>-ragpipe-<generation>`` (its points copied with their vectors),
the gate evaluates it against the live one, and **promoting** it is one atomic
alias switch: readers query the alias ``<collection>``, so every search after
the switch sees the new version and none sees half of it. Held versions stay,
inspectable and promotable by hand; the statuses (and the gate's verdicts) are
kept in the metadata of ``<collection>-ragpipe-versions`` (a collection without
points), as ``versions.json`` is for Edge: rebuilding the working collection
loses none of them.

Kept: the live version, the one it replaced (to roll back to, and the grace
period for searches that resolved the alias just before a switch: it is dropped
at the next promotion, not this one) and the newest ``KEEP_HELD`` held ones.
The functions mirror ``ragpipe.store.published`` (Edge); ``ragpipe.store.versions``
picks one by backend.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from ragpipe.config import StoreConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.store.base import StoreMeta
from ragpipe.store.published import (
    DISCARDED,
    HELD,
    PROMOTED,
    STAGED,
    IndexVersion,
    VersionEntry,
    entry,
    kept,
    pick,
)
from ragpipe.store.qdrant import GENERATION_KEY, WORK_SUFFIX, QdrantStore, connect

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

logger = logging.getLogger(__name__)

STATUS_KEY = "ragpipe_versions"  # in the status collection's metadata
VERSION_KEY = "ragpipe_version"  # in a version collection's metadata, once its copy is whole
PREFIX = "-ragpipe-"


def working_collection(config: StoreConfig) -> str:
    return config.collection + WORK_SUFFIX


def version_collection(config: StoreConfig, generation: str) -> str:
    return f"{config.collection}{PREFIX}{generation}"


def status_collection(config: StoreConfig) -> str:
    return f"{config.collection}{PREFIX}versions"


def _generation_of(config: StoreConfig, collection: str) -> str | None:
    """The generation a version collection's name carries (None: not one of ours; the
    generation tokens are 32 hex digits, so another index's collections never match)."""
    found = re.fullmatch(re.escape(config.collection + PREFIX) + "([0-9a-f]{32})", collection)
    return found.group(1) if found else None


@contextmanager
def _client(config: StoreConfig) -> Iterator[QdrantClient]:
    client, _ = connect(config)
    try:
        yield client
    finally:
        client.close()


def _metadata(client: QdrantClient, collection: str) -> dict[str, Any] | None:
    if not client.collection_exists(collection):
        return None
    return dict(client.get_collection(collection).config.metadata or {})


def generation(config: StoreConfig) -> str | None:
    """The working collection's generation token (None: not written yet)."""
    with _client(config) as client:
        meta = _metadata(client, working_collection(config)) or {}
    token = meta.get(GENERATION_KEY)
    return str(token) if token else None


def current(config: StoreConfig) -> str | None:
    """The generation the alias points at (None: no version is live)."""
    with _client(config) as client:
        return _current(client, config)


def _current(client: QdrantClient, config: StoreConfig) -> str | None:
    prefix = config.collection + PREFIX
    for alias in client.get_aliases().aliases:
        if alias.alias_name == config.collection and alias.collection_name.startswith(prefix):
            return alias.collection_name[len(prefix) :]
    return None


def check_alias(config: StoreConfig) -> None:
    """ConfigError when ``store.collection`` is a collection, not the versions' alias."""
    with _client(config) as client:
        if client.collection_exists(config.collection) and _current(client, config) is None:
            raise ConfigError(
                f"store.collection {config.collection!r} is a collection on the Qdrant server; "
                "with index.gate readers query an alias of that name, switched from version "
                "to version. Choose a new store.collection (the next ingest builds it), or "
                "delete that collection first"
            )


def check_not_alias(config: StoreConfig) -> None:
    """ConfigError when ``store.collection`` is the versions' alias and no gate is set: an
    ingest would write the live version's own collection in place, through the alias (its
    recorded points and files wrong, the version a roll-back returns to rewritten)."""
    with _client(config) as client:
        live = _current(client, config)
    if live is not None:
        raise ConfigError(
            f"store.collection {config.collection!r} is the alias readers of a gated index "
            f"query (version {live[:12]} is live): without index.gate an ingest would write "
            "that version in place. Set index.gate again (its versions go on), or choose a "
            "new store.collection for an index without versions"
        )


def statuses(config: StoreConfig) -> dict[str, dict[str, Any]]:
    """Every version's recorded status: {generation: {status, at, ...}}."""
    with _client(config) as client:
        return _statuses(client, config)


def _statuses(client: QdrantClient, config: StoreConfig) -> dict[str, dict[str, Any]]:
    recorded = (_metadata(client, status_collection(config)) or {}).get(STATUS_KEY)
    return dict(recorded) if isinstance(recorded, dict) else {}


def _write_statuses(
    client: QdrantClient, config: StoreConfig, entries: dict[str, dict[str, Any]]
) -> None:
    name = status_collection(config)
    if not client.collection_exists(name):
        client.create_collection(name, vectors_config={}, metadata={STATUS_KEY: entries})
    else:
        client.update_collection(name, metadata={STATUS_KEY: entries})


def _set_status(
    client: QdrantClient, config: StoreConfig, generation: str, status: str, extra: dict[str, Any]
) -> None:
    entries = _statuses(client, config)
    entries[generation] = {"status": status, "at": datetime.now(UTC).isoformat(), **extra}
    _write_statuses(client, config, entries)


def version(config: StoreConfig, generation: str) -> IndexVersion | None:
    """What ``generation``'s collection holds (None: no whole copy of it)."""
    with _client(config) as client:
        return _version(client, config, generation)


def _version(client: QdrantClient, config: StoreConfig, generation: str) -> IndexVersion | None:
    meta = _metadata(client, version_collection(config, generation)) or {}
    data = meta.get(VERSION_KEY)
    try:
        return IndexVersion(**data) if isinstance(data, dict) else None
    except TypeError:
        return None


def stage(
    config: StoreConfig, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion | None:
    """Copy the working collection into ``generation``'s own collection, readers not
    switched (a gate decides). None when it is live already or was discarded by hand;
    a version decided before keeps its status."""
    with _client(config) as client:
        if _current(client, config) == generation:
            return None
        recorded = _statuses(client, config).get(generation, {})
        if recorded.get("status") == DISCARDED:
            logger.warning("index version %s was discarded by hand: not staged again",
                           generation[:12])  # fmt: skip
            return None
        version = _version(client, config, generation)
        if version is None:
            version = _copy(client, config, generation, points, files, index_fingerprint)
        if not recorded:
            _set_status(client, config, generation, STAGED, {})
        logger.info("staged index version %s (%d points) as collection %s: the gate decides",
                    generation[:12], points, version_collection(config, generation))  # fmt: skip
        _remove_unused(client, config)
    return version


def _copy(
    client: QdrantClient,
    config: StoreConfig,
    generation: str,
    points: int,
    files: int,
    index_fingerprint: str,
) -> IndexVersion:
    """The working collection's points, vectors and payloads into a new collection with
    the same settings; marked whole (VERSION_KEY) only after the last point is written."""
    from qdrant_client.http import models as qm

    started = time.perf_counter()
    work = working_collection(config)
    target = version_collection(config, generation)
    info = client.get_collection(work)
    meta = dict(info.config.metadata or {})
    if client.collection_exists(target):  # a copy killed half-way
        client.delete_collection(target)
    store = QdrantStore(
        config, StoreMeta(str(meta.get("embedder")), int(meta["dim"])), collection=target
    )
    store.close()
    offset: Any = None
    copied = 0
    while True:
        records, offset = client.scroll(
            work, limit=config.batch_size, offset=offset, with_payload=True, with_vectors=True
        )
        if records:
            batch = [qm.PointStruct(id=r.id, vector=cast(Any, r.vector or {}), payload=r.payload)
                     for r in records]  # fmt: skip
            client.upsert(target, batch, wait=True)
            copied += len(batch)
        if offset is None:
            break
    version = IndexVersion(
        generation=generation,
        published_at=datetime.now(UTC).isoformat(),
        points=copied,
        files=files,
        index_fingerprint=index_fingerprint,
        publish_seconds=round(time.perf_counter() - started, 3),
    )
    if copied != points:
        logger.warning("staged %d points, the run counted %d", copied, points)
    client.update_collection(target, metadata={VERSION_KEY: asdict(version)})
    return version


def hold(config: StoreConfig, generation: str, verdict: dict[str, Any]) -> None:
    """Record that the gate kept ``generation`` from readers; its collection stays."""
    with _client(config) as client:
        _set_status(client, config, generation, HELD, {"verdict": verdict})
        _remove_unused(client, config)


def promote(
    config: StoreConfig,
    generation: str,
    extra: dict[str, Any] | None = None,
    keep_previous: bool = False,
) -> None:
    """Point the alias at ``generation`` in one atomic alias operation, then drop what is
    no longer kept. The record is written first (as for Edge).

    Raises:
        StageError: no such version.
    """
    from qdrant_client.http import models as qm

    with _client(config) as client:
        if _version(client, config, generation) is None:
            raise StageError(
                f"no index version {generation} on the Qdrant server "
                f"({version_collection(config, generation)})"
            )
        previous = _current(client, config)
        recorded = {"previous": previous, "keep_previous": keep_previous, **(extra or {})}
        _set_status(client, config, generation, PROMOTED, recorded)
        switch: list[Any] = []
        if previous is not None:
            switch.append(qm.DeleteAliasOperation(
                delete_alias=qm.DeleteAlias(alias_name=config.collection)))  # fmt: skip
        switch.append(qm.CreateAliasOperation(create_alias=qm.CreateAlias(
            collection_name=version_collection(config, generation),
            alias_name=config.collection)))  # fmt: skip
        try:
            client.update_collection_aliases(change_aliases_operations=switch)
        except Exception:
            # A switch applied by the server whose answer was lost, then retried: done.
            if _current(client, config) != generation:
                raise
        removed = _remove_unused(client, config)
    if removed:
        logger.info("dropped %d superseded index version collection(s)", removed)


def discard(config: StoreConfig, generation: str) -> None:
    """Drop a version that is not live; its record stays (see ``published.discard``).

    Raises:
        StageError: it is the live version, or there is no such version.
    """
    with _client(config) as client:
        if generation == _current(client, config):
            raise StageError(f"index version {generation[:12]} is live: promote another one first")
        if _version(client, config, generation) is None:
            raise StageError(f"no index version {generation} on the Qdrant server")
        # The tombstone first: a kill before the drop leaves a discarded version that the
        # next pruning drops; the other order could stage the same version again.
        _set_status(client, config, generation, DISCARDED, {})
        client.delete_collection(version_collection(config, generation))


def list_versions(config: StoreConfig) -> list[VersionEntry]:
    """The versions on the server, newest first."""
    with _client(config) as client:
        return _list(client, config)


def _list(client: QdrantClient, config: StoreConfig) -> list[VersionEntry]:
    live = _current(client, config)
    recorded = _statuses(client, config)
    entries = []
    for collection in client.get_collections().collections:
        generation = _generation_of(config, collection.name)
        if generation is None:
            continue
        version = _version(client, config, generation)
        if version is None:
            continue
        entries.append(entry(version, recorded, live))
    return sorted(entries, key=lambda e: e.published_at, reverse=True)


def resolve(config: StoreConfig, prefix: str) -> str:
    """The one version whose generation starts with ``prefix``.

    Raises:
        StageError: none or several match.
    """
    return pick([v.generation for v in list_versions(config)], prefix, "on the Qdrant server")


def _remove_unused(client: QdrantClient, config: StoreConfig) -> int:
    """Drop version collections no longer kept (see the module doc), and half copies."""
    recorded = _statuses(client, config)
    entries = _list(client, config)
    keep = kept(entries, recorded, _current(client, config))
    whole = {e.generation for e in entries}
    removed = 0
    for collection in client.get_collections().collections:
        generation = _generation_of(config, collection.name)
        if generation is None or (generation in keep and generation in whole):
            continue
        client.delete_collection(collection.name)  # superseded, or a copy killed half-way
        removed += generation in whole
    left = {e.generation for e in _list(client, config)}
    gone = [g for g, r in recorded.items() if g not in left and r.get("status") != DISCARDED]
    if gone:
        for generation in gone:
            recorded.pop(generation)
        _write_statuses(client, config, recorded)
    return removed
