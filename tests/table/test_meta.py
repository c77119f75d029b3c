"""tokenloom's table metadata lives in the ``id`` field: it round-trips, old tables (keys at the
schema level) are read and moved, and LanceDB's own reader opens tokenloom tables."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import NEXT_ID_KEY, Table
from tokenloom.table.journal import referenced_files
from tokenloom.table.meta import table_metadata, with_table_metadata
from tokenloom.table.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY


def _ingest(tmp_path, uri, texts: list[str], name: str) -> None:
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(path, [{"text": t} for t in texts])
    ingest([path], uri, progress=False)


def _lancedb_ids(uri) -> list[int]:
    """Every ``id`` as ``lancedb.streaming.StreamingDataset`` delivers them (shuffled; one
    row at a time without packing)."""
    lancedb = pytest.importorskip("lancedb")
    from lancedb.streaming import StreamingDataset

    db = lancedb.connect(os.path.dirname(uri))
    table = db.open_table(os.path.basename(uri).removesuffix(".lance"))
    ds = StreamingDataset(table, num_splits=1, shuffle=True, shuffle_seed=0, columns=["id"])
    return sorted(int(row["id"]) for row in ds)


def test_keys_live_in_the_id_field_and_lancedb_reads_the_table(tmp_path, paragraphs):
    uri = str(tmp_path / "t.lance")
    _ingest(tmp_path, uri, paragraphs[:30], "a")
    table = Table.open(uri)
    assert not table.dataset.schema.metadata  # nothing at the schema level
    meta = table.metadata()
    assert meta[SCHEMA_VERSION_KEY] == SCHEMA_VERSION
    assert meta[NEXT_ID_KEY] == "30"
    listed = json.loads(meta["tokenloom.ingest_files"])
    assert len(listed) == 1 and listed[0] in referenced_files(table)
    assert _lancedb_ids(uri) == list(range(30))


def test_old_table_with_schema_level_keys_is_read_then_moved(tmp_path, paragraphs):
    uri = str(tmp_path / "old.lance")
    _ingest(tmp_path, uri, paragraphs[:10], "a")
    ds = Table.open(uri).dataset
    # What tables written before looked like: every key at the schema level, none in the field.
    keys = Table.open(uri).metadata() | {NEXT_ID_KEY: "25", "other.tool": "kept"}
    ds.update_field_metadata({"id": {}}, replace=True)
    ds.update_schema_metadata(keys, replace=True)
    old = Table.open(uri)
    assert old.dataset.schema.field("id").metadata is None
    assert old.metadata()[NEXT_ID_KEY] == "25"  # read from the schema level
    old_listed = json.loads(old.metadata()["tokenloom.ingest_files"])
    assert set(old_listed) <= referenced_files(old)

    _ingest(tmp_path, uri, paragraphs[10:15], "b")  # ids continue from the old mark
    new = Table.open(uri)
    assert sorted(new.dataset.to_table(columns=["id"])["id"].to_pylist()) == [
        *range(10),
        *range(25, 30),
    ]
    assert new.dataset.schema.metadata == {b"other.tool": b"kept"}  # only foreign keys stay
    meta = new.metadata()
    assert meta[NEXT_ID_KEY] == "30" and meta[SCHEMA_VERSION_KEY] == SCHEMA_VERSION
    listed = json.loads(meta["tokenloom.ingest_files"])
    assert listed[: len(old_listed)] == old_listed and len(listed) == len(old_listed) + 1
    assert set(listed) <= referenced_files(new)


def test_with_table_metadata_keeps_field_ids_and_other_fields(tmp_path, paragraphs):
    uri = str(tmp_path / "t.lance")
    _ingest(tmp_path, uri, paragraphs[:5], "a")
    ds = Table.open(uri).dataset
    ds.add_columns({"twice": "id * 2", "gone": "id + 1"})
    ds.drop_columns(["twice"])  # field ids are no longer Lance's plain numbering
    before = Table.open(uri).dataset.lance_schema
    after = with_table_metadata(before, {"tokenloom.x": "é\x00{}", NEXT_ID_KEY: "7"})
    assert [(f.name(), f.id()) for f in after.fields()] == [
        (f.name(), f.id()) for f in before.fields()
    ]
    arrow_before, arrow_after = before.to_pyarrow(), after.to_pyarrow()
    assert arrow_after.remove_metadata().equals(arrow_before.remove_metadata())
    meta = table_metadata(arrow_after)
    assert meta["tokenloom.x"] == "é\x00{}" and meta[NEXT_ID_KEY] == "7"
    assert meta[SCHEMA_VERSION_KEY] == SCHEMA_VERSION
