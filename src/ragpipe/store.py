"""Vector stores behind one protocol: Qdrant Edge (embedded) and qdrant-client.

Both hold the same points: a named dense vector ``dense`` (cosine), a named
sparse vector ``bm25`` with Qdrant's IDF modifier (term frequencies computed
here with Qdrant's own BM25 tokenizer, so hybrid search runs inside Qdrant),
and the chunk payload. Point IDs are deterministic (see ``indexing``).

The store records which embedder wrote it (``StoreMeta``); opening it with
another embedder or dimension is a ``ConfigError`` before any work starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from ragpipe import published
from ragpipe.checkpoint import atomic_write_bytes, disk_full, free_bytes, fsync_dir
from ragpipe.config import StoreBackend, StoreConfig
from ragpipe.errors import ConfigError, StageError

if TYPE_CHECKING:
    import qdrant_edge
    from qdrant_client import QdrantClient
    from qdrant_client.http import models as qm

    from ragpipe.published import IndexVersion

logger = logging.getLogger(__name__)

DENSE = "dense"
SPARSE = "bm25"
META_FILE = "ragpipe-store.json"
# Rewritten with a fresh token before the first write of every session that writes:
# a cached view of the store is current while the token it was taken at still stands.
GENERATION_FILE = "ragpipe-generation"
STORE_SCHEMA = 1
# Payload fields read by the re-index diff (one scroll over the whole store).
VERSION_FIELDS = ["file_path", "source_sha", "config_fingerprint", "chunk_total"]
KEYWORD_FIELDS = ["file_path", "source_sha", "config_fingerprint", "doc_id"]
# The document signal's lead query filters on chunk_index = 0 within a few doc_ids;
# without an index Qdrant checks the payload of every chunk of those documents
# (3.6 ms at 50k chunks, 0.9 ms with it).
INTEGER_FIELDS = ["chunk_index"]
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


class VectorStore(Protocol):
    """What the pipeline needs from an index."""

    location: str

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
        self, vector: npt.NDArray[np.float32], limit: int, where: Where | None = None
    ) -> list[Hit]:
        """Nearest points by cosine similarity."""
        ...

    def query_sparse(self, text: str, limit: int, where: Where | None = None) -> list[Hit]:
        """BM25 (IDF computed by Qdrant over the stored points)."""
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


class SparseEncoder:
    """Qdrant's BM25 text-to-sparse model (term frequencies; IDF is the store's)."""

    def __init__(self) -> None:
        import qdrant_edge

        self._bm25 = qdrant_edge.Bm25()

    def document(self, text: str) -> tuple[list[int], list[float]]:
        vector = self._bm25.embed_document(text)
        return list(vector.indices), list(vector.values)

    def query(self, text: str) -> tuple[list[int], list[float]]:
        vector = self._bm25.embed_query(text)
        return list(vector.indices), list(vector.values)


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


class EdgeStore(_Scrolling):
    """Qdrant Edge: the real engine in-process, one shard directory."""

    def __init__(
        self,
        path: Path,
        meta: StoreMeta,
        batch_size: int = 256,
        page: int = 1000,
        min_free_mb: int = 0,
    ):
        import qdrant_edge as qe

        self._qe = qe
        self.path = path
        self.owned_copy = False  # a reader's private copy of a published version: removed on close
        self.version: IndexVersion | None = None
        self.min_free = min_free_mb * 1_000_000
        ensure_space(path, self.min_free)
        self.location = f"edge:{path}"
        self.batch_size = batch_size
        self.page = page
        self._sparse = SparseEncoder()
        self._writing = False
        self._embedder = meta.embedder
        meta_path = path / META_FILE
        stored = read_meta(meta_path) if meta_path.is_file() else None
        if stored is not None:
            meta.check(stored, str(path))
        try:
            if (path / "segments").is_dir():
                self._shard = qe.EdgeShard.load(str(path))
                self._check_shard_dim(meta)
                if stored is None:
                    self._recover_meta(meta)
            else:
                self._shard = self._create(meta)
                self._before_write()
        except (ConfigError, StageError):
            raise
        except Exception as exc:
            if "WouldBlock" in str(exc):
                raise StageError(
                    f"the Qdrant Edge store at {path} is open in another process: an ingest "
                    "writing it, or a reader of an index that was never published (readers "
                    "open a published copy, made at the end of every ingest: run `ragpipe "
                    "ingest` once when nothing else uses the index)"
                ) from exc
            raise StageError(f"cannot open the Qdrant Edge store at {path}: {exc}") from exc

    def _create(self, meta: StoreMeta) -> qdrant_edge.EdgeShard:
        """Create the shard atomically: built whole in a temp dir, then renamed into place.

        A kill mid-creation leaves only the temp dir (removed by the next creation),
        never a store without its payload indexes or metadata.
        """
        qe = self._qe
        assert meta.dim is not None
        parent = self.path.parent
        parent.mkdir(parents=True, exist_ok=True)
        for leftover in parent.glob(f".{self.path.name}.creating-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = parent / f".{self.path.name}.creating-{uuid.uuid4().hex[:12]}"
        config = qe.EdgeConfig(
            vectors={DENSE: qe.EdgeVectorParams(size=meta.dim, distance=qe.Distance.Cosine)},
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        )
        try:
            shard: qdrant_edge.EdgeShard = qe.EdgeShard.create(str(tmp), config)
            self._repair_indexes(shard)
            shard.flush()
            shard.close()
            atomic_write_bytes(tmp / META_FILE, json.dumps(asdict(meta), indent=2).encode())
            if self.path.exists():
                self._clear_non_store(self.path)
            os.rename(tmp, self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(parent)
        loaded: qdrant_edge.EdgeShard = qe.EdgeShard.load(str(self.path))
        return loaded

    @staticmethod
    def _clear_non_store(path: Path) -> None:
        """Make room for a new store at ``path``: only ragpipe's own files may be there."""
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else [path.name]
        if not path.is_dir() or not set(found) <= {META_FILE, GENERATION_FILE}:
            raise StageError(
                f"store.path {path} exists and is not a Qdrant Edge store (it holds "
                f"{', '.join(found[:5])}{', …' if len(found) > 5 else ''}). Point store.path at "
                "a new or empty directory."
            )
        for name in found:
            (path / name).unlink()
        path.rmdir()

    def _repair_indexes(self, shard: qdrant_edge.EdgeShard) -> None:
        """Create every payload index the shard lacks (a store created before one existed,
        or by an older ragpipe killed mid-creation)."""
        qe = self._qe
        have = set(shard.info().payload_schema)
        wanted: list[tuple[str, Any]] = [
            *((name, qe.PayloadSchemaType.Keyword) for name in KEYWORD_FIELDS),
            *((name, qe.PayloadSchemaType.Integer) for name in INTEGER_FIELDS),
            ("text", qe.TextIndexParams(tokenizer=qe.TokenizerType.Word, lowercase=True)),
        ]
        missing = [(name, kind) for name, kind in wanted if name not in have]
        if missing and have:  # a fresh shard has none: that is creation, not repair
            logger.warning(
                "store %s lacked the payload indexes %s; created them",
                self.path, ", ".join(name for name, _ in missing),
            )  # fmt: skip
        for name, kind in missing:
            shard.update(qe.UpdateOperation.create_field_index(name, kind))

    def _before_write(self) -> None:
        if not self._writing:
            atomic_write_bytes(self.path / GENERATION_FILE, uuid.uuid4().hex.encode())
            self._writing = True
            self._repair_indexes(self._shard)

    def _stored_dim(self) -> int | None:
        config_file = self.path / "edge_config.json"
        if not config_file.is_file():
            return None
        stored = json.loads(config_file.read_text(encoding="utf-8"))
        size = stored.get("vectors", {}).get(DENSE, {}).get("size")
        return int(size) if size is not None else None

    def _recover_meta(self, meta: StoreMeta) -> None:
        """The metadata file is gone: check the embedder stamped on the points, then
        write the file back. Points from before the stamp cannot be checked: say so."""
        qe = self._qe
        request = qe.ScrollRequest(limit=64, with_payload=[EMBEDDER_FIELD])
        records, _ = self._shard.scroll(request)
        stamps = [r.payload.get(EMBEDDER_FIELD) for r in records if r.payload]
        found = next((s for s in stamps if s), None)
        dim = self._stored_dim()
        if found is None and records:
            logger.warning(
                "%s is missing and the store's points predate the embedder stamp: the "
                "embedder (%s) cannot be checked against the one that built it",
                self.path / META_FILE, meta.embedder,
            )  # fmt: skip
            return
        try:
            meta.check({"embedder": found or meta.embedder, "dim": dim}, str(self.path))
        except ConfigError:
            self._shard.close()
            raise
        rebuilt = StoreMeta(embedder=found or meta.embedder, dim=dim)
        try:
            atomic_write_bytes(
                self.path / META_FILE, json.dumps(asdict(rebuilt), indent=2).encode()
            )
        except OSError as exc:  # a read-only store still answers; the check was made
            logger.warning("could not write back %s: %s", self.path / META_FILE, exc)
            return
        logger.warning("%s was missing; rebuilt it from the store (embedder %s, %s dimensions)",
                       self.path / META_FILE, rebuilt.embedder, dim)  # fmt: skip

    def _check_shard_dim(self, meta: StoreMeta) -> None:
        size = self._stored_dim()
        if meta.dim is not None and size is not None and size != meta.dim:
            self._shard.close()
            meta.check({"dim": size, "embedder": meta.embedder}, str(self.path))

    def _filter(self, where: Where | None) -> qdrant_edge.Filter | None:
        if where is None:
            return None
        qe = self._qe

        def condition(key: str, value: Match) -> Any:
            if isinstance(value, str | int):
                return qe.FieldCondition(key, match=qe.MatchValue(value))
            return qe.FieldCondition(key, match=qe.MatchAny([str(v) for v in value]))

        must: list[Any] = [condition(k, v) for k, v in where.must.items()]
        must_not: list[Any] = []
        if where.must_not_all:
            inner = [condition(k, v) for k, v in where.must_not_all.items()]
            must_not.append(qe.Filter(must=inner))
        flt: qdrant_edge.Filter = qe.Filter(must=must or None, must_not=must_not or None)
        return flt

    def upsert(
        self, points: Sequence[IndexPoint], progress: Callable[[int], None] | None = None
    ) -> None:
        qe = self._qe
        if points:
            ensure_space(self.path, self.min_free, 3 * sum(_point_bytes(p) for p in points))
            self._before_write()
        for start in range(0, len(points), self.batch_size):
            batch = [
                qe.Point(
                    uuid.UUID(p.point_id),
                    {
                        DENSE: p.dense.tolist(),
                        SPARSE: qe.SparseVector(p.sparse_indices, p.sparse_values),
                    },
                    {**p.payload, EMBEDDER_FIELD: self._embedder},
                )
                for p in points[start : start + self.batch_size]
            ]
            self._shard.update(qe.UpdateOperation.upsert_points(batch))
            if progress is not None:
                progress(len(batch))
        self._shard.flush()  # once: the WAL already holds every batch

    def delete(self, where: Where) -> int:
        qe = self._qe
        flt = self._filter(where)
        n = self._shard.count(qe.CountRequest(exact=True, filter=flt))
        if n:
            assert flt is not None
            self._before_write()
            self._shard.update(qe.UpdateOperation.delete_points_by_filter(flt))
        return int(n)

    def count(self, where: Where | None = None) -> int:
        return int(self._shard.count(self._qe.CountRequest(exact=True, filter=self._filter(where))))

    def scroll(self, where: Where | None = None, fields: list[str] | None = None) -> Iterator[Hit]:
        qe = self._qe
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset,
                limit=self.page,
                filter=self._filter(where),
                with_payload=fields if fields is not None else True,
            )
            records, offset = self._shard.scroll(request)
            for record in records:
                yield _hit(record.id, 0.0, record.payload)
            if offset is None:
                return

    def _query(self, request: qdrant_edge.QueryRequest) -> list[Hit]:
        return [_hit(p.id, p.score, p.payload) for p in self._shard.query(request)]

    def query_dense(
        self, vector: npt.NDArray[np.float32], limit: int, where: Where | None = None
    ) -> list[Hit]:
        qe = self._qe
        return self._query(
            qe.QueryRequest(
                limit=limit,
                query=qe.Query.Nearest(vector.tolist(), using=DENSE),
                filter=self._filter(where),
                with_payload=True,
            )
        )

    def dense_vectors(self, point_ids: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
        records = self._shard.retrieve(
            [uuid.UUID(p) for p in point_ids], with_payload=False, with_vector=[DENSE]
        )
        out = {}
        for r in records:
            vector = r.vector[DENSE] if isinstance(r.vector, dict) else r.vector
            out[str(r.id)] = np.asarray(vector, np.float32)
        return out

    def _sparse_query(self, text: str) -> qdrant_edge.Query:
        indices, values = self._sparse.query(text)
        return self._qe.Query.Nearest(self._qe.SparseVector(indices, values), using=SPARSE)

    def query_sparse(self, text: str, limit: int, where: Where | None = None) -> list[Hit]:
        return self._query(
            self._qe.QueryRequest(
                limit=limit,
                query=self._sparse_query(text),
                filter=self._filter(where),
                with_payload=True,
            )
        )

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
        qe = self._qe
        flt = self._filter(where)
        dense = qe.Query.Nearest(vector.tolist(), using=DENSE)
        legs = [
            qe.Prefetch(limit=prefetch, query=dense, filter=flt, score_threshold=dense_floor),
            qe.Prefetch(limit=prefetch, query=self._sparse_query(text), filter=flt),
        ]
        return self._query(
            qe.QueryRequest(
                limit=limit,
                prefetches=legs,
                # Qdrant counts ranks from 0: k + 1 gives the classic 1/(k + rank from 1).
                query=qe.Fusion.Dbsf() if method == "dbsf" else qe.Fusion.Rrf(k=rrf_k + 1),
                filter=flt,
                with_payload=True,
            )
        )

    @property
    def generation(self) -> str | None:
        """The token of the last writing session (fixed for a published copy)."""
        try:
            return (self.path / GENERATION_FILE).read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def close(self) -> None:
        if self._writing:
            self._shard.flush()
        self._shard.close()
        if self.owned_copy:
            shutil.rmtree(self.path, ignore_errors=True)


# -- qdrant-client -------------------------------------------------------------------


RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class _Retrying:
    """A qdrant-client whose requests are retried on timeouts, dropped connections and
    429/5xx answers (bounded, with backoff), then fail with what to check.

    Every call ragpipe makes is idempotent (deterministic point ids, delete by
    filter), so a retry cannot duplicate anything.
    """

    def __init__(self, client: Any, config: StoreConfig) -> None:
        self._client = client
        self._config = config

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name == "close":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._with_retries(name, lambda: attr(*args, **kwargs))

        return call

    def _with_retries(self, name: str, request: Callable[[], Any]) -> Any:
        import httpx
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        retries = self._config.retries
        delay = 0.5
        for attempt in range(retries + 1):
            try:
                return request()
            except UnexpectedResponse as exc:
                if exc.status_code not in RETRY_STATUS:
                    raise
                last: Exception = exc
            except (ResponseHandlingException, httpx.TransportError, ConnectionError) as exc:
                last = exc
            if attempt < retries:
                logger.warning(
                    "Qdrant %s failed (%s); retry %d/%d in %.1fs",
                    name,
                    _short(last),
                    attempt + 1,
                    retries,
                    delay,
                )
                time.sleep(delay)
                delay *= 2
        raise StageError(
            f"Qdrant at {self._config.url} failed {name} after {retries + 1} attempt(s): "
            f"{type(last).__name__}: {_short(last)}. Is the server up and reachable? Check "
            f"store.url (RAGPIPE_STORE__URL), store.timeout_s ({self._config.timeout_s}s) and "
            "store.retries. Nothing was marked done: the next run picks up from here."
        ) from last


def _short(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


class QdrantStore(_Scrolling):
    """qdrant-client against a server or cluster, or its local mode."""

    def __init__(self, config: StoreConfig, meta: StoreMeta) -> None:
        from qdrant_client import QdrantClient
        from qdrant_client.http import models as qm

        self._qm = qm
        self._embedder = meta.embedder
        self.collection = config.collection
        self.batch_size = config.batch_size
        self.page = config.scroll_page
        self._sparse = SparseEncoder()
        api_key = config.api_key.get_secret_value() if config.api_key else None
        try:
            if config.url:
                self.location = f"qdrant:{config.url}/{config.collection}"
                client = QdrantClient(
                    url=config.url, api_key=api_key, https=config.https, timeout=config.timeout_s
                )
                self.client = cast("QdrantClient", _Retrying(client, config))
                self.local = False
            else:
                path = str(config.path)
                self.location = f"qdrant-local:{path}/{config.collection}"
                if path == ":memory:":
                    self.client = QdrantClient(location=":memory:")
                else:
                    self.client = QdrantClient(path=path)
                self.local = True
            exists = self.client.collection_exists(self.collection)
        except (ConfigError, StageError):
            raise
        except Exception as exc:
            where = config.url or str(config.path)
            raise StageError(
                f"cannot reach Qdrant at {where}: {type(exc).__name__}: {exc}. Check store.url "
                "(RAGPIPE_STORE__URL), store.api_key and that the server is up."
            ) from exc
        self.exists = exists
        if exists:
            self._check(meta)
        elif meta.dim is not None:
            self._create(meta)
            self.exists = True

    def _check(self, meta: StoreMeta) -> None:
        info = self.client.get_collection(self.collection)
        stored = dict(info.config.metadata or {})
        vectors = info.config.params.vectors
        size = vectors[DENSE].size if isinstance(vectors, dict) and DENSE in vectors else None
        if size is None:
            raise ConfigError(
                f"collection {self.collection!r} at {self.location} was not created by ragpipe "
                f"(no '{DENSE}' vector); choose another store.collection"
            )
        stored.setdefault("dim", size)
        stored.setdefault("embedder", meta.embedder)
        meta.check(stored, self.location)

    def _create(self, meta: StoreMeta) -> None:
        models = self._qm
        assert meta.dim is not None
        self.client.create_collection(
            self.collection,
            vectors_config={
                DENSE: models.VectorParams(size=meta.dim, distance=models.Distance.COSINE)
            },
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            metadata=asdict(meta),
        )
        if self.local:
            return  # local mode ignores payload indexes (and warns about each)
        for name in KEYWORD_FIELDS:
            self.client.create_payload_index(
                self.collection, name, models.PayloadSchemaType.KEYWORD, wait=True
            )
        for name in INTEGER_FIELDS:
            self.client.create_payload_index(
                self.collection, name, models.PayloadSchemaType.INTEGER, wait=True
            )
        self.client.create_payload_index(
            self.collection,
            "text",
            models.TextIndexParams(
                type=models.TextIndexType.TEXT, tokenizer=models.TokenizerType.WORD, lowercase=True
            ),
            wait=True,
        )

    def _filter(self, where: Where | None) -> qm.Filter | None:
        if where is None:
            return None
        models = self._qm

        def condition(key: str, value: Match) -> Any:
            if isinstance(value, str | int):
                return models.FieldCondition(key=key, match=models.MatchValue(value=value))
            return models.FieldCondition(
                key=key, match=models.MatchAny(any=[str(v) for v in value])
            )

        must: list[Any] = [condition(k, v) for k, v in where.must.items()]
        must_not: list[Any] = []
        if where.must_not_all:
            inner: list[Any] = [condition(k, v) for k, v in where.must_not_all.items()]
            must_not.append(models.Filter(must=inner))
        return cast("qm.Filter", models.Filter(must=must or None, must_not=must_not or None))

    def upsert(
        self, points: Sequence[IndexPoint], progress: Callable[[int], None] | None = None
    ) -> None:
        models = self._qm
        for start in range(0, len(points), self.batch_size):
            batch = [
                models.PointStruct(
                    id=p.point_id,
                    vector={
                        DENSE: p.dense.tolist(),
                        SPARSE: models.SparseVector(
                            indices=p.sparse_indices, values=p.sparse_values
                        ),
                    },
                    payload={**p.payload, EMBEDDER_FIELD: self._embedder},
                )
                for p in points[start : start + self.batch_size]
            ]
            self.client.upsert(self.collection, batch, wait=True)
            if progress is not None:
                progress(len(batch))

    def delete(self, where: Where) -> int:
        n = self.count(where)
        if n:
            flt = self._filter(where)
            assert flt is not None
            self.client.delete(
                self.collection, points_selector=self._qm.FilterSelector(filter=flt), wait=True
            )
        return n

    def count(self, where: Where | None = None) -> int:
        result = self.client.count(self.collection, count_filter=self._filter(where), exact=True)
        return int(result.count)

    def scroll(self, where: Where | None = None, fields: list[str] | None = None) -> Iterator[Hit]:
        offset: Any = None
        while True:
            records, offset = self.client.scroll(
                self.collection,
                scroll_filter=self._filter(where),
                limit=self.page,
                offset=offset,
                with_payload=fields if fields is not None else True,
                with_vectors=False,
            )
            for record in records:
                yield _hit(record.id, 0.0, record.payload)
            if offset is None:
                return

    def _points(self, **kwargs: Any) -> list[Hit]:
        response = self.client.query_points(self.collection, with_payload=True, **kwargs)
        return [_hit(p.id, p.score, p.payload) for p in response.points]

    def query_dense(
        self, vector: npt.NDArray[np.float32], limit: int, where: Where | None = None
    ) -> list[Hit]:
        return self._points(
            query=vector.tolist(), using=DENSE, limit=limit, query_filter=self._filter(where)
        )

    def dense_vectors(self, point_ids: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
        records = self.client.retrieve(
            self.collection, list(point_ids), with_payload=False, with_vectors=[DENSE]
        )
        out = {}
        for r in records:
            vector = r.vector[DENSE] if isinstance(r.vector, dict) else r.vector
            out[str(r.id)] = np.asarray(vector, np.float32)
        return out

    def _sparse_vector(self, text: str) -> qm.SparseVector:
        indices, values = self._sparse.query(text)
        return self._qm.SparseVector(indices=indices, values=values)

    def query_sparse(self, text: str, limit: int, where: Where | None = None) -> list[Hit]:
        return self._points(
            query=self._sparse_vector(text),
            using=SPARSE,
            limit=limit,
            query_filter=self._filter(where),
        )

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
        models = self._qm
        flt = self._filter(where)
        legs = [
            models.Prefetch(
                query=vector.tolist(),
                using=DENSE,
                limit=prefetch,
                filter=flt,
                score_threshold=dense_floor,
            ),
            models.Prefetch(
                query=self._sparse_vector(text), using=SPARSE, limit=prefetch, filter=flt
            ),
        ]
        return self._points(
            prefetch=legs,
            # Qdrant counts ranks from 0: k + 1 gives the classic 1/(k + rank from 1).
            query=(
                models.FusionQuery(fusion=models.Fusion.DBSF)
                if method == "dbsf"
                else models.RrfQuery(rrf=models.Rrf(k=rrf_k + 1))
            ),
            limit=limit,
            query_filter=flt,
        )

    def close(self) -> None:
        self.client.close()


def open_store(config: StoreConfig, embedder: str, dim: int | None) -> VectorStore | None:
    """Open the configured store, checking it was built by ``embedder``.

    With ``dim`` the store is created on first use; with ``dim=None`` an
    existing store is opened (for diffing and deleting) and None is returned
    when there is none yet.
    """
    meta = StoreMeta(embedder=embedder, dim=dim)
    if config.backend == StoreBackend.EDGE:
        if dim is None and not (config.path / "segments").is_dir():
            return None
        return EdgeStore(
            config.path, meta, config.batch_size, config.scroll_page, config.min_free_mb
        )
    store = QdrantStore(config, meta)
    if not store.exists:
        store.close()
        return None
    return store


def open_reader(config: StoreConfig, embedder: str) -> VectorStore | None:
    """Open the index for reading (search, ask, evals): for Qdrant Edge, a private copy of
    its current published version, so readers never meet the writer nor each other (see
    ``published``). Before the first publish, the working shard itself. None: no index."""
    if config.backend == StoreBackend.EDGE:
        got = published.reader_copy(config.path)
        if got is not None:
            path, version = got
            try:
                store = EdgeStore(
                    path, StoreMeta(embedder, None), config.batch_size, config.scroll_page,
                    config.min_free_mb,
                )  # fmt: skip
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            store.owned_copy = True
            store.version = version
            label = version.generation[:12] if version else path.name
            store.location = f"edge:{config.path} (published version {label})"
            return store
    return open_store(config, embedder, None)


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
