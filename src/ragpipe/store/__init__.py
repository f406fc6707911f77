"""Vector stores behind one protocol: Qdrant Edge (embedded) and qdrant-client.

Both hold the same points: a named dense vector ``dense`` (cosine), a named
sparse vector ``bm25`` with Qdrant's IDF modifier (term frequencies computed
here with Qdrant's own BM25 tokenizer, so hybrid search runs inside Qdrant),
and the chunk payload. Point IDs are deterministic (see ``ragpipe.ingest.plan``).

``base`` holds the protocol and the point and filter types, ``edge`` and
``qdrant`` the two backends, ``sparse`` the BM25 encoder, ``published`` the
versions readers open; ``open_store`` and ``open_reader`` pick the backend.

The store records which embedder wrote it (``StoreMeta``); opening it with
another embedder or dimension is a ``ConfigError`` before any work starts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ragpipe.config import StoreBackend, StoreConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.store import published
from ragpipe.store.base import DENSE as DENSE
from ragpipe.store.base import EMBEDDER_FIELD as EMBEDDER_FIELD
from ragpipe.store.base import GENERATION_FILE as GENERATION_FILE
from ragpipe.store.base import INTEGER_FIELDS as INTEGER_FIELDS
from ragpipe.store.base import KEYWORD_FIELDS as KEYWORD_FIELDS
from ragpipe.store.base import META_FILE as META_FILE
from ragpipe.store.base import SPARSE as SPARSE
from ragpipe.store.base import STORE_SCHEMA as STORE_SCHEMA
from ragpipe.store.base import UNINDEXED_FILE as UNINDEXED_FILE
from ragpipe.store.base import VERSION_FIELDS as VERSION_FIELDS
from ragpipe.store.base import FileVersions as FileVersions
from ragpipe.store.base import Hit as Hit
from ragpipe.store.base import IndexBuild as IndexBuild
from ragpipe.store.base import IndexPoint as IndexPoint
from ragpipe.store.base import Match as Match
from ragpipe.store.base import StoreMeta as StoreMeta
from ragpipe.store.base import Value as Value
from ragpipe.store.base import VectorStore as VectorStore
from ragpipe.store.base import VersionStats as VersionStats
from ragpipe.store.base import Where as Where
from ragpipe.store.base import check_store_space as check_store_space
from ragpipe.store.base import ensure_space as ensure_space
from ragpipe.store.base import read_meta as read_meta
from ragpipe.store.edge import EdgeStore as EdgeStore
from ragpipe.store.edge import check_on_disk, check_quantization, engine_threshold
from ragpipe.store.qdrant import RETRY_STATUS as RETRY_STATUS
from ragpipe.store.qdrant import WORK_SUFFIX
from ragpipe.store.qdrant import QdrantStore as QdrantStore
from ragpipe.store.sparse import SparseEncoder as SparseEncoder

logger = logging.getLogger(__name__)


def open_store(
    config: StoreConfig, embedder: str, dim: int | None, versioned: bool = False
) -> VectorStore | None:
    """Open the configured store for writing, checking it was built by ``embedder``.

    With ``dim`` the store is created on first use; with ``dim=None`` an
    existing store is opened (for diffing and deleting) and None is returned
    when there is none yet. ``versioned`` (``index.gate``): on a Qdrant server the
    writer writes the working collection, not the alias readers query (see
    ``server_versions``).
    """
    meta = StoreMeta(embedder=embedder, dim=dim)
    if config.backend == StoreBackend.EDGE:
        if dim is None and not (config.path / "segments").is_dir():
            return None
        return EdgeStore(
            config.path, meta, config.batch_size, config.scroll_page, config.min_free_mb,
            config.quantization, config.hnsw_min_unindexed, config.on_disk,
        )  # fmt: skip
    collection = config.collection + WORK_SUFFIX if versioned else None
    store = QdrantStore(config, meta, collection)
    if not store.exists:
        store.close()
        return None
    return store


def require_reader(
    config: StoreConfig,
    embedder: str,
    version: str | None = None,
    config_file: Path | None = None,
) -> VectorStore:
    """``open_reader``, or StageError saying how to get an index when there is none (its
    absolute path, and where a relative one was taken from: ``config_file``'s folder is not
    it unless ragpipe runs there)."""
    store = open_reader(config, embedder, version)
    if store is None:
        from ragpipe.config import relative_path_note
        from ragpipe.store.qdrant import without_credentials

        if config.url:
            where, note = without_credentials(config.url), ""
        else:
            where = os.path.abspath(config.path)
            note = relative_path_note(config.path, "store.path", config_file)
        raise StageError(
            f"no index at {where}: run `ragpipe ingest` first (or point store.path / "
            f"store.url at an existing index){note}"
        )
    return store


def open_reader(
    config: StoreConfig, embedder: str, version: str | None = None
) -> VectorStore | None:
    """Open the index for reading (search, ask, evals): for Qdrant Edge, a private copy of
    its current published version (or of ``version``: a generation or a unique prefix of
    one, staged and held versions included), so readers never meet the writer nor each
    other (see ``published``). None: no index.

    For a Qdrant server, the collection (or the alias, with ``index.gate``) that
    ``store.collection`` names, or ``version``'s own collection.

    Raises:
        ConfigError: ``version`` of a Qdrant server that keeps no versions.
        StageError: no version matches ``version``; versions exist but none is live; a
            working shard that was never published (a killed first ingest: readers saw
            part of a run, and held the shard the next ingest needed).
    """
    if config.backend != StoreBackend.EDGE:
        return _server_reader(config, embedder, version)
    wanted = published.resolve(config.path, version) if version is not None else None
    got = published.reader_copy(config.path, wanted)
    if got is not None:
        path, opened = got
        label = opened.generation[:12] if opened else path.name
        try:
            store = EdgeStore(
                path, StoreMeta(embedder, None), config.batch_size, config.scroll_page,
                config.min_free_mb,
            )  # fmt: skip
        except ConfigError as exc:  # named the reader's private copy, not the user's index
            published.drop_copy(path)
            named = str(exc).replace(str(path), f"{config.path} (published version {label})")
            raise ConfigError(named) from exc
        except BaseException:
            published.drop_copy(path)
            raise
        store.owned_copy = True
        store.version = opened
        store.location = f"edge:{config.path} (published version {label})"
        return store
    waiting = published.list_versions(config.path)
    if waiting and waiting[0].status == published.PROMOTED:  # recorded, then stopped
        raise StageError(
            f"no version of the index at {config.path} is live: version "
            f"{waiting[0].generation[:12]} was recorded as promoted, but the ingest or "
            "`ragpipe index promote` that promoted it was stopped before making it live. "
            "Run `ragpipe ingest` again: it finishes the work (with index.gate, it judges "
            "the version again); `ragpipe search --version V` reads one meanwhile"
        )
    if waiting or published.statuses(config.path):  # a gate kept the first version off
        what = f" ({waiting[0].generation[:12]}, {waiting[0].status})" if waiting else ""
        raise StageError(
            f"no version of the index at {config.path} is live: the gate has not let "
            f"one through{what}. See `ragpipe index list`; `ragpipe search --version V` "
            "reads one, `ragpipe index promote V` makes it live"
        )
    if (config.path / "segments").is_dir():  # a shard never published: its ingest did not finish
        raise StageError(
            f"the index at {config.path} has not been published: the ingest that wrote it "
            "did not finish (killed or failed before publishing), so it may hold part of "
            "a run. Run `ragpipe ingest` again: it finishes the work and publishes"
        )
    return None


def _server_reader(config: StoreConfig, embedder: str, version: str | None) -> VectorStore | None:
    """A Qdrant reader. With versions (``index.gate``) it is pinned to one version's
    collection, ``version``'s or the one the alias names now, so that every call of a
    search reads the same version even if a promotion switches the alias meanwhile."""
    from ragpipe.store import server_versions

    if version is not None and server_versions.generation(config) is None:
        raise ConfigError(
            "this Qdrant index keeps no versions (they are kept with index.gate): drop --version"
        )
    generation = (
        server_versions.resolve(config, version)
        if version is not None
        else server_versions.current(config)
    )
    if generation is not None:
        name = server_versions.version_collection(config, generation)
        store = QdrantStore(config, StoreMeta(embedder, None), name, reader=True)
        store.version = server_versions.version(config, generation)
        store.location += f" (version {generation[:12]})"
        return store
    store = QdrantStore(config, StoreMeta(embedder, None), reader=True)
    if store.exists:
        return store
    store.close()
    if server_versions.statuses(config):
        raise StageError(
            f"no version of the index {config.collection!r} is live: the gate has not let "
            "one through. See `ragpipe index list`; `ragpipe search --version V` reads one, "
            "`ragpipe index promote V` makes it live"
        )
    return None


def check_store_settings(config: StoreConfig) -> None:
    """ConfigError when an existing Edge store was created with settings fixed at creation
    (``store.quantization``, ``store.on_disk``) other than the configured ones; checked
    before any work."""
    if config.backend == StoreBackend.EDGE:
        check_quantization(config.path, config.quantization)
        check_on_disk(config.path, config.on_disk)


def remove_leftovers(config: StoreConfig) -> int:
    """Remove what killed readers and runs left among an Edge index's published versions
    (``published.remove_unused``): every ingest does, a no-op one too, whose cached upsert
    publishes nothing. The number of versions removed; 0 for a Qdrant server. Best effort:
    a failure is logged, and the night that did its work is not failed for it (the next
    ingest tries again)."""
    if config.backend != StoreBackend.EDGE:
        return 0
    return published.tidy(config.path)


def unbuilt_index(config: StoreConfig) -> bool:
    """Whether the Edge store's own record (``UNINDEXED_FILE``) says at least
    ``store.hnsw_min_unindexed`` points are outside its HNSW index: a build that a killed
    run never finished, which a run with nothing to write must still do. Read without
    opening the store; False for the qdrant backend (its optimizer builds) and a store
    with no record."""
    if config.backend != StoreBackend.EDGE:
        return False
    try:
        data = json.loads((config.path / UNINDEXED_FILE).read_text(encoding="utf-8"))
        unindexed = int(data["points"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return False
    # As EdgeStore.build_index decides: the engine's own threshold too, fixed at creation
    # (a store.hnsw_min_unindexed lowered since would open the store each night for nothing).
    return unindexed >= max(config.hnsw_min_unindexed, engine_threshold(config.path))


def store_generation(config: StoreConfig) -> str | None:
    """The token of an Edge store's last writing session (see ``GENERATION_FILE``).

    None when there is no store yet, and for the qdrant backend: a server can be
    written by anyone, so nothing read from it earlier can be trusted later.
    """
    if config.backend != StoreBackend.EDGE or not (config.path / "segments").is_dir():
        return None
    try:
        return (config.path / GENERATION_FILE).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def peek_meta(config: StoreConfig) -> dict[str, Any] | None:
    """The stored metadata of an Edge store without opening it (None if absent)."""
    meta_path = config.path / META_FILE
    if config.backend == StoreBackend.EDGE and meta_path.is_file():
        return read_meta(meta_path)
    return None
