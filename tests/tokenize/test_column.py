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


def test_bytes_layout_holds_the_same_ids_counts_and_cut_points(table):
    """``--layout bytes`` stores the ids as raw bytes (the layout recorded on the field); every
    reader sees the list column's ids, counts, line boundaries and unigram entropy."""
    from tokenloom.stats.entropy import unigram_entropy
    from tokenloom.table.tokens import LAYOUT_META_KEY, as_token_lists
    from tokenloom.tokenize.boundaries import add_boundaries

    uri, texts = table
    res = tokenize_table(uri, "gpt2", column="input_ids", layout="bytes", roundtrip_sample=1000)
    assert res.roundtrip_checked == len(texts) and res.roundtrip_failed == 0
    tokenize_table(uri, "gpt2", column="input_ids_l", roundtrip_sample=0)
    add_boundaries(uri, "input_ids")
    add_boundaries(uri, "input_ids_l")
    t = Table.open(uri)
    field = t.schema().field("input_ids")
    assert str(field.type) == "large_binary" and field.metadata[LAYOUT_META_KEY] == b"bytes:uint16"
    data = t.dataset.to_table()
    ids = as_token_lists(data.column("input_ids"), field).to_pylist()
    assert ids == data.column("input_ids_l").to_pylist() and any(ids)
    for a, b in (("n_tokens", "n_tokens_l"), ("cut_points", "cut_points_l")):
        assert data.column(a).to_pylist() == data.column(b).to_pylist()
    assert unigram_entropy(t, "input_ids") == unigram_entropy(t, "input_ids_l")
    # tokenizing again keeps the layout (a refresh after an append runs the same way)
    again = tokenize_table(uri, "gpt2", column="input_ids", roundtrip_sample=0)
    assert again.version is None


def test_a_layout_other_than_the_columns_is_refused_in_a_subprocess(table):
    from tests.conftest import run_cli

    uri, _ = table
    tokenize_table(uri, "gpt2", roundtrip_sample=0)
    version = Table.open(uri).version
    out = run_cli("tokenize", "--table", uri, "--tokenizer", "gpt2", "--layout", "bytes")
    assert out.returncode == 1, out.stderr
    assert "column 'input_ids' is stored in the 'list' token layout, not 'bytes'" in out.stderr
    assert "--column input_ids_bytes --layout bytes" in out.stderr
    assert Table.open(uri).version == version  # nothing committed
    bad = run_cli("tokenize", "--table", uri, "--tokenizer", "gpt2", "--layout", "zip")
    assert bad.returncode == 2 and "--layout" in bad.stderr
