"""Tokenizing a table: ids + counts as columns, the tokenizer pinned, nothing rewritten."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from tests.conftest import write_jsonl
from tokenloom.cli.main import cli
from tokenloom.ingest import ingest
from tokenloom.table import Table, table_info
from tokenloom.tokenize import load_tokenizer
from tokenloom.tokenize.column import tokenize_table


@pytest.fixture
def table(tmp_path, corpus):
    texts = corpus.pick(wiki_en=30, wiki_fr=20, kjv=5, python_stdlib=5, shakespeare_folio=1)
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    return uri, texts


def test_gpt2_column_with_counts_identity_and_roundtrip(table):
    uri, texts = table
    before = set(os.listdir(os.path.join(uri, "data")))
    res = tokenize_table(uri, "gpt2", workers=2, roundtrip_sample=1000)
    assert res.roundtrip_checked == len(texts) and res.roundtrip_failures == []
    t = Table.open(uri)
    field = t.schema().field("input_ids")
    assert str(field.type) == "list<item: uint16>"
    ident = json.loads(field.metadata[b"tokenloom.tokenizer"])
    assert ident["name"] == "gpt2" and ident["eos_id"] == 50256 and ident["vocab_size"] == 50257
    tok = load_tokenizer("gpt2")
    rows = t.dataset.to_table(columns=["id", "text", "input_ids", "n_tokens"]).to_pylist()
    for r in rows[:10]:
        assert r["input_ids"] == tok.encode(r["text"]) and r["n_tokens"] == len(r["input_ids"])
    assert res.tokens == sum(r["n_tokens"] for r in rows)
    # the ids column costs at most 5% over its raw size, and no old file was touched
    info = table_info(t)
    ids_bytes = next(c.bytes for c in info.columns if c.name == "input_ids")
    assert ids_bytes <= 1.05 * res.tokens * 2
    assert before <= set(os.listdir(os.path.join(uri, "data")))


def test_second_tokenizer_side_by_side_via_cli(tmp_path, table):
    uri, _ = table
    runner = CliRunner()
    out = runner.invoke(
        cli,
        [
            "tokenizer",
            "train",
            "--table",
            uri,
            "--vocab-size",
            "600",
            "--out",
            str(tmp_path / "bpe"),
        ],
    )
    assert out.exit_code == 0, out.output
    out = runner.invoke(
        cli,
        [
            "tokenize",
            "--table",
            uri,
            "--tokenizer",
            str(tmp_path / "bpe"),
            "--column",
            "input_ids_bpe",
            "--workers",
            "0",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert res["count_column"] == "n_tokens_bpe" and res["roundtrip_failures"] == []
    out = runner.invoke(cli, ["tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0"])
    assert out.exit_code == 0 and "round-trip" in out.output
    names = Table.open(uri).schema().names
    assert {"input_ids", "n_tokens", "input_ids_bpe", "n_tokens_bpe"} <= set(names)
    stats = runner.invoke(
        cli, ["stats", "--table", uri, "--column", "input_ids_bpe", "--seq-len", "256", "--json"]
    )
    assert stats.exit_code == 0, stats.output
    data = json.loads(stats.output)
    assert data["documents"] == 61 and data["seq_len"] == 256
    text = runner.invoke(cli, ["stats", "--table", uri, "--plot", str(tmp_path / "h.png")])
    assert text.exit_code == 0 and "packing keeps 100%" in text.output
    assert (tmp_path / "h.png").stat().st_size > 1000
