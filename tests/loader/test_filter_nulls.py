"""A filter on a column some rows hold null for: an *ingested* null follows SQL (the row is not
selected) and is counted in the output; a *derived* column not computed for appended rows is
refused with ``tokenloom refresh`` (which then has that work to do)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.backfill import add_column, udf
from tokenloom.ingest import ingest
from tokenloom.loader.pipeline.inputs import scan_plan_inputs
from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.table import Table


@udf(
    inputs=["text"],
    output={"input_ids": pa.list_(pa.uint16()), "n_tokens": pa.int64()},
    version="1",
)
def utf8_ids(batch):  # noqa: ANN001, ANN201
    ids = [list(t.encode()[:40]) for t in batch.column("text").to_pylist()]
    return [pa.array(ids, pa.list_(pa.uint16())), [len(x) for x in ids]]


@udf(inputs=["text"], output={"n_bytes": pa.int64()}, version="1")
def n_bytes(batch):  # noqa: ANN001, ANN201
    return [len(t.encode()) for t in batch.column("text").to_pylist()]


def _tokens():  # noqa: ANN202 - the test tokenizer's identity on the token column
    ident = {"name": "utf8-bytes", "vocab_size": 257, "eos_id": 256, "vocab_hash": "x"}
    meta = {b"tokenloom.tokenizer": json.dumps(ident).encode()}
    return utf8_ids.with_output(
        pa.schema(
            [
                pa.field("input_ids", pa.list_(pa.uint16()), metadata=meta),
                pa.field("n_tokens", pa.int64()),
            ]
        )
    )


@pytest.fixture
def scored(tmp_path: Path) -> str:
    """12 rows: 8 with a score (4 of them >= 1.0), 4 from a source with no score at all."""
    paras = real_paragraphs(12)
    scores = [0.5, 1.5, 2.0, 0.1, 1.0, 0.9, 3.0, 0.0]
    write_jsonl(
        tmp_path / "a.jsonl",
        [{"text": p, "score": s} for p, s in zip(paras[:8], scores, strict=True)],
    )
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paras[8:]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], uri, columns="score:float")
    add_column(uri, None, _tokens(), workers=0, progress=False)
    return uri


def test_an_ingested_null_leaves_the_row_out_and_says_so(scored: str) -> None:
    ds = Table.open(scored).dataset
    inputs = scan_plan_inputs(
        ds, token_column="input_ids", count_column="n_tokens", filter="score >= 1.0"
    )
    assert len(inputs.row_ids) == 4
    assert (inputs.filter_nulls, inputs.filter_null_columns) == (4, ("score",))
    assert inputs.left_out().startswith("4 rows left out: 'score' is null for them")
    negated = scan_plan_inputs(
        ds, token_column="input_ids", count_column="n_tokens", filter="NOT (score >= 1.0)"
    )
    assert len(negated.row_ids) == 4 and negated.filter_nulls == 4  # SQL: not kept under NOT
    every = scan_plan_inputs(ds, token_column="input_ids", count_column="n_tokens", filter=None)
    assert len(every.row_ids) == 12 and every.left_out() is None


def test_stats_and_refresh_on_an_ingested_null(scored: str) -> None:
    out = run_cli("stats", "--table", scored, "--filter", "score >= 1.0", "--seq-len", "16")
    assert out.returncode == 0, out.stderr
    assert "documents 4 " in out.stdout
    assert "4 rows left out: 'score' is null for them" in out.stdout
    assert "refresh" not in out.stdout + out.stderr
    js = run_cli("stats", "--table", scored, "--filter", "score >= 1.0", "--json")
    assert js.returncode == 0, js.stderr
    epoch = json.loads(js.stdout)["epoch"]
    assert (epoch["rows"], epoch["filter_null_rows"], epoch["filter_null_columns"]) == (
        4,
        4,
        ["score"],
    )
    again = run_cli("refresh", "--table", scored, "--workers", "0")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_a_stale_derived_column_is_still_refused_with_refresh(scored: str, tmp_path: Path) -> None:
    add_column(scored, None, n_bytes, workers=0, progress=False)
    appended = [{"text": p, "score": 5.0} for p in real_paragraphs(15)[12:]]
    write_jsonl(tmp_path / "c.jsonl", appended)
    ingest([tmp_path / "c.jsonl"], scored, columns="score:float")
    ds = Table.open(scored).dataset
    with pytest.raises(LoaderError, match="'n_bytes' is not computed for them") as err:
        scan_plan_inputs(
            ds, token_column="input_ids", count_column="n_tokens", filter="n_bytes > 10"
        )
    assert "cannot decide 3 rows" in str(err.value)
    assert f"tokenloom refresh --table {ds.uri}" in str(err.value)
    out = run_cli("stats", "--table", scored, "--filter", "n_bytes > 10 AND score >= 1.0")
    assert out.returncode == 1, out.stderr
    assert "'n_bytes' is not computed for them" in out.stderr
    assert f"`tokenloom refresh --table {ds.uri}`" in out.stderr
    # the appended rows decide an OR without n_bytes (score 5.0): nothing to refuse
    decided = scan_plan_inputs(
        ds, token_column="input_ids", count_column="n_tokens", filter="n_bytes < 0 OR score > 4",
        allow_missing=True,
    )  # fmt: skip
    assert len(decided.row_ids) == 3 and decided.filter_null_columns == ("score",)
    # both kinds at once, planned with --allow-missing: every row left out is counted
    allowed = run_cli(
        "stats", "--table", scored, "--filter", "n_bytes > 0 AND score >= 1.0",
        "--allow-missing", "--json",
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    epoch = json.loads(allowed.stdout)["epoch"]
    assert epoch["filter_null_rows"] == 4 + 3
    assert epoch["filter_null_columns"] == ["score", "n_bytes"]  # schema order


def test_verify_and_train_say_how_many_rows_a_null_left_out(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tokenloom.tokenize.column import tokenize_table

    paras = real_paragraphs(24)
    write_jsonl(tmp_path / "a.jsonl", [{"text": p, "score": 2.0} for p in paras[:18]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paras[18:]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], uri, columns="score:float")
    tokenize_table(uri, "gpt2", workers=0, roundtrip_sample=0)
    note = "6 rows left out: 'score' is null for them"
    verify = run_cli(
        "verify", "--table", uri, "--filter", "score >= 1.0", "--seq-len", "32", "--steps", "2"
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert note in verify.stdout
    train = run_cli(
        "train", "--table", uri, "--out", str(tmp_path / "run"), "--filter", "score >= 1.0",
        "--seq-len", "32", "--global-batch-size", "2", "--steps", "1",
    )  # fmt: skip
    assert train.returncode == 0, train.stderr
    assert f"data: {note}" in train.stdout


def test_a_column_no_job_computes_follows_sql_even_where_it_has_no_data(tmp_path: Path) -> None:
    """A column declared by hand before an ingest filled it: the older rows have no data file
    of it, but no job could compute them (refresh lists it as not refreshable): their nulls are
    values, so the filter leaves them out and says so."""
    import lance

    paras = real_paragraphs(6)
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paras[:3]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": p, "score": i} for i, p in enumerate(paras[3:])])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri)
    lance.dataset(uri).add_columns(pa.schema([pa.field("score", pa.float64())]))
    ingest([tmp_path / "b.jsonl"], uri, columns="score:float")
    add_column(uri, None, _tokens(), workers=0, progress=False)
    ds = Table.open(uri).dataset
    inputs = scan_plan_inputs(
        ds, token_column="input_ids", count_column="n_tokens", filter="score >= 1.0"
    )
    assert len(inputs.row_ids) == 2
    assert (inputs.filter_nulls, inputs.filter_null_columns) == (3, ("score",))
