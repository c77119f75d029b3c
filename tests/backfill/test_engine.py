"""add_column end to end: one version, no rewrite, deletes, appends, errors, filters, Ray."""

from __future__ import annotations

import hashlib
import os

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.backfill.udfs import Splitter, fails_on_13, fails_on_13_fixed, n_words
from tests.conftest import write_jsonl
from tokenloom.backfill import BackfillError, UDFError, add_column
from tokenloom.ingest import ingest
from tokenloom.table import Table, table_info


@pytest.fixture
def table(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:150]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    return uri


def _files(uri: str) -> dict[str, str]:
    data = os.path.join(uri, "data")
    return {
        name: hashlib.sha256(open(os.path.join(data, name), "rb").read()).hexdigest()
        for name in os.listdir(data)
    }


def _expected_n_words(uri: str) -> dict[int, int]:
    t = Table.open(uri).dataset.to_table(columns=["id", "text"])
    counts = n_words(t).column(0).to_pylist()
    return dict(zip(t["id"].to_pylist(), counts, strict=True))


def _column(uri: str, name: str) -> dict[int, object]:
    t = Table.open(uri).dataset.to_table(columns=["id", name])
    return dict(zip(t["id"].to_pylist(), t[name].to_pylist(), strict=True))


def test_adds_one_version_and_only_the_column_bytes(table):
    before = _files(table)
    v0 = Table.open(table).version
    result = add_column(table, "n_words", n_words, workers=2, unit_rows=40)
    assert result.version == v0 + 1 and result.units == 8 and result.rows == 150  # 4 per worker
    after = _files(table)
    assert {k: v for k, v in after.items() if k in before} == before  # old files untouched
    added = set(after) - set(before)
    assert len(added) == 1
    added_bytes = sum(os.path.getsize(os.path.join(table, "data", f)) for f in added)
    assert result.bytes_added == added_bytes
    info = table_info(Table.open(table))
    col = next(c for c in info.columns if c.name == "n_words")
    ds = Table.open(table).dataset
    field_id = next(f.id() for f in ds.lance_schema.fields() if f.name() == "n_words")
    new_file = next(df for fr in ds.get_fragments() for df in fr.metadata.files if df.path in added)
    assert list(new_file.fields) == [field_id]  # the new file holds only the new column
    assert 0 < col.bytes <= added_bytes
    assert _column(table, "n_words") == _expected_n_words(table)
    assert Table.open(table, version=v0).schema().names[-1] == "meta"  # old version unchanged
    assert Table.open(table).versions()[-1].operation == "backfill"


def test_deleted_rows_and_incremental_append(tmp_path, table, paragraphs):
    lance.dataset(table).delete("id % 7 = 3")
    first = add_column(table, "n_words", n_words, workers=0, unit_rows=25)
    assert first.rows == 150 - len([i for i in range(150) if i % 7 == 3])
    assert _column(table, "n_words") == _expected_n_words(table)

    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[150:190]])
    ingest([tmp_path / "b.jsonl"], table, progress=False)
    assert Table.open(table).count_rows("n_words IS NULL") == 40
    before = _files(table)
    second = add_column(table, "n_words", n_words, workers=2, unit_rows=25)
    assert second.rows == 40 and second.version == first.version + 2
    assert len(second.fragments) == 1
    assert {k: v for k, v in _files(table).items() if k in before} == before
    assert _column(table, "n_words") == _expected_n_words(table)
    assert Table.open(table).count_rows("n_words IS NULL") == 0
    again = add_column(table, "n_words", n_words, workers=2)
    assert again.version is None  # nothing left to do


def test_class_udf_with_list_output_incremental(tmp_path, table, paragraphs):
    split = Splitter.bind(lower=True)
    add_column(table, None, split, workers=2, unit_rows=50)
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[150:160]])
    ingest([tmp_path / "b.jsonl"], table, progress=False)
    add_column(table, None, split, workers=0)
    t = Table.open(table).dataset.to_table(columns=["id", "text", "words", "first_char"])
    expected = split(t)
    assert t["words"].to_pylist() == expected["words"].to_pylist()
    assert t["first_char"].to_pylist() == expected["first_char"].to_pylist()


def test_failing_udf_names_the_row_and_commits_nothing(table):
    version = Table.open(table).version
    with pytest.raises(UDFError, match=r"fails_on_13 v1 failed on row id 13: ValueError"):
        add_column(table, "checked", fails_on_13, workers=2, unit_rows=30)
    assert Table.open(table).latest_version == version
    assert "checked" not in Table.open(table).schema().names
    fixed = add_column(table, "checked", fails_on_13_fixed, workers=2, unit_rows=30)
    assert fixed.version == version + 1 and fixed.units_reused == 0
    assert _column(table, "checked") == {i: i for i in range(150)}


def test_where_leaves_other_rows_null(table):
    add_column(table, "n_words", n_words, workers=0, where="id % 2 = 0")
    col = _column(table, "n_words")
    expected = _expected_n_words(table)
    assert all(col[i] == (expected[i] if i % 2 == 0 else None) for i in col)


def test_refuses_bad_requests(table):
    add_column(table, "n_words", n_words, workers=0)

    from tokenloom.backfill import udf

    other = udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="9")(
        lambda b: pc.utf8_length(b.column("text")).cast(pa.int32())
    )
    with pytest.raises(BackfillError, match="was computed by n_words v1"):
        add_column(table, "n_words", other, workers=0)
    missing = udf(inputs=["body"], output=pa.field("y", pa.int32()), version="1")(lambda b: b)
    with pytest.raises(BackfillError, match=r"reads column\(s\) \['body'\]"):
        add_column(table, "y", missing, workers=0)
