"""Record types and their Parquet schemas: the contract between stages.

Writers always pass the schema; readers check it (``checkpoint.read_records``).
Parquet never infers a schema from the first row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(frozen=True)
class SourceFile:
    """A discovered file (output of *discover*)."""

    file_path: str  # stable identity: root as configured + path below it, POSIX
    abs_path: str
    root: str
    kind: str  # pdf | markdown | html | docx | text
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
    markdown: str
    num_pages: int | None
    config_fingerprint: str


@dataclass(frozen=True)
class CleanedDocument:
    """A cleaned document (output of *clean*)."""

    doc_id: str
    file_path: str
    source_sha256: str
    kind: str
    converter: str
    markdown: str
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
    page: int | None
    line_start: int
    chunk_index: int
    char_start: int
    char_end: int
    text: str
    context: str | None  # sentence-window: the window; recursive: None (text is the context)
    text_sha256: str
    token_count: int
    config_fingerprint: str


@dataclass(frozen=True)
class Failure:
    """One document that a stage could not process, and why."""

    file_path: str
    stage: str
    category: str
    message: str
    source_sha256: str | None = None


@dataclass(frozen=True)
class Skip:
    """A path deliberately not ingested (symlink, ignored type); not a failure."""

    file_path: str
    reason: str
    detail: str = field(default="")


@dataclass(frozen=True)
class PlanEntry:
    """What the re-index does with one file (output of *plan*).

    ``action``: added | changed | unchanged | cleanup (unchanged, but stale
    versions remain in the store) | removed (gone from every root).
    """

    file_path: str
    action: str
    source_sha256: str | None
    stored_versions: int


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


# Page boundaries survive convert → clean as a marker line; chunk strips them.
PAGE_MARKER = "<!-- ragpipe:page {page} -->"
PAGE_MARKER_RE = r"^<!-- ragpipe:page (\d+) -->$"

SOURCE_FILE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("abs_path", pa.string(), nullable=False),
        pa.field("root", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
    ]
)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("source_sha256", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("converter", pa.string(), nullable=False),
        pa.field("markdown", pa.large_string(), nullable=False),
        pa.field("num_pages", pa.int32(), nullable=True),
        pa.field("config_fingerprint", pa.string(), nullable=False),
    ]
)

CLEANED_DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("source_sha256", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("converter", pa.string(), nullable=False),
        pa.field("markdown", pa.large_string(), nullable=False),
        pa.field("dropped", pa.map_(pa.string(), pa.int64()), nullable=False),
        pa.field("config_fingerprint", pa.string(), nullable=False),
    ]
)

CHUNK_SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("source_sha256", pa.string(), nullable=False),
        pa.field("heading_path", pa.list_(pa.string()), nullable=False),
        pa.field("page", pa.int32(), nullable=True),
        pa.field("line_start", pa.int32(), nullable=False),
        pa.field("chunk_index", pa.int32(), nullable=False),
        pa.field("char_start", pa.int64(), nullable=False),
        pa.field("char_end", pa.int64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("context", pa.string(), nullable=True),
        pa.field("text_sha256", pa.string(), nullable=False),
        pa.field("token_count", pa.int32(), nullable=False),
        pa.field("config_fingerprint", pa.string(), nullable=False),
    ]
)

FAILURE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("source_sha256", pa.string(), nullable=True),
    ]
)

SKIP_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)

PLAN_ENTRY_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("source_sha256", pa.string(), nullable=True),
        pa.field("stored_versions", pa.int32(), nullable=False),
    ]
)

WEB_PAGE_SCHEMA = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),
        pa.field("final_url", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("content_type", pa.string(), nullable=False),
        pa.field("etag", pa.string(), nullable=True),
        pa.field("last_modified", pa.string(), nullable=True),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("fetched_at", pa.string(), nullable=False),
        pa.field("checked_at", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=True),
        pa.field("body_path", pa.string(), nullable=False),
    ]
)

SCHEMAS: dict[type, pa.Schema] = {
    SourceFile: SOURCE_FILE_SCHEMA,
    Document: DOCUMENT_SCHEMA,
    CleanedDocument: CLEANED_DOCUMENT_SCHEMA,
    Chunk: CHUNK_SCHEMA,
    Failure: FAILURE_SCHEMA,
    Skip: SKIP_SCHEMA,
    PlanEntry: PLAN_ENTRY_SCHEMA,
    WebPage: WEB_PAGE_SCHEMA,
}
