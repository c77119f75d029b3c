"""The token layouts: ids written as lists or as raw bytes read back the same through the one
helper, nulls and slices included; a damaged or unrecorded bytes column is refused by name."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.table.tokens import (
    LAYOUT_META_KEY,
    TokenLayoutError,
    as_token_lists,
    join_token_lists,
    layout_field,
    layout_name,
    to_layout,
    token_dtype,
    token_lists,
)

_ROWS = [[1, 2, 3], None, [], [65535, 7], [9]]


@pytest.mark.parametrize("id_type", [pa.uint16(), pa.int32()])
@pytest.mark.parametrize("layout", ["list", "bytes"])
def test_both_layouts_read_back_the_same_rows(layout, id_type):
    rows = [r if r is None else [min(x, 30000) for x in r] for r in _ROWS]
    ids = pa.array(rows, pa.list_(id_type))
    field = layout_field("input_ids", id_type, layout, {b"tokenloom.tokenizer": b"{}"})
    col = to_layout(ids, layout)
    assert col.type == field.type and layout_name(field) == layout
    assert token_dtype(field) == np.dtype(id_type.to_pandas_dtype())
    assert as_token_lists(col, field).to_pylist() == rows
    for lo in range(len(rows)):  # a slice (a chunk of a take) keeps its own rows only
        got = token_lists(col.slice(lo), field)
        want = [r or [] for r in rows[lo:]]
        assert got.lengths.tolist() == [len(r) for r in want]
        assert got.used.tolist() == [x for r in want for x in r]
        assert as_token_lists(col.slice(lo), field).to_pylist() == rows[lo:]
    chunked = pa.chunked_array([col.slice(0, 2), col.slice(2)])
    assert token_lists(chunked, field).used.tolist() == [x for r in rows for x in (r or [])]
    # chunks joined one at a time (sliced ones, nulls, an empty one, one alone): the same rows
    for cuts in ([(0, 2), (2, 1), (3, 0), (3, 2)], [(1, 4)], []):
        chunks = [col.slice(a, n) for a, n in cuts]
        want = token_lists(pa.chunked_array(chunks, col.type).combine_chunks(), field)
        got = join_token_lists(chunks, field)
        assert chunks == []  # let go as they were copied
        assert got.lengths.tolist() == want.lengths.tolist()
        assert got.used.tolist() == want.used.tolist() and got.values.dtype == want.values.dtype
        nulls = None if want.valid is None else want.valid.tolist()
        assert (None if got.valid is None else got.valid.tolist()) == nulls


def test_bytes_are_little_endian_ids_with_the_type_recorded():
    field = layout_field("ids", pa.uint16(), "bytes", {})
    assert field.type == pa.large_binary()
    assert field.metadata[LAYOUT_META_KEY] == b"bytes:uint16"
    col = to_layout(pa.array([[1, 258]], pa.list_(pa.uint16())), "bytes")
    assert col.to_pylist() == [b"\x01\x00\x02\x01"]


def test_a_damaged_or_unrecorded_bytes_column_is_refused_by_name():
    field = layout_field("ids", pa.uint16(), "bytes", {})
    with pytest.raises(TokenLayoutError, match=r"'ids' \(number 1 of the 2 read\) holds 3 bytes"):
        token_lists(pa.array([b"\x01\x00", b"\x01\x00\x02"], pa.large_binary()), field)
    with pytest.raises(TokenLayoutError, match=r"column 'raw' \(large_binary\) is not a token"):
        token_dtype(pa.field("raw", pa.large_binary()))
    with pytest.raises(TokenLayoutError, match=r"records token layout 'bytes:float32'"):
        token_dtype(pa.field("x", pa.large_binary(), metadata={LAYOUT_META_KEY: b"bytes:float32"}))
    with pytest.raises(TokenLayoutError, match=r"'text' \(string\) is not a token column"):
        layout_name(pa.field("text", pa.string()))
    with pytest.raises(TokenLayoutError, match="not one of list, bytes"):
        layout_field("ids", pa.uint16(), "zip", {})


def test_the_loader_refuses_a_damaged_bytes_column_in_a_subprocess(tmp_path):
    """A ``bytes`` column whose rows are not whole ids: ``tokenloom verify`` (the loader reading
    it) exits 1 naming the column, the rule and the fix."""
    import json

    from tests.conftest import run_cli, write_jsonl
    from tokenloom.backfill import add_column, udf
    from tokenloom.ingest import ingest
    from tokenloom.tokenize import load_tokenizer

    ident = json.dumps(load_tokenizer("gpt2").identity(), sort_keys=True).encode()
    meta = {b"tokenloom.tokenizer": ident}
    write_jsonl(tmp_path / "a.jsonl", [{"text": f"row {i} text" + "s" * (i % 2)} for i in range(8)])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)

    @udf(
        inputs=["text"],
        output=pa.schema(
            [
                layout_field("input_ids", pa.uint16(), "bytes", meta),
                pa.field("n_tokens", pa.int64()),
            ]
        ),
        version="1",
    )
    def utf8_bytes(batch: pa.RecordBatch) -> dict:  # one byte per "id": odd lengths
        vals = [t.encode() for t in batch.column("text").to_pylist()]
        return {
            "input_ids": pa.array(vals, pa.large_binary()),
            "n_tokens": [len(v) // 2 for v in vals],
        }

    add_column(uri, None, utf8_bytes, workers=0)
    out = run_cli("verify", "--table", uri)
    assert out.returncode == 1, out.stderr
    assert "token column 'input_ids'" in out.stderr and "holds 11 bytes" in out.stderr
    assert "not a whole number of uint16 ids" in out.stderr
    assert "--column input_ids_2 --layout bytes" in out.stderr
