"""Typed columns at ingest, through the CLI: real types, filterable, bytes never a repr string."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import lance
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from tests.conftest import write_jsonl
from tokenloom.cli.main import cli

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40  # binary, not UTF-8


def _ingest(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["ingest", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _parquet(path, rows) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_parquet_binary_is_a_blob_column_and_declared_fields_are_typed(tmp_path):
    _parquet(
        tmp_path / "caps.parquet",
        [
            {"text": "a cat", "image": JPEG, "score": 3.5, "lang": "en", "w": 7},
            {"text": "a dog", "image": JPEG[:100], "score": 1.0, "lang": "fr", "w": 8},
        ],
    )
    uri = str(tmp_path / "t.lance")
    out = _ingest(str(tmp_path / "caps.parquet"), "--table", uri, "--columns", "score,lang:string")
    assert out["rows_written"] == 2 and out["rejected"] == {}
    ds = lance.dataset(uri)
    assert ds.schema.field("score").type == pa.float64()
    assert ds.schema.field("lang").type == pa.string()
    image = ds.schema.field("image")
    assert image.type == pa.large_binary()
    assert image.metadata[b"lance-encoding:blob"] == b"true"
    assert ds.to_table(filter="score >= 3", columns=["text"])["text"].to_pylist() == ["a cat"]
    blobs = ds.take_blobs("image", indices=[0, 1])
    assert [b.read() for b in blobs] == [JPEG, JPEG[:100]]
    metas = [json.loads(m) for m in ds.to_table(columns=["meta"])["meta"].to_pylist()]
    assert [m["w"] for m in metas] == [7, 8]
    assert not any("image" in m or "score" in m for m in metas)  # promoted, not duplicated
    assert "b'\\\\x" not in json.dumps(metas)


def test_jsonl_columns_convert_or_reject_and_stay_typed_in_later_ingests(tmp_path):
    write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"text": "one", "score": 4, "img": base64.b64encode(JPEG).decode()},
            {"text": "two", "score": "2.5"},
            {"text": "bad score", "score": "high"},
            {"text": "bad bytes", "img": "not base64!"},
        ],
    )
    uri = str(tmp_path / "t.lance")
    out = _ingest(str(tmp_path / "a.jsonl"), "--table", uri, "--columns", "score:float,img:binary")
    assert out["rows_written"] == 2
    assert out["rejected"] == {"bad_column_value": 2}
    rejects = [json.loads(line) for line in open(out["rejects_path"])]
    assert {r["reason"] for r in rejects} == {"bad_column_value"}
    assert any("'score'" in r["detail"] for r in rejects)
    ds = lance.dataset(uri)
    t = ds.to_table(columns=["score", "img"])
    assert t["score"].to_pylist() == [4.0, 2.5]
    assert t["img"].to_pylist() == [JPEG, None]
    # A later ingest without --columns still fills the typed column (it is sticky).
    write_jsonl(tmp_path / "b.jsonl", [{"text": "three", "score": 9}])
    _ingest(str(tmp_path / "b.jsonl"), "--table", uri)
    ds = lance.dataset(uri)
    assert ds.to_table(filter="score > 5", columns=["text"])["text"].to_pylist() == ["three"]


def test_type_conflicts_and_bad_specs_are_one_clear_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "one", "score": 4}])
    uri = str(tmp_path / "t.lance")
    _ingest(str(tmp_path / "a.jsonl"), "--table", uri, "--columns", "score:float")
    write_jsonl(tmp_path / "b.jsonl", [{"text": "two", "score": 4}])
    runner = CliRunner()
    for spec, words in [
        ("score:string", "already a float column"),
        ("score:complex", "unknown type"),
        ("text:string", "base column"),
        ("a-b:int", "a-b"),
        ("nokind", "has no type"),
    ]:
        args = ["ingest", str(tmp_path / "b.jsonl"), "--table", uri, "--columns", spec]
        r = runner.invoke(cli, args)
        assert r.exit_code == 1, (spec, r.output)
        assert words in str(r.exception), (spec, r.exception)
    # Through the real process: exit status 1 and one line naming the fix.
    proc = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", *args[:-1], "score:string"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: column 'score' is already a float column of the table, but this ingest makes "
        "it string; pass --columns score:float"
    ]


def test_nested_bytes_in_meta_are_base64_not_a_repr(tmp_path):
    _parquet(tmp_path / "n.parquet", [{"text": "x", "info": {"raw": b"\x00\xff"}}])
    uri = str(tmp_path / "t.lance")
    _ingest(str(tmp_path / "n.parquet"), "--table", uri)
    meta = json.loads(lance.dataset(uri).to_table(columns=["meta"])["meta"][0].as_py())
    assert meta["info"]["raw"] == {"$base64": base64.b64encode(b"\x00\xff").decode()}
