"""The base schema every tokenloom table starts with.

Later stages add columns (flags, scores, token ids, embeddings); these five are written by ingest
and never rewritten.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["BASE_SCHEMA", "SCHEMA_VERSION", "SCHEMA_VERSION_KEY", "OP_KEY", "validate_base_schema"]

#: Bumped when the base columns change in an incompatible way.
SCHEMA_VERSION = "1"

#: Table metadata key (see :mod:`tokenloom.table.meta`) recording :data:`SCHEMA_VERSION`.
SCHEMA_VERSION_KEY = "tokenloom.schema_version"

#: Transaction property naming the tokenloom operation that created a version.
OP_KEY = "tokenloom.op"

BASE_SCHEMA = pa.schema(
    [
        # dense, in ingest order, never reused; its field metadata holds the table's own keys
        # (tokenloom.table.meta), so the schema level stays empty for other Lance readers
        pa.field("id", pa.int64(), nullable=False, metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION}),
        pa.field("text", pa.large_string(), nullable=False),  # large: single documents may be huge
        pa.field("source", pa.string(), nullable=False),  # origin, e.g. "wiki_en"
        pa.field("n_chars", pa.int64(), nullable=False),  # len(text) in code points
        pa.field("meta", pa.string(), nullable=False),  # JSON object text
    ],
)


def validate_base_schema(schema: pa.Schema, uri: str) -> None:
    """Check that a dataset carries the tokenloom base columns with compatible types.

    Raises:
        TableError: naming the missing or mistyped column.
    """
    from tokenloom.errors import TableError

    for field in BASE_SCHEMA:
        if field.name not in schema.names:
            raise TableError(
                f"{uri} is a Lance dataset but not a tokenloom table: column {field.name!r} is "
                f"missing; create one with `tokenloom ingest FILES --table {uri}` on a new path"
            )
        actual = schema.field(field.name).type
        if actual != field.type:
            raise TableError(
                f"column {field.name!r} of {uri} has type {actual}, expected {field.type}"
            )
