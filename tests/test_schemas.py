"""Record types are the one source of their Parquet schemas; the derived schemas keep
the exact Arrow types checkpoints were written with (int32 counters, large Markdown)."""

from __future__ import annotations

import pyarrow as pa

from ragpipe.schemas import (
    CHUNK_SCHEMA,
    CLEANED_DOCUMENT_SCHEMA,
    DOCUMENT_SCHEMA,
    SCHEMAS,
    Skip,
    arrow_schema,
)


def test_derived_schemas_keep_the_checkpoint_types() -> None:
    assert CHUNK_SCHEMA.field("page") == pa.field("page", pa.int32(), nullable=True)
    assert CHUNK_SCHEMA.field("chunk_index") == pa.field("chunk_index", pa.int32(), False)
    assert CHUNK_SCHEMA.field("heading_path").type == pa.list_(pa.string())
    assert CHUNK_SCHEMA.field("context").nullable and not CHUNK_SCHEMA.field("text").nullable
    assert DOCUMENT_SCHEMA.field("markdown").type == pa.large_string()
    assert CLEANED_DOCUMENT_SCHEMA.field("dropped").type == pa.map_(pa.string(), pa.int64())
    assert arrow_schema(Skip).names == ["file_path", "reason", "detail"]


def test_every_record_field_is_in_its_schema() -> None:
    for record, schema in SCHEMAS.items():
        assert schema.names == list(record.__dataclass_fields__), record.__name__
