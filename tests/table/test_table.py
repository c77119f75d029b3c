"""The table layer: creation, opening, versions, and column bytes that match the disk."""

from __future__ import annotations

import os

import lance
import pyarrow as pa
import pytest

from tests.conftest import write_jsonl
from tokenloom.errors import TableError, TableNotFoundError
from tokenloom.ingest import ingest
from tokenloom.table import BASE_SCHEMA, Table, table_info


def test_create_gives_empty_table_with_stable_row_ids(tmp_path):
    t = Table.create(tmp_path / "t.lance")
    assert t.version == 1
    assert t.count_rows() == 0
    assert t.dataset.has_stable_row_ids
    assert t.schema().names == BASE_SCHEMA.names
    assert [v.operation for v in t.versions()] == ["create"]
    with pytest.raises(TableError, match="already exists"):
        Table.create(tmp_path / "t.lance")
    assert Table.create(tmp_path / "t.lance", exist_ok=True).version == 1


def test_open_missing_and_foreign_datasets(tmp_path):
    with pytest.raises(TableNotFoundError, match="tokenloom ingest"):
        Table.open(tmp_path / "nope.lance")
    lance.write_dataset(pa.table({"x": [1, 2]}), str(tmp_path / "other.lance"))
    with pytest.raises(TableError, match="column 'id' is missing"):
        Table.open(tmp_path / "other.lance")


def _data_file_bytes_on_disk(uri: str) -> int:
    data = os.path.join(uri, "data")
    return sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))


def test_info_column_bytes_match_files_on_disk(tmp_path, paragraphs):
    src = tmp_path / "a.jsonl"
    write_jsonl(
        src, [{"text": p, "source": "docs" if i % 3 else "api"} for i, p in enumerate(paragraphs)]
    )
    uri = str(tmp_path / "t.lance")
    ingest([src], uri, progress=False)
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[:50]])
    ingest([tmp_path / "b.jsonl"], uri, progress=False)

    info = table_info(Table.open(uri))
    assert info.rows == 250
    assert info.version == 3
    assert [v.operation for v in info.versions] == ["create", "ingest", "ingest"]
    assert [v.num_rows for v in info.versions] == [0, 200, 250]
    # Every byte of every data file is either a column's or per-file overhead.
    assert info.data_file_bytes == _data_file_bytes_on_disk(uri)
    assert sum(c.bytes for c in info.columns) + info.overhead_bytes == info.data_file_bytes
    # The per-column figures agree with Lance's own accounting.
    lance_stats = {f.id: f.bytes_on_disk for f in Table.open(uri).dataset.stats.data_stats().fields}
    for fid, col in enumerate(info.columns):
        assert col.bytes == lance_stats[fid], col.name
    text_col = next(c for c in info.columns if c.name == "text")
    assert text_col.bytes == max(c.bytes for c in info.columns) > 0  # (Lance compresses it)
    assert info.rows_per_source == {"docs": 133, "b": 50, "api": 67}
    assert info.to_json()["versions"][0]["operation"] == "create"


def test_old_versions_stay_readable_and_ids_are_never_reused(tmp_path, paragraphs):
    uri = str(tmp_path / "t.lance")
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:10]])
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    ds = lance.dataset(uri)
    ds.delete("id >= 7")  # delete the newest rows: their ids must not come back
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[10:13]])
    result = ingest([tmp_path / "b.jsonl"], uri, progress=False)
    assert (result.first_id, result.last_id) == (10, 12)
    t = Table.open(uri)
    assert sorted(t.dataset.to_table(columns=["id"])["id"].to_pylist()) == [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        10,
        11,
        12,
    ]
    assert Table.open(uri, version=2).count_rows() == 10  # the old version is untouched
    assert t.versions()[2].operation == "delete"
