"""What every store shares: the protocol, points, filters, the store's metadata, disk checks."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ragpipe.checkpoint import disk_full, free_bytes
from ragpipe.config import StoreBackend, StoreConfig
from ragpipe.errors import ConfigError, StageError

DENSE = "dense"


SPARSE = "bm25"


META_FILE = "ragpipe-store.json"


# Rewritten with a fresh token before the first write of every session that writes:
# a cached view of the store is current while the token it was taken at still stands.
GENERATION_FILE = "ragpipe-generation"


# Edge: points written since the HNSW index was last built (they sit in the appendable
# segment, searched by scan). Raised before a write, so a crash can only overcount.
UNINDEXED_FILE = "ragpipe-unindexed.json"


STORE_SCHEMA = 1


# Payload fields read by the re-index diff (one scroll over the whole store).
VERSION_FIELDS = ["file_path", "source_sha", "config_fingerprint", "chunk_total"]


KEYWORD_FIELDS = ["file_path", "source_sha", "config_fingerprint", "doc_id"]


# The document signal's lead query filters on chunk_index = 0 within a few doc_ids;
# without an index Qdrant checks the payload of every chunk of those documents
# (3.6 ms at 50k chunks, 0.9 ms with it).
INTEGER_FIELDS = ["chunk_index"]


# Payload indexes created with enable_hnsw false. By default Qdrant builds extra HNSW
# links for each indexed value held by more points than its full-scan threshold, for
# searches filtered on that value. chunk_index has a value per position in a document,
# each on one chunk of most documents, so in a large store every value gets its own
# subgraph. Measured at 200k chunks, 20 per document: HNSW build 527 s -> 54 s, graph
# links 103 -> 8.8 MB, dense p50 2.2 -> 0.6 ms, recall@10 1.000 both. No ragpipe search
# filters vectors on these fields (the lead query's chunk_index = 0 runs exact within a
# few documents; config_fingerprint and the full-text index are never search filters).
# The per-file fields keep their links: a filter on one large file is a vector search.
NO_HNSW_FIELDS = frozenset({"config_fingerprint", "chunk_index", "text"})


def enable_hnsw(field: str) -> bool | None:
    """A payload index's ``enable_hnsw``: false for NO_HNSW_FIELDS, else the engine's."""
    return False if field in NO_HNSW_FIELDS else None


# The HNSW graph's links per point (Qdrant's m; 2m on the bottom layer). The engine's 16
# gave recall@10 0.948 at 1M chunks (bench/scale.py: 384-d vectors in tight topic
# clusters) once chunk_index no longer added a subgraph's links of its own; 32 is the
# usual choice for high-dimensional embeddings. Fixed when a store is created.
HNSW_M = 32


# int8 stores: the HNSW search takes this many times the asked-for candidates by their
# int8 scores, then rescores them with the full vectors. At 1M chunks (int8 + on_disk,
# bench/int8_recall.py, 300 queries) recall@10 was 0.955 with 2, 0.971 with 3 and 0.973
# with 4; 3 cost no time once the store was in the page cache (0.58 ms p50 either way).
INT8_OVERSAMPLING = 3.0


# Stamped on every point: which embedder wrote it. The store's identity survives inside
# the shard when its metadata file is lost, so the embedder check cannot be bypassed.
EMBEDDER_FIELD = "embedder"


Value = str | int


Match = Value | Sequence[Value]


@dataclass(frozen=True)
class StoreMeta:
    """What wrote the vectors: checked on every open."""

    embedder: str
    dim: int | None  # None: open an existing store only, whatever its size
    sparse: str = "qdrant-bm25"
    schema: int = STORE_SCHEMA
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def check(self, stored: dict[str, Any], where: str) -> None:
        """Raise ConfigError when the stored metadata does not match this embedder."""
        problems = []
        if self.dim is not None and stored.get("dim") != self.dim:
            problems.append(f"dimension {stored.get('dim')} (configured: {self.dim})")
        if stored.get("embedder") != self.embedder:
            problems.append(f"embedder {stored.get('embedder')!r} (configured: {self.embedder!r})")
        if problems:
            raise ConfigError(
                f"the index at {where} was built with {' and '.join(problems)}. Vectors of "
                "different models cannot be mixed: set embed.provider/embed.model/"
                "embed.dimensions back, or point store.path / store.collection at a new index "
                "(the next run re-embeds everything into it)."
            )


@dataclass(frozen=True)
class Where:
    """A backend-neutral payload filter.

    ``must``: every key matches (a list value means any of it).
    ``must_not_all``: excluded when *all* of these match together.
    """

    must: dict[str, Match] = field(default_factory=dict)
    must_not_all: dict[str, Value] = field(default_factory=dict)

    def matches(self, payload: dict[str, Any]) -> bool:
        """Evaluate the filter here, as Qdrant does (an array payload matches by any element)."""

        def hit(key: str, wanted: Match) -> bool:
            value = payload.get(key)
            have = set(value) if isinstance(value, list) else {value}
            options = {wanted} if isinstance(wanted, str | int) else set(wanted)
            return bool(have & options)

        if not all(hit(k, v) for k, v in self.must.items()):
            return False
        return not (self.must_not_all and all(hit(k, v) for k, v in self.must_not_all.items()))


@dataclass(frozen=True)
class IndexPoint:
    """One chunk as stored."""

    point_id: str
    dense: npt.NDArray[np.float32]
    sparse_indices: list[int]
    sparse_values: list[float]
    payload: dict[str, Any]


@dataclass(frozen=True)
class Hit:
    """A search result."""

    point_id: str
    score: float
    payload: dict[str, Any]


@dataclass
class VersionStats:
    """Points stored for one (file, source SHA, config fingerprint)."""

    points: int = 0
    chunk_total: int = 0

    @property
    def complete(self) -> bool:
        return self.points >= self.chunk_total > 0


FileVersions = dict[str, dict[tuple[str, str], VersionStats]]


@dataclass(frozen=True)
class IndexBuild:
    """One HNSW build by ``VectorStore.build_index``."""

    indexed: int  # points that were not in the index, and now are
    seconds: float


class VectorStore(Protocol):
    """What the pipeline needs from an index."""

    location: str

    def build_index(
        self,
        min_unindexed: int,
        starting: Callable[[int], None] | None = None,
        waiting: Callable[[float], None] | None = None,
    ) -> IndexBuild | None:
        """Build the HNSW index over the points not in it when there are at least
        ``min_unindexed`` (``starting`` is told how many, first; ``waiting``, the seconds
        so far, now and then while it builds); None when nothing was built (or the server
        builds it itself)."""
        ...

    def check(self, meta: StoreMeta) -> None:
        """Raise ConfigError unless ``meta``'s embedder and dimension fit this store."""
        ...

    def upsert(
        self, points: Sequence[IndexPoint], progress: Callable[[int], None] | None = None
    ) -> None:
        """Insert or replace points in batches; durable when this returns."""
        ...

    def delete(self, where: Where) -> int:
        """Delete matching points; returns how many there were. Durable after close()."""
        ...

    def count(self, where: Where | None = None) -> int:
        """Exact number of (matching) points."""
        ...

    def file_versions(self) -> FileVersions:
        """Per file, per (source SHA, config fingerprint): points stored, chunks expected."""
        ...

    def scroll(self, where: Where | None = None, fields: list[str] | None = None) -> Iterator[Hit]:
        """Every matching point (score 0), page by page."""
        ...

    def query_dense(
        self,
        vector: npt.NDArray[np.float32],
        limit: int,
        where: Where | None = None,
        exact: bool = False,
        fields: list[str] | None = None,
    ) -> list[Hit]:
        """Nearest points by cosine similarity. ``exact``: score every point the filter
        lets through with the full vectors, no index and no quantisation (for a filter
        that leaves a handful of points). ``fields``: only these payload fields (``[]``:
        none; reading whole payloads is most of a query's cost beyond the search)."""
        ...

    def query_sparse(
        self, text: str, limit: int, where: Where | None = None, payload: bool = True
    ) -> list[Hit]:
        """BM25 (IDF computed by Qdrant over the stored points). ``payload=False``: hits
        with empty payloads (reading each hit's payload is most of a query's cost beyond the
        search; fetch the few kept ones with ``payloads``)."""
        ...

    def payloads(self, point_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The payloads of these points, by id (a point not in the store is left out)."""
        ...

    def query_hybrid(
        self,
        vector: npt.NDArray[np.float32],
        text: str,
        limit: int,
        prefetch: int,
        where: Where | None = None,
        rrf_k: int = 60,
        dense_floor: float | None = None,
        method: str = "rrf",
    ) -> list[Hit]:
        """Dense and BM25 legs of ``prefetch`` each, fused in Qdrant.

        ``method`` "rrf": 1/(k + rank), ranks from 1; "dbsf": Qdrant's
        distribution-based score fusion (each leg's scores mapped by mean +/- 3
        sample standard deviations, then summed). ``dense_floor`` drops dense
        candidates below that cosine before fusion.
        """
        ...

    def dense_vectors(self, point_ids: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
        """The stored dense vectors of these points (missing ids are left out)."""
        ...

    def close(self) -> None:
        """Flush and release the store."""
        ...


def _hit(point_id: Any, score: float, payload: dict[str, Any] | None) -> Hit:
    return Hit(str(point_id), float(score), dict(payload or {}))


def _accumulate(versions: FileVersions, payload: dict[str, Any]) -> None:
    key = (str(payload.get("source_sha")), str(payload.get("config_fingerprint")))
    stats = versions[str(payload.get("file_path"))].setdefault(key, VersionStats())
    stats.points += 1
    stats.chunk_total = int(payload.get("chunk_total") or 0)


class _Scrolling:
    """What both backends derive from their ``scroll``."""

    def scroll(self, where: Where | None = None, fields: list[str] | None = None) -> Iterator[Hit]:
        raise NotImplementedError

    def file_versions(self) -> FileVersions:
        """Per file, per (source SHA, config fingerprint): points stored, chunks expected."""
        versions: FileVersions = defaultdict(dict)
        for hit in self.scroll(fields=VERSION_FIELDS):
            _accumulate(versions, hit.payload)
        return dict(versions)


# -- Qdrant Edge ---------------------------------------------------------------------


def ensure_space(path: Path, reserve: int, adding: int = 0) -> None:
    """Refuse (DiskFull) when the file system of an Edge store lacks ``reserve + adding``.

    Qdrant Edge memory-maps its files: a full disk kills the process with SIGBUS
    when a mapped page is first written, so this is the only place to say so.
    """
    if not reserve:
        return
    free = free_bytes(path)
    if free is not None and free < reserve + adding:
        why = (
            f" (Qdrant Edge maps its files into memory: store.min_free_mb "
            f"{reserve // 1_000_000} MB{' + 3x the new points' if adding else ''})"
        )
        raise disk_full(path, reserve + adding, why=why)


def check_store_space(config: StoreConfig) -> None:
    """Before any conversion work: an Edge store's file system has its reserve."""
    if config.backend == StoreBackend.EDGE:
        ensure_space(config.path, config.min_free_mb * 1_000_000)


def _point_bytes(point: IndexPoint) -> int:
    """Rough size of one stored point: vector, sparse terms, payload text, overhead."""
    text = point.payload.get("text")
    return point.dense.nbytes + 8 * len(point.sparse_indices) + 2 * len(str(text or "")) + 512


def read_meta(path: Path) -> dict[str, Any]:
    """The store's metadata file, or a StageError naming it and the way to repair it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StageError(
            f"the store metadata {path} is unreadable or damaged ({exc}). It records which "
            'embedder built the index: restore it from a backup, or write {"embedder": "<the '
            'embedder name>", "dim": <its dimension>} into it (e.g. all-MiniLM-L6-v2 and 384 '
            "for the default), or delete the store directory and re-run `ragpipe ingest`"
        ) from exc
    if not isinstance(data, dict):
        raise StageError(
            f"the store metadata {path} is not a JSON object; restore it or re-create the store"
        )
    return data
