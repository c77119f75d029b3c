"""``--text-field doc.text``: a dotted path into nested JSON objects and Parquet structs; where
the path breaks, the record is a counted rejection naming the level, never a silent loss."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import run_cli, write_jsonl
from tokenloom.table import Table


def _rows(uri: str) -> list[dict]:
    data = Table.open(uri).dataset.to_table(columns=["id", "text", "meta"])
    return data.sort_by("id").to_pylist()


def test_a_dotted_text_field_reaches_into_jsonl_objects_and_parquet_structs(tmp_path, paragraphs):
    write_jsonl(
        tmp_path / "nested.jsonl",
        [
            {"doc": {"text": paragraphs[0], "lang": "en"}, "url": "u0"},
            {"doc": {"lang": "en"}, "url": "u1"},  # no text under doc
            {"doc": "flat string", "url": "u2"},  # doc is not an object
            {"doc": {"text": 17}, "url": "u3"},  # not a string
            {"url": "u4"},  # no doc at all
            {"doc.text": paragraphs[1]},  # a flat key named like the whole path wins
            {"doc": {"text": paragraphs[2]}, "url": "u6"},
        ],
    )
    docs = pa.array(
        [{"text": paragraphs[3], "lang": "en"}, None, {"text": None, "lang": "fr"},
         {"text": paragraphs[4], "lang": "de"}],
        type=pa.struct([("text", pa.string()), ("lang", pa.string())]),
    )  # fmt: skip
    pq.write_table(pa.table({"doc": docs, "n": [0, 1, 2, 3]}), tmp_path / "nested.parquet")
    uri = str(tmp_path / "t.lance")
    out = run_cli(
        "ingest", str(tmp_path / "nested.jsonl"), str(tmp_path / "nested.parquet"),
        "--table", uri, "--text-field", "doc.text", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["rows_written"] == 5 and res["records_seen"] == 11
    assert res["rejected"] == {"missing_text_field": 3, "non_string_text": 1, "null_text": 2}
    rows = _rows(uri)
    assert [r["text"] for r in rows] == paragraphs[:5]
    metas = [json.loads(r["meta"]) for r in rows]
    # the text left its parent (stored once); the rest of the parent stays in meta
    assert metas[0] == {"doc": {"lang": "en"}, "url": "u0", "_file": "nested.jsonl", "_line": 1}
    assert metas[3] == {"doc": {"lang": "en"}, "n": 0, "_file": "nested.parquet", "_row": 0}
    logged = [json.loads(line) for line in open(res["rejects_path"], encoding="utf-8")]
    by_where = {(r.get("line"), r.get("row")): r for r in logged}
    assert "no 'text' key under 'doc'" in by_where[(2, None)]["detail"]
    assert "'doc' is str, not an object" in by_where[(3, None)]["detail"]
    assert by_where[(4, None)]["reason"] == "non_string_text"
    assert "no 'doc' key in the record" in by_where[(5, None)]["detail"]
    assert by_where[(None, 1)]["reason"] == "null_text"  # a null struct: its text is null
    assert by_where[(None, 2)]["reason"] == "null_text"


def test_a_path_missing_from_every_record_fails_with_the_reason(tmp_path, paragraphs):
    pq.write_table(
        pa.table({"doc": pa.array([{"body": p} for p in paragraphs[:3]])}), tmp_path / "p.parquet"
    )
    uri = str(tmp_path / "t.lance")
    out = run_cli("ingest", str(tmp_path / "p.parquet"), "--table", uri, "--text-field", "doc.text")
    assert out.returncode == 1
    assert "missing_text_field=3" in out.stderr
    logged = [json.loads(line) for line in open(next((tmp_path / "t.lance.rejects").iterdir()))]
    assert logged[0]["count"] == 3
    assert "struct 'doc' has no 'text' field (fields: body)" in logged[0]["detail"]
    assert not Table.exists(uri)
