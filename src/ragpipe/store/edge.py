"""Qdrant Edge: the embedded engine in-process (the default store)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ragpipe.checkpoint import atomic_write_bytes, fsync_dir
from ragpipe.config import Quantization
from ragpipe.errors import ConfigError, StageError
from ragpipe.store.base import (
    DENSE,
    EMBEDDER_FIELD,
    GENERATION_FILE,
    HNSW_M,
    INT8_OVERSAMPLING,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    META_FILE,
    SPARSE,
    UNINDEXED_FILE,
    Hit,
    IndexBuild,
    IndexPoint,
    Match,
    StoreMeta,
    Where,
    _hit,
    _point_bytes,
    _Scrolling,
    enable_hnsw,
    ensure_space,
    read_meta,
)
from ragpipe.store.published import drop_copy
from ragpipe.store.sparse import SparseEncoder

if TYPE_CHECKING:
    import qdrant_edge

    from ragpipe.store.published import IndexVersion

logger = logging.getLogger(__name__)

BUILD_HEARTBEAT_S = 30.0  # how often build_index's ``waiting`` hears from a build


def edge_config(path: Path) -> dict[str, Any] | None:
    """The engine's own record of how the Edge store at ``path`` was created (None: no
    store there)."""
    config_file = path / "edge_config.json"
    if not config_file.is_file():
        return None
    stored: dict[str, Any] = json.loads(config_file.read_text(encoding="utf-8"))
    return stored


def engine_threshold(path: Path) -> int:
    """The Edge store's indexing_threshold (fixed at creation), in points of its
    dimension: the engine builds no index for fewer points than this."""
    stored = edge_config(path) or {}
    kb = (stored.get("optimizers") or {}).get("indexing_threshold") or 10_000
    size = (stored.get("vectors") or {}).get(DENSE, {}).get("size") or 1
    return int(kb) * 1024 // (int(size) * 4)


def _wait_beating(child: subprocess.Popen[bytes], waiting: Callable[[float], None] | None) -> None:
    """Wait for ``child``; tell ``waiting`` the seconds so far every ``BUILD_HEARTBEAT_S``."""
    started = time.perf_counter()
    while True:
        try:
            child.wait(timeout=BUILD_HEARTBEAT_S)
            return
        except subprocess.TimeoutExpired:
            if waiting is not None:
                waiting(time.perf_counter() - started)


def indexing_threshold_kb(points: int, dim: int) -> int:
    """Qdrant indexes a segment once its vectors pass ``indexing_threshold`` (KB): a little
    below the size of ``points`` vectors, so that when ``build_index`` decides to build
    (``store.hnsw_min_unindexed``), the engine does (and not before: Edge only builds on
    request)."""
    return max(1, points * dim * 4 * 9 // 10 // 1024)


def shard_config(
    qe: Any, dim: int, quantization: Quantization, on_disk: bool, threshold_kb: int | None = None
) -> Any:
    """The ``EdgeConfig`` of a ragpipe store: named dense + BM25 vectors, and what
    ``store.quantization`` and ``store.on_disk`` choose."""
    int8 = quantization == Quantization.INT8
    dense = qe.EdgeVectorParams(
        size=dim,
        distance=qe.Distance.Cosine,
        # int8: the quantized vectors in RAM, the full ones read from disk to rescore.
        on_disk=True if int8 else None,
        quantization_config=qe.ScalarQuantizationConfig(
            type=qe.ScalarType.Int8, quantile=0.99, always_ram=True
        )
        if int8
        else None,
    )
    disk = True if on_disk else None
    return qe.EdgeConfig(
        vectors={DENSE: dense},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, on_disk=disk)},
        # m HNSW_M; the engine's ef_construct and full_scan_threshold; on disk with on_disk.
        hnsw_config=qe.HnswIndexConfig(
            m=HNSW_M, ef_construct=100, full_scan_threshold=10_000, on_disk=disk
        ),
        optimizers=qe.EdgeOptimizersConfig(indexing_threshold=threshold_kb)
        if threshold_kb is not None
        else None,
    )


def payload_indexes(qe: Any, on_disk: bool) -> list[tuple[str, Any]]:
    """The payload indexes of a ragpipe store (field, params); on disk with ``on_disk``;
    no extra HNSW links for ``NO_HNSW_FIELDS``."""
    disk = True if on_disk else None

    return [
        *(
            (name, qe.KeywordIndexParams(on_disk=disk, enable_hnsw=enable_hnsw(name)))
            for name in KEYWORD_FIELDS
        ),
        *(
            (
                name,
                qe.IntegerIndexParams(
                    lookup=True, range=True, on_disk=disk, enable_hnsw=enable_hnsw(name)
                ),
            )
            for name in INTEGER_FIELDS
        ),
        (
            "text",
            qe.TextIndexParams(
                tokenizer=qe.TokenizerType.Word,
                lowercase=True,
                on_disk=disk,
                enable_hnsw=enable_hnsw("text"),
            ),
        ),
    ]


def stored_quantization(path: Path) -> Quantization | None:
    """The quantization the Edge store at ``path`` was created with (None: no store)."""
    stored = edge_config(path)
    if stored is None:
        return None
    dense = stored.get("vectors", {}).get(DENSE, {})
    return Quantization.INT8 if dense.get("quantization_config") else Quantization.NONE


def check_quantization(path: Path, configured: Quantization) -> None:
    """ConfigError when the store at ``path`` was created with another quantization."""
    stored = stored_quantization(path)
    _check_fixed(path, "quantization", stored and stored.value, configured.value)


def _check_fixed(path: Path, field: str, stored: str | None, configured: str) -> None:
    """ConfigError when ``store.<field>``, fixed at creation, differs from the stored one."""
    if stored is not None and stored != configured:
        raise ConfigError(
            f"the index at {path} was created with store.{field} {stored} (configured: "
            f"{configured}); it is fixed when a store is created. Set store.{field} back, or "
            "point store.path at a new index (the next ingest re-embeds everything into it)."
        )


def stored_on_disk(path: Path) -> bool | None:
    """Whether the Edge store at ``path`` keeps its indexes on disk (None: no store)."""
    stored = edge_config(path)
    if stored is None:
        return None
    return bool(stored.get("sparse_vectors", {}).get(SPARSE, {}).get("on_disk"))


def check_on_disk(path: Path, configured: bool) -> None:
    """ConfigError when the store at ``path`` was created with another ``store.on_disk``."""
    stored = stored_on_disk(path)
    _check_fixed(path, "on_disk", None if stored is None else str(stored).lower(),
                 str(configured).lower())  # fmt: skip


class EdgeStore(_Scrolling):
    """Qdrant Edge: the real engine in-process, one shard directory."""

    def __init__(
        self,
        path: Path,
        meta: StoreMeta,
        batch_size: int = 256,
        page: int = 1000,
        min_free_mb: int = 0,
        quantization: Quantization | None = None,
        hnsw_min_unindexed: int = 30_000,
        on_disk: bool | None = None,
    ):
        """``quantization`` and ``on_disk``: what a new store gets, and what an existing one
        must have (None: whatever it has, for readers)."""
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
        self._quantization = quantization or Quantization.NONE
        self._on_disk = bool(on_disk)
        self._hnsw_min_unindexed = hnsw_min_unindexed
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
            self.quantization = self._stored_quantization()
            try:
                if quantization is not None:
                    check_quantization(path, quantization)
                if on_disk is not None:
                    check_on_disk(path, on_disk)
            except ConfigError:
                self._shard.close()
                raise
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
        threshold_kb = indexing_threshold_kb(self._hnsw_min_unindexed, meta.dim)
        config = shard_config(qe, meta.dim, self._quantization, self._on_disk, threshold_kb)
        try:
            shard: qdrant_edge.EdgeShard = qe.EdgeShard.create(str(tmp), config)
            self._repair_indexes(shard, self._on_disk)
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
        if not path.is_dir() or not set(found) <= {META_FILE, GENERATION_FILE, UNINDEXED_FILE}:
            raise StageError(
                f"store.path {path} exists and is not a Qdrant Edge store (it holds "
                f"{', '.join(found[:5])}{', …' if len(found) > 5 else ''}). Point store.path at "
                "a new or empty directory."
            )
        for name in found:
            (path / name).unlink()
        path.rmdir()

    def _repair_indexes(self, shard: qdrant_edge.EdgeShard, on_disk: bool) -> None:
        """Create every payload index the shard lacks (a store created before one existed,
        or by an older ragpipe killed mid-creation); on disk with ``store.on_disk``."""
        qe = self._qe
        have = set(shard.info().payload_schema)
        wanted = payload_indexes(qe, on_disk)
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
            self._repair_indexes(self._shard, bool(stored_on_disk(self.path)))

    def check(self, meta: StoreMeta) -> None:
        """Raise ConfigError unless ``meta``'s embedder and dimension fit this store."""
        meta.check({"embedder": self._embedder, "dim": self._stored_dim()}, str(self.path))

    def _stored_quantization(self) -> Quantization:
        return stored_quantization(self.path) or Quantization.NONE

    def unindexed(self) -> int:
        """Points written since the HNSW index was last built (``UNINDEXED_FILE``); a store
        from before that record counts every point.

        Not the engine's ``indexed_vectors_count``: it counts the sparse vectors too, and
        deleted points until their segment is rebuilt, so after deletions it undercounts.
        """
        try:
            data = json.loads((self.path / UNINDEXED_FILE).read_text(encoding="utf-8"))
            return int(data["points"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return int(self._shard.info().points_count)

    def _engine_threshold(self) -> int:
        """The store's indexing_threshold, in points of its dimension."""
        return engine_threshold(self.path)

    def _set_unindexed(self, points: int) -> None:
        atomic_write_bytes(self.path / UNINDEXED_FILE, json.dumps({"points": points}).encode())

    def build_index(
        self,
        min_unindexed: int,
        starting: Callable[[int], None] | None = None,
        waiting: Callable[[float], None] | None = None,
    ) -> IndexBuild | None:
        before = self.unindexed()
        # The engine indexes a segment only past the store's indexing_threshold, fixed when
        # the store was created (from store.hnsw_min_unindexed then; Qdrant's 10 MB before).
        if before < max(min_unindexed, self._engine_threshold()):
            return None
        if starting is not None:
            starting(before)
        self._before_write()
        started = time.perf_counter()
        self._optimize_in_child(waiting)
        seconds = time.perf_counter() - started
        self._set_unindexed(0)
        return IndexBuild(before, seconds)

    def _optimize_in_child(self, waiting: Callable[[float], None] | None) -> None:
        """``optimize()`` in a child process (``ragpipe.store.optimize``: the engine holds
        the GIL while it builds). ``waiting`` hears the seconds so far every
        ``BUILD_HEARTBEAT_S``. An exception here, Ctrl-C included, stops the child; the
        store stays as it was before the build, and open."""
        self._shard.flush()
        self._shard.close()
        command = [sys.executable, "-m", "ragpipe.store.optimize", str(os.getpid()), str(self.path)]
        try:
            with tempfile.TemporaryFile() as errors:
                child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=errors)
                try:
                    _wait_beating(child, waiting)
                finally:
                    if child.poll() is None:
                        child.kill()
                        child.wait()
                if child.returncode != 0:
                    errors.seek(0)
                    tail = errors.read()[-2000:].decode("utf-8", "replace").strip()
                    raise StageError(
                        f"building the HNSW index of the Qdrant Edge store at {self.path} "
                        f"failed (exit {child.returncode}): {tail or 'no message'}. The store "
                        "is unchanged; the next ingest tries again."
                    )
        finally:
            self._shard = self._qe.EdgeShard.load(str(self.path))

    def _stored_dim(self) -> int | None:
        size = (edge_config(self.path) or {}).get("vectors", {}).get(DENSE, {}).get("size")
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
            self._set_unindexed(self.unindexed() + len(points))
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

    def _dense_params(self) -> qdrant_edge.SearchParams | None:
        """int8 stores: rescore INT8_OVERSAMPLING x the candidates with the full vectors."""
        if self.quantization != Quantization.INT8:
            return None
        qe = self._qe
        params: qdrant_edge.SearchParams = qe.SearchParams(
            quantization=qe.QuantizationSearchParams(rescore=True, oversampling=INT8_OVERSAMPLING)
        )
        return params

    def _query(self, request: qdrant_edge.QueryRequest) -> list[Hit]:
        return [_hit(p.id, p.score, p.payload) for p in self._shard.query(request)]

    def query_dense(
        self,
        vector: npt.NDArray[np.float32],
        limit: int,
        where: Where | None = None,
        exact: bool = False,
        fields: list[str] | None = None,
    ) -> list[Hit]:
        qe = self._qe
        return self._query(
            qe.QueryRequest(
                limit=limit,
                query=qe.Query.Nearest(vector.tolist(), using=DENSE),
                filter=self._filter(where),
                with_payload=True if fields is None else (fields or False),
                params=qe.SearchParams(exact=True) if exact else self._dense_params(),
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

    def query_sparse(
        self, text: str, limit: int, where: Where | None = None, payload: bool = True
    ) -> list[Hit]:
        return self._query(
            self._qe.QueryRequest(
                limit=limit,
                query=self._sparse_query(text),
                filter=self._filter(where),
                with_payload=payload,
            )
        )

    def payloads(self, point_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not point_ids:
            return {}
        records = self._shard.retrieve(
            [uuid.UUID(p) for p in point_ids], with_payload=True, with_vector=False
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
        qe = self._qe
        flt = self._filter(where)
        dense = qe.Query.Nearest(vector.tolist(), using=DENSE)
        legs = [
            qe.Prefetch(
                limit=prefetch,
                query=dense,
                filter=flt,
                score_threshold=dense_floor,
                params=self._dense_params(),
            ),
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
            drop_copy(self.path)
