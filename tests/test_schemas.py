"""Record types are the one source of their Parquet schemas; the derived schemas keep
the exact Arrow types checkpoints were written with (int32 counters, large Markdown).
Stage counts are typed and keep the flat form manifests store them in."""

from __future__ import annotations

import pyarrow as pa

from ragpipe.ingest.convert import ConvertCounts
from ragpipe.ingest.discover import DiscoverCounts
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


def test_stage_counts_round_trip_through_the_manifest() -> None:
    converted = ConvertCounts(3, 2, 1, 0, {"docling-native-pdf": 1, "text": 2})
    flat = converted.as_dict()
    assert flat == {"documents": 3, "converted": 2, "skipped_unchanged": 1, "failed": 0,
                    "converter:docling-native-pdf": 1, "converter:text": 2}  # fmt: skip
    assert ConvertCounts.from_dict(flat) == converted
    # Optional counts (the web fetch's) are left out at 0; a count no longer written is
    # ignored and a missing one reads as 0 (manifests written by an older ragpipe).
    assert DiscoverCounts(seen=4).as_dict() == {"seen": 4, "failed": 0, "skipped": 0}
    assert DiscoverCounts(seen=4, requests=7).line() == "seen=4, failed=0, skipped=0, requests=7"
    assert DiscoverCounts.from_dict({"seen": 4, "gone": 1}) == DiscoverCounts(seen=4)
