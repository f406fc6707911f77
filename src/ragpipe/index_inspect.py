"""``ragpipe inspect``: what the index holds, read from the index itself.

Everything here reads a store opened for reading (the live version, or one named by
``--version``) through the ``VectorStore`` protocol, so it works the same on Qdrant Edge
and on a Qdrant server. The last run's checkpoints add what the index does not store:
which converter made a file's Markdown, and the failure rows of files that did not make it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragpipe.config import StoreBackend, StoreConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import file_matches
from ragpipe.ingest.chunk import TokenCounter
from ragpipe.store.base import VectorStore, Where

FILE_FIELDS = ["file_path", "chunk_index", "chunk_total", "source_sha", "ingested_at", "page"]
FIRST_WORDS = 12
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass
class FileRow:
    """One file as the index holds it (or a file that failed and is not in it)."""

    file_path: str
    chunks: int
    source_sha: str | None
    ingested_at: str | None
    pages: int | None = None
    converter: str | None = None
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChunkRow:
    """One chunk of a file, in order."""

    chunk_index: int
    point_id: str
    heading: str
    page: int | None
    tokens: int
    first_words: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChunkView:
    """A chunk in full, with its neighbours in its document."""

    point_id: str
    file_path: str
    chunk_index: int
    text: str
    payload: dict[str, Any]
    previous: ChunkRow | None = None
    next: ChunkRow | None = None
    tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stats:
    """The index in numbers."""

    location: str
    backend: str
    points: int
    files: int
    embedder: str | None
    version: str | None
    versions: list[dict[str, Any]] = field(default_factory=list)
    disk_bytes: int | None = None
    unindexed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def heading_text(payload: dict[str, Any]) -> str:
    """The chunk's heading path as ``A > B > C`` (empty when it has none)."""
    path = payload.get("heading_path")
    if isinstance(path, list | tuple):
        return " > ".join(str(p) for p in path)
    return str(path or "")


def first_words(text: str, n: int = FIRST_WORDS) -> str:
    words = text.split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def _checkpoint(work_dir: Path, relative: str, columns: list[str]) -> list[dict[str, Any]]:
    """Rows of one of the last run's Parquet checkpoints ([] when there is none)."""
    path = work_dir / relative
    if not path.is_file():
        return []
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=columns)
    except (OSError, ValueError, KeyError):  # an older or damaged checkpoint: not shown
        return []
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def files(store: VectorStore, work_dir: Path | None = None) -> list[FileRow]:
    """Every file in the index, by path, with its chunk count, source SHA-256, when it was
    ingested and (from the last run's checkpoints in ``work_dir``) its converter; then the
    files the last run failed on that the index does not hold, with the reason."""
    rows: dict[str, FileRow] = {}
    for hit in store.scroll(fields=FILE_FIELDS):
        p = hit.payload
        path = str(p.get("file_path", ""))
        row = rows.get(path)
        if row is None:
            row = rows[path] = FileRow(path, 0, p.get("source_sha"), p.get("ingested_at"))
        row.chunks += 1
        at = p.get("ingested_at")
        if at and (row.ingested_at is None or str(at) > str(row.ingested_at)):
            row.ingested_at, row.source_sha = str(at), p.get("source_sha")
    if work_dir is not None:
        documents = _checkpoint(
            work_dir, "convert/documents.parquet", ["file_path", "source_sha256", "converter",
                                                    "num_pages"]
        )  # fmt: skip
        # The last run's conversions, then those of the runs before (convert's record of
        # them): after a run that changed nothing, every file showed no converter.
        known = _checkpoint(work_dir, "convert/converters.parquet",
                            ["file_path", "source_sha256", "converter", "num_pages"])  # fmt: skip
        for doc in [*documents, *known]:
            row = rows.get(str(doc["file_path"]))
            if row is not None and row.converter is None and doc["source_sha256"] == row.source_sha:
                row.converter = doc["converter"]
                row.pages = _int(doc["num_pages"])
        failures = _checkpoint(work_dir, "failures.parquet", ["file_path", "stage", "message"])
        for failure in failures:
            path = str(failure["file_path"])
            reason = f"{failure['stage']}: {failure['message']}"
            if path in rows:
                rows[path].failure = reason  # the last run failed on a newer copy
            else:
                rows[path] = FileRow(path, 0, None, None, failure=reason)
    return sorted(rows.values(), key=lambda r: r.file_path)


def resolve_file(store: VectorStore, path: str) -> str:
    """The one indexed file ``path`` names (a path suffix on component boundaries).

    Raises:
        ConfigError: no file, or several, match.
    """
    known = {str(h.payload.get("file_path", "")) for h in store.scroll(fields=["file_path"])}
    if path in known:
        return path
    found = sorted(k for k in known if file_matches(k, path))
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError(
            f"no file in the index ends with {path!r}: `ragpipe inspect files` lists them"
        )
    raise ConfigError(f"{path!r} matches {len(found)} files: {', '.join(found[:5])}; give more "
                      "of the path")  # fmt: skip


def _row(point_id: str, payload: dict[str, Any], counter: TokenCounter) -> ChunkRow:
    text = str(payload.get("text", ""))
    return ChunkRow(
        chunk_index=_int(payload.get("chunk_index")) or 0,
        point_id=point_id,
        heading=heading_text(payload),
        page=_int(payload.get("page")),
        tokens=counter.count(text),
        first_words=first_words(text),
    )


def file_chunks(store: VectorStore, path: str, counter: TokenCounter) -> tuple[str, list[ChunkRow]]:
    """The file ``path`` names and its chunks in order, each with its heading path, page,
    word-piece count (the chunker's tokenizer) and first words."""
    full = resolve_file(store, path)
    hits = store.scroll(Where(must={"file_path": full}))
    rows = sorted((_row(h.point_id, h.payload, counter) for h in hits),
                  key=lambda r: r.chunk_index)  # fmt: skip
    return full, rows


def _point_ids(store: VectorStore) -> Iterator[str]:
    for hit in store.scroll(fields=[]):
        yield hit.point_id


def resolve_chunk(store: VectorStore, chunk_id: str) -> str:
    """The point id ``chunk_id`` names: a whole point id, a unique prefix of one, or
    ``FILE#N`` (chunk number N of the file a path or path end names).

    Raises:
        ConfigError: no chunk, or several, match.
    """
    file, sep, number = chunk_id.strip().rpartition("#")
    if (
        sep and file and number.isdecimal() and number.isascii()
    ):  # FILE#N: the file's chunk number N
        full = resolve_file(store, file)
        where = Where(must={"file_path": full, "chunk_index": int(number)})
        hits = list(store.scroll(where, fields=[]))
        if not hits:
            raise ConfigError(f"{full} has no chunk #{number}: `ragpipe inspect file {file}` "
                              "lists its chunks")  # fmt: skip
        return hits[0].point_id
    wanted = chunk_id.strip().lower()
    if _UUID.match(wanted) and store.payloads([wanted]):
        return wanted
    if not re.fullmatch(r"[0-9a-f-]{4,36}", wanted):
        raise ConfigError(
            f"chunk id {chunk_id!r}: give FILE#N (chunk N of a file), or a point id (or its "
            "first 4+ characters) as `ragpipe inspect file` and `ragpipe search --format json` "
            "show them"
        )
    found = [p for p in _point_ids(store) if p.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError(f"no point id starts with {chunk_id!r} in this index version")
    raise ConfigError(f"{chunk_id!r} is the start of {len(found)} point ids; give more of it")


def chunk(store: VectorStore, chunk_id: str, counter: TokenCounter) -> ChunkView:
    """One chunk's text and payload, and the chunks before and after it in its document."""
    point_id = resolve_chunk(store, chunk_id)
    payload = store.payloads([point_id])[point_id]
    index = _int(payload.get("chunk_index")) or 0
    view = ChunkView(
        point_id=point_id,
        file_path=str(payload.get("file_path", "")),
        chunk_index=index,
        text=str(payload.get("text", "")),
        payload={k: v for k, v in payload.items() if k != "text"},
        tokens=counter.count(str(payload.get("text", ""))),
    )
    doc = payload.get("doc_id")
    if doc is not None:
        for offset, slot in ((-1, "previous"), (1, "next")):
            if index + offset < 0:
                continue
            near = list(
                store.scroll(Where(must={"doc_id": str(doc), "chunk_index": index + offset}))
            )
            if near:
                setattr(view, slot, _row(near[0].point_id, near[0].payload, counter))
    return view


def disk_bytes(*paths: Path, skip: frozenset[str] = frozenset()) -> int:
    """Bytes the files under ``paths`` take on disk (allocated blocks, as ``du``: segments
    are sparse, their apparent size is far larger; a file linked twice counts once); links
    not followed, folders named in ``skip`` left out."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for path in paths:
        for folder, subfolders, names in os.walk(path):
            subfolders[:] = [d for d in subfolders if d not in skip]
            for name in names:
                try:
                    stat = (Path(folder) / name).lstat()
                except OSError:  # removed meanwhile
                    continue
                if (stat.st_dev, stat.st_ino) not in seen:
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_blocks * 512
    return total


def edge_disk_bytes(store_path: Path) -> int:
    """An Edge index on disk: the working store and its published versions beside it (not
    the readers' private copies, this command's own among them)."""
    from ragpipe.store.published import READERS, root

    paths = [p for p in (store_path, root(store_path)) if p.exists()]
    return disk_bytes(*paths, skip=frozenset({READERS}))


def stats(store: VectorStore, config: StoreConfig) -> Stats:
    """Points, files, the embedder, the version read and every version kept, the index's
    size on disk (Edge: the working store and every published version) and the points
    written since the HNSW index was last built."""
    from ragpipe.store.versions import list_versions

    points = store.count()
    names: set[str] = set()
    embedder: str | None = None
    for hit in store.scroll(fields=["file_path", "embedder"]):
        names.add(str(hit.payload.get("file_path", "")))
        embedder = embedder or hit.payload.get("embedder")
    version = getattr(store, "version", None)
    try:
        versions = [asdict(v) for v in list_versions(config)]
    except ConfigError:  # no versions recorded (an index from before them)
        versions = []
    edge = config.backend == StoreBackend.EDGE
    unindexed = getattr(store, "unindexed", None)
    return Stats(
        location=store.location,
        backend=config.backend.value,
        points=points,
        files=len(names),
        embedder=embedder,
        version=getattr(version, "generation", None),
        versions=versions,
        disk_bytes=edge_disk_bytes(config.path) if edge and config.path.exists() else None,
        # Counted as written since the last build, overwritten and deleted points too:
        # "15 outside HNSW" on an index of 9. At most every point is.
        unindexed=min(unindexed(), points) if callable(unindexed) else None,
    )
