"""A Qdrant server or cluster (or qdrant-client's local mode), with retries."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from ragpipe.config import Quantization, StoreConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.store.base import (
    DENSE,
    EMBEDDER_FIELD,
    HNSW_M,
    INT8_OVERSAMPLING,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    Hit,
    IndexBuild,
    IndexPoint,
    Match,
    StoreMeta,
    Where,
    _hit,
    _Scrolling,
    enable_hnsw,
)
from ragpipe.store.sparse import SparseEncoder

if TYPE_CHECKING:
    from qdrant_client import QdrantClient
    from qdrant_client.http import models as qm

logger = logging.getLogger(__name__)

# A versioned index (``index.gate`` on a Qdrant server; see ``server_versions``) is
# written in its working collection, ``<store.collection>`` + WORK_SUFFIX, whose
# metadata holds the generation token of its last writing session.
WORK_SUFFIX = "-ragpipe-work"
GENERATION_KEY = "ragpipe_generation"


# -- qdrant-client -------------------------------------------------------------------


RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` written as ``***@``: a store's location is shown
    by /healthz (open without a token), logs and error messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


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
            f"Qdrant at {_where(self._config)} failed {name} after {retries + 1} attempt(s): "
            f"{type(last).__name__}: {_short(last)}. Is the server up and reachable? Check "
            f"store.url (RAGPIPE_STORE__URL), store.timeout_s ({self._config.timeout_s}s) and "
            "store.retries. Nothing was marked done: the next run picks up from here."
        ) from last


def _short(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def payload_index_params(models: Any, on_disk: bool) -> list[tuple[str, Any]]:
    """The payload indexes of a ragpipe collection (field, params), as the Edge store's
    (``edge.payload_indexes``): on disk with ``on_disk``; no extra HNSW links for
    ``NO_HNSW_FIELDS``."""
    disk = True if on_disk else None

    return [
        *(
            (
                name,
                models.KeywordIndexParams(
                    type=models.KeywordIndexType.KEYWORD,
                    on_disk=disk,
                    enable_hnsw=enable_hnsw(name),
                ),
            )
            for name in KEYWORD_FIELDS
        ),
        *(
            (
                name,
                models.IntegerIndexParams(
                    type=models.IntegerIndexType.INTEGER,
                    lookup=True,
                    range=True,
                    on_disk=disk,
                    enable_hnsw=enable_hnsw(name),
                ),
            )
            for name in INTEGER_FIELDS
        ),
        (
            "text",
            models.TextIndexParams(
                type=models.TextIndexType.TEXT,
                tokenizer=models.TokenizerType.WORD,
                lowercase=True,
                on_disk=disk,
                enable_hnsw=enable_hnsw("text"),
            ),
        ),
    ]


# qdrant-client's local mode locks its folder: one client per folder in a process. Stores
# opened on the same folder at once (the gate reads two versions side by side) share it.
_LOCAL_CLIENTS: dict[str, list[Any]] = {}  # path -> [client, stores holding it]


_LOCAL_LOCK = threading.Lock()


class _SharedLocal:
    """One store's handle on a shared local-mode client; ``close`` lets go of it."""

    def __init__(self, path: str) -> None:
        from qdrant_client import QdrantClient

        with _LOCAL_LOCK:
            held = _LOCAL_CLIENTS.get(path)
            if held is None:
                held = _LOCAL_CLIENTS[path] = [QdrantClient(path=path), 0]
            held[1] += 1
        self._path: str | None = path
        self._client = held[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        with _LOCAL_LOCK:
            if self._path is None:
                return
            held = _LOCAL_CLIENTS[self._path]
            held[1] -= 1
            if held[1] == 0:
                del _LOCAL_CLIENTS[self._path]
                held[0].close()
            self._path = None


def connect(config: StoreConfig) -> tuple[QdrantClient, bool]:
    """A client for ``config``'s server (with retries) or local mode; and whether local.

    Raises:
        StageError: the server cannot be reached.
    """
    from qdrant_client import QdrantClient

    api_key = config.api_key.get_secret_value() if config.api_key else None
    if config.url:
        client = QdrantClient(
            url=config.url, api_key=api_key, https=config.https, timeout=config.timeout_s
        )
        return cast("QdrantClient", _Retrying(client, config)), False
    path = str(config.path)
    if path == ":memory:":
        return QdrantClient(location=":memory:"), True
    return cast("QdrantClient", _SharedLocal(str(Path(path).resolve()))), True


def _where(config: StoreConfig) -> str:
    """The server, or the local-mode folder, for messages."""
    return without_credentials(config.url) if config.url else str(config.path)


class QdrantStore(_Scrolling):
    """qdrant-client against a server or cluster, or its local mode.

    ``collection`` overrides ``config.collection`` (an index version's own collection,
    or the working collection of a versioned index: see ``ragpipe.store.server_versions``).
    The collection's generation token is rewritten before the first write of every
    session that writes, as the Edge store's is, and (but for a working collection, whose
    token names the version staged) again when that session closes.
    """

    def __init__(
        self,
        config: StoreConfig,
        meta: StoreMeta,
        collection: str | None = None,
        reader: bool = False,
    ) -> None:
        from qdrant_client.http import models as qm

        self._reader = reader  # takes the collection's quantization and on_disk as they are

        self._qm = qm
        self._embedder = meta.embedder
        self._quantization = config.quantization
        self._on_disk = config.on_disk
        self.collection = collection or config.collection
        self.batch_size = config.batch_size
        self.page = config.scroll_page
        self._sparse = SparseEncoder()
        self._touched = False
        self._answered = True  # the last write went through (a failed one: no stamp at close)
        self.version: Any = None  # the IndexVersion a versioned reader reads (server_versions)
        self.location = (
            f"qdrant:{without_credentials(config.url)}/{self.collection}"
            if config.url
            else f"qdrant-local:{config.path}/{self.collection}"
        )
        try:
            self.client, self.local = connect(config)
            exists = self.client.collection_exists(self.collection)
        except (ConfigError, StageError):
            raise
        except Exception as exc:
            raise StageError(
                f"cannot reach Qdrant at {_where(config)}: {type(exc).__name__}: {exc}. Check "
                "store.url (RAGPIPE_STORE__URL), store.api_key and that the server is up."
            ) from exc
        self.exists = exists
        if exists:
            self.check(meta)
        elif meta.dim is not None:
            self._create(meta)
            self.exists = True

    def _before_write(self) -> None:
        """A new generation token before the first write of a session (and another when it
        closes): any collection, so that the readers of an ungated index (serve's file list
        and client BM25) see a re-ingest that left the point count as it was."""
        if self._touched:
            return
        self._stamp()
        self._touched = True

    def _stamp(self) -> None:
        self.client.update_collection(self.collection, metadata={GENERATION_KEY: uuid.uuid4().hex})

    @property
    def generation(self) -> str | None:
        """What the collection holds, as a token: its last writing session's and its point
        count (which a session still writing changes); None before ragpipe wrote it."""
        meta = self.client.get_collection(self.collection).config.metadata or {}
        token = meta.get(GENERATION_KEY)
        return f"{token}:{self.count()}" if token else None

    def check(self, meta: StoreMeta) -> None:
        """Raise ConfigError unless ``meta``'s embedder and dimension fit the collection."""
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
        assert isinstance(vectors, dict)
        quantized = Quantization.INT8 if vectors[DENSE].quantization_config else Quantization.NONE
        # Recorded in the metadata too: qdrant-client's local mode keeps no hnsw_config.
        on_disk = bool(stored.get("on_disk", info.config.hnsw_config.on_disk))
        if self._reader:  # creation settings: a reader's config need not repeat them (Edge's
            self._quantization, self._on_disk = quantized, on_disk  # readers never did)
            return
        if quantized != self._quantization:
            raise ConfigError(
                f"collection {self.collection!r} at {self.location} was created with "
                f"store.quantization {quantized.value} (configured: "
                f"{self._quantization.value}); it is fixed when a collection is created. Set "
                "store.quantization back, or choose a new store.collection."
            )
        if on_disk != self._on_disk:
            raise ConfigError(
                f"collection {self.collection!r} at {self.location} was created with "
                f"store.on_disk {str(on_disk).lower()} (configured: "
                f"{str(self._on_disk).lower()}); it is fixed when a collection is created. Set "
                "store.on_disk back, or choose a new store.collection."
            )

    def build_index(
        self,
        min_unindexed: int,
        starting: Callable[[int], None] | None = None,
        waiting: Callable[[float], None] | None = None,
    ) -> IndexBuild | None:
        """None: a Qdrant server's optimizer builds HNSW on its own, in the background
        (qdrant-client's local mode never does: it searches exhaustively)."""
        return None

    def _create(self, meta: StoreMeta) -> None:
        models = self._qm
        assert meta.dim is not None
        int8 = self._quantization == Quantization.INT8
        self.client.create_collection(
            self.collection,
            vectors_config={
                DENSE: models.VectorParams(
                    size=meta.dim,
                    distance=models.Distance.COSINE,
                    on_disk=True if int8 else None,
                    quantization_config=models.ScalarQuantization(
                        scalar=models.ScalarQuantizationConfig(
                            type=models.ScalarType.INT8, quantile=0.99, always_ram=True
                        )
                    )
                    if int8
                    else None,
                )
            },
            sparse_vectors_config={
                SPARSE: models.SparseVectorParams(
                    modifier=models.Modifier.IDF,
                    index=models.SparseIndexParams(on_disk=True) if self._on_disk else None,
                )
            },
            hnsw_config=models.HnswConfigDiff(m=HNSW_M, on_disk=True if self._on_disk else None),
            metadata={**asdict(meta), "on_disk": self._on_disk},
        )
        if self.local:
            return  # local mode ignores payload indexes (and warns about each)
        for name, params in payload_index_params(models, self._on_disk):
            self.client.create_payload_index(self.collection, name, params, wait=True)

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
            self._before_write()
            self._answered = False  # until the server took the write
            self.client.upsert(self.collection, batch, wait=True)
            self._answered = True
            if progress is not None:
                progress(len(batch))

    def delete(self, where: Where) -> int:
        n = self.count(where)
        if n:
            self._before_write()
            flt = self._filter(where)
            assert flt is not None
            self._answered = False
            self.client.delete(
                self.collection, points_selector=self._qm.FilterSelector(filter=flt), wait=True
            )
            self._answered = True
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

    def _points(self, payload: bool | list[str] = True, **kwargs: Any) -> list[Hit]:
        response = self.client.query_points(self.collection, with_payload=payload, **kwargs)
        return [_hit(p.id, p.score, p.payload) for p in response.points]

    def query_dense(
        self,
        vector: npt.NDArray[np.float32],
        limit: int,
        where: Where | None = None,
        exact: bool = False,
        fields: list[str] | None = None,
    ) -> list[Hit]:
        return self._points(
            True if fields is None else (fields or False),
            query=vector.tolist(),
            using=DENSE,
            limit=limit,
            query_filter=self._filter(where),
            search_params=self._qm.SearchParams(exact=True) if exact else self._dense_params(),
        )

    def _dense_params(self) -> qm.SearchParams | None:
        """int8 collections: rescore INT8_OVERSAMPLING x the candidates with the full
        vectors, as the Edge store does (the server's default takes no more)."""
        if self._quantization != Quantization.INT8:
            return None
        models = self._qm
        params: qm.SearchParams = models.SearchParams(
            quantization=models.QuantizationSearchParams(
                rescore=True, oversampling=INT8_OVERSAMPLING
            )
        )
        return params

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

    def query_sparse(
        self, text: str, limit: int, where: Where | None = None, payload: bool = True
    ) -> list[Hit]:
        return self._points(
            payload,
            query=self._sparse_vector(text),
            using=SPARSE,
            limit=limit,
            query_filter=self._filter(where),
        )

    def payloads(self, point_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not point_ids:
            return {}
        records = self.client.retrieve(
            self.collection, list(point_ids), with_payload=True, with_vectors=False
        )
        return {str(r.id): dict(r.payload or {}) for r in records}

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
                params=self._dense_params(),
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
        # A reader of an ungated collection that looked mid-session looks again; never a
        # working collection's token: it names the version the session staged.
        # Not after a write that failed: the server is down or hung, and the stamp would
        # wait out every retry again before the run could say so.
        if self._touched and self._answered and not self.collection.endswith(WORK_SUFFIX):
            self._touched = False
            with contextlib.suppress(Exception):  # a server gone: its readers see nothing
                self._stamp()
        self.client.close()
