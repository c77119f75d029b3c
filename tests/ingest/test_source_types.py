"""Parquet/Arrow numeric columns keep their source type (a float32 score stays float32); shards
that disagree are promoted to a type holding both, or refused naming both files."""

from __future__ import annotations

import json

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli, write_jsonl
from tokenloom.ingest.columns import promote_numeric


def _shard(path, **columns) -> None:
    n = len(next(iter(columns.values())))
    cols = {"text": pa.array([f"doc {path.name} {i}" for i in range(n)]), **columns}
    pq.write_table(pa.table(cols), path)


def _ingest(*args: str) -> dict:
    out = run_cli("ingest", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_float32_and_int32_keep_their_type(tmp_path):
    _shard(
        tmp_path / "a.parquet",
        score=pa.array([0.5, 1.25, None], pa.float32()),
        n=pa.array([1, -7, 2**31 - 1], pa.int32()),
        u=pa.array([0, 255, 3], pa.uint8()),
        h=pa.array([0.5, 2.0, 1.0], pa.float16()),
    )
    uri = str(tmp_path / "t.lance")
    out = _ingest(str(tmp_path / "a.parquet"), "--table", uri, "--columns", "score:float,n,u,h")
    assert out["rows_written"] == 3 and out["rejected"] == {}
    schema = lance.dataset(uri).schema
    assert [schema.field(c).type for c in ("score", "n", "u", "h")] == [
        pa.float32(), pa.int32(), pa.uint8(), pa.float16(),
    ]  # fmt: skip
    got = lance.dataset(uri).to_table(columns=["score", "n", "u"]).to_pydict()
    assert got == {"score": [0.5, 1.25, None], "n": [1, -7, 2**31 - 1], "u": [0, 255, 3]}
    # a later JSONL ingest fills the same columns; a value outside the type is a counted reject
    write_jsonl(
        tmp_path / "b.jsonl",
        [{"text": "ok", "n": 5, "u": 9, "score": 2.5}, {"text": "big", "n": 2**31, "u": 1},
         {"text": "neg", "u": -1}, {"text": "huge", "score": 1e300}],
    )  # fmt: skip
    more = _ingest(str(tmp_path / "b.jsonl"), "--table", uri)
    assert more["rows_written"] == 1 and more["rejected"] == {"bad_column_value": 3}
    details = [json.loads(line)["detail"] for line in open(more["rejects_path"])]
    assert any("2147483648 does not fit the column's type int32" in d for d in details)
    assert any("-1 does not fit the column's type uint8" in d for d in details)
    assert any("does not fit the column's type float" in d for d in details)
    assert lance.dataset(uri).schema.field("n").type == pa.int32()


def test_shards_that_disagree_are_promoted_safely(tmp_path):
    _shard(tmp_path / "a.parquet", n=pa.array([1, 2], pa.int32()), s=pa.array([1, 2], pa.int16()))
    _shard(
        tmp_path / "b.parquet",
        n=pa.array([2**40, 3], pa.int64()),
        s=pa.array([0.5, 1.5], pa.float32()),
    )
    uri = str(tmp_path / "t.lance")
    out = _ingest(
        str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--table", uri, "--columns", "n,s"
    )
    assert out["rows_written"] == 4 and out["rejected"] == {}
    ds = lance.dataset(uri)
    assert ds.schema.field("n").type == pa.int64() and ds.schema.field("s").type == pa.float32()
    got = ds.to_table(columns=["n", "s"]).to_pydict()
    assert sorted(got["n"]) == [1, 2, 3, 2**40] and sorted(got["s"]) == [0.5, 1, 1.5, 2]


def test_shards_with_no_common_type_are_refused_naming_both(tmp_path):
    _shard(tmp_path / "a.parquet", n=pa.array([1], pa.int64()))
    _shard(tmp_path / "b.parquet", n=pa.array([2**64 - 1], pa.uint64()))
    uri = tmp_path / "t.lance"
    out = run_cli(
        "ingest", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--table", str(uri),
        "--columns", "n",
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "column 'n' is int64 in a.parquet but uint64 in b.parquet: no integer type" in (
        out.stderr
    )
    assert not uri.exists()


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        (pa.int32(), pa.int64(), pa.int64()),
        (pa.int32(), pa.uint32(), pa.int64()),
        (pa.uint8(), pa.int8(), pa.int16()),
        (pa.uint16(), pa.uint32(), pa.uint32()),
        (pa.int16(), pa.float32(), pa.float32()),
        (pa.int32(), pa.float32(), pa.float64()),
        (pa.uint16(), pa.float16(), pa.float32()),
        (pa.int64(), pa.float16(), pa.float64()),
        (pa.float16(), pa.float32(), pa.float32()),
        (pa.uint64(), pa.int8(), None),
        (pa.uint32(), pa.int64(), pa.int64()),
    ],
)
def test_promotion_holds_both_or_refuses(a, b, both):
    assert promote_numeric(a, b) == both and promote_numeric(b, a) == both
