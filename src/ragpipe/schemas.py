"""Record types and their Parquet schemas: the contract between stages.

Each schema is derived from its record type (``arrow_schema``), the one
source; ``Annotated[int, INT32]`` and ``Annotated[str, LARGE_STRING]`` pin
the Arrow types checkpoints are written with. Writers always pass the schema;
readers check it (``checkpoint.read_records``). Parquet never infers a schema
from the first row.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pyarrow as pa

# Arrow types where Python's type is not precise enough (see ``arrow_schema``).
INT32 = pa.int32()
LARGE_STRING = pa.large_string()


@dataclass(frozen=True)
class SourceFile:
    """A discovered file (output of *discover*)."""

    file_path: str  # stable identity: root as configured + path below it, POSIX
    abs_path: str
    root: str
    kind: str  # pdf | markdown | html | text | a kind of convert.DOCLING_SIMPLE
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Document:
    """A converted document (output of *convert*).

    ``markdown`` carries page markers (``PAGE_MARKER``) for paged sources so
    later stages can attribute chunks to pages.
    """

    doc_id: str
    file_path: str
    source_sha256: str
    kind: str
    converter: str
    markdown: Annotated[str, LARGE_STRING]
    num_pages: Annotated[int, INT32] | None
    config_fingerprint: str


@dataclass(frozen=True)
class CleanedDocument:
    """A cleaned document (output of *clean*)."""

    doc_id: str
    file_path: str
    source_sha256: str
    kind: str
    converter: str
    markdown: Annotated[str, LARGE_STRING]
    dropped: dict[str, int]
    config_fingerprint: str


@dataclass(frozen=True)
class Chunk:
    """A retrievable chunk (output of *chunk*)."""

    chunk_id: str
    doc_id: str
    file_path: str
    source_sha256: str
    heading_path: list[str]
    page: Annotated[int, INT32] | None
    line_start: Annotated[int, INT32]
    chunk_index: Annotated[int, INT32]
    char_start: int
    char_end: int
    text: str
    context: str | None  # sentence-window: the window; recursive: None (text is the context)
    text_sha256: str
    token_count: Annotated[int, INT32]
    config_fingerprint: str


def storable(text: str) -> str:
    """``text`` as UTF-8 can store it: a name's bytes that are not UTF-8 (Python keeps
    them as lone surrogates) written as ``\\xe9``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a lone UTF-16 surrogate (a JSON "\ud83d"), not a byte
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _storable_fields(row: Any) -> None:
    """A failure or skip row names what it could not read: a folder, a root or a link's
    target whose name is not UTF-8 made its row unwritable, and the whole run failed."""
    for f in fields(row):
        value = getattr(row, f.name)
        if isinstance(value, str):
            object.__setattr__(row, f.name, storable(value))


@dataclass(frozen=True)
class Failure:
    """One document that a stage could not process, and why."""

    file_path: str
    stage: str
    category: str
    message: str
    source_sha256: str | None = None

    def __post_init__(self) -> None:
        _storable_fields(self)


@dataclass(frozen=True)
class Skip:
    """A path deliberately not ingested (symlink, ignored type); not a failure."""

    file_path: str
    reason: str
    detail: str = field(default="")

    def __post_init__(self) -> None:
        _storable_fields(self)


@dataclass(frozen=True)
class PlanEntry:
    """What the re-index does with one file (output of *plan*).

    ``action``: added | changed | unchanged | cleanup (unchanged, but stale
    versions remain in the store) | removed (gone from every root).
    """

    file_path: str
    action: str
    source_sha256: str | None
    stored_versions: Annotated[int, INT32]


@dataclass(frozen=True)
class WebPage:
    """What the last fetch of one URL returned (the fetch state, ``fetch/pages.parquet``).

    ``sha256`` is over the bytes as served; ``body_path`` holds them as UTF-8
    text (HTML, text) or as served (PDF). ``fetched_at`` is when this content
    was downloaded, ``checked_at`` when the server last confirmed it.
    """

    url: str
    final_url: str
    source: str  # "urls" or the configured sitemap that listed the page
    kind: str
    content_type: str
    etag: str | None
    last_modified: str | None
    sha256: str
    size_bytes: int
    fetched_at: str
    checked_at: str
    title: str | None
    body_path: str


@dataclass(frozen=True)
class StoredObject:
    """What the last listing of one object-storage key found (``objects/objects.parquet``).

    ``version`` is the store's own (S3/Azure ETag, GCS generation); with ``size_bytes`` it
    decides whether the object is downloaded and hashed again. ``body_path`` holds the bytes
    as downloaded.
    """

    url: str
    root: str
    version: str
    size_bytes: int
    sha256: str
    body_path: str
    longest_line: int  # bytes, for discover.max_line_bytes without reading the body again


@dataclass(frozen=True)
class RecordState:
    """One record of a JSON/JSONL file as the last expansion found it
    (``records/records.parquet``); ``file_path`` is ``FILE#ID``."""

    file_path: str
    source_file: str
    source_sha256: str  # the file's: an unchanged file is not parsed again
    rules_fingerprint: str
    record_id: str
    title: str | None
    payload_json: str
    body_path: str
    root: str
    size_bytes: int
    sha256: str  # the record's rendering and payload
    file_clean: bool  # its file had no bad record (else it is parsed again next run)


# Page boundaries survive convert → clean as a marker line; chunk strips them.
PAGE_MARKER = "<!-- ragpipe:page {page} -->"
PAGE_MARKER_RE = r"^<!-- ragpipe:page (\d+) -->$"


_ARROW: dict[Any, pa.DataType] = {str: pa.string(), int: pa.int64(), float: pa.float64(),
                                  bool: pa.bool_()}  # fmt: skip


def _arrow_type(hint: Any) -> tuple[pa.DataType, bool]:
    """Arrow type of a field's annotation, and whether it is nullable."""
    nullable = False
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        nullable, hint = len(args) < len(get_args(hint)), args[0]
    origin = get_origin(hint)
    if origin is Annotated:
        return get_args(hint)[1], nullable
    if origin is list:
        return pa.list_(_arrow_type(get_args(hint)[0])[0]), nullable
    if origin is dict:
        key, value = get_args(hint)
        return pa.map_(_arrow_type(key)[0], _arrow_type(value)[0]), nullable
    return _ARROW[hint], nullable


def arrow_schema(record: type) -> pa.Schema:
    """The Parquet schema of a record type, derived from its annotations: one source."""
    hints = get_type_hints(record, include_extras=True)
    return pa.schema([pa.field(f.name, *_arrow_type(hints[f.name])) for f in fields(record)])


SOURCE_FILE_SCHEMA = arrow_schema(SourceFile)
DOCUMENT_SCHEMA = arrow_schema(Document)
CLEANED_DOCUMENT_SCHEMA = arrow_schema(CleanedDocument)
CHUNK_SCHEMA = arrow_schema(Chunk)
FAILURE_SCHEMA = arrow_schema(Failure)
SKIP_SCHEMA = arrow_schema(Skip)
PLAN_ENTRY_SCHEMA = arrow_schema(PlanEntry)
WEB_PAGE_SCHEMA = arrow_schema(WebPage)
STORED_OBJECT_SCHEMA = arrow_schema(StoredObject)
RECORD_STATE_SCHEMA = arrow_schema(RecordState)

SCHEMAS: dict[type, pa.Schema] = {
    SourceFile: SOURCE_FILE_SCHEMA,
    Document: DOCUMENT_SCHEMA,
    CleanedDocument: CLEANED_DOCUMENT_SCHEMA,
    Chunk: CHUNK_SCHEMA,
    Failure: FAILURE_SCHEMA,
    Skip: SKIP_SCHEMA,
    PlanEntry: PLAN_ENTRY_SCHEMA,
    WebPage: WEB_PAGE_SCHEMA,
    StoredObject: STORED_OBJECT_SCHEMA,
    RecordState: RECORD_STATE_SCHEMA,
}
