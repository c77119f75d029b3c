"""The whole pipeline on a real S3 API: ingest (inputs from the bucket) → dedup → tokenize →
train (tiny) → trace → index → search, through the CLI, with nothing written to the current
directory."""

from __future__ import annotations

import json
import os
import re

import pytest
import zstandard
from click.testing import CliRunner

from tests.conftest import real_paragraphs
from tests.s3.conftest import invoke_ok, jsonl_bytes, put_object, so_args
from tokenloom.cli.main import cli

torch = pytest.importorskip("torch")


def test_pipeline_end_to_end_on_s3(s3_server, s3_prefix, bare_cwd, tmp_path, monkeypatch):
    cwd = bare_cwd
    paras = real_paragraphs(60)
    raw = f"{s3_prefix}/raw"
    put_object(s3_server, f"{raw}/a.jsonl", jsonl_bytes([{"text": t} for t in paras[:30]]))
    put_object(
        s3_server,
        f"{raw}/b.jsonl.zst",
        zstandard.ZstdCompressor().compress(
            jsonl_bytes([{"text": t} for t in paras[30:]] + [{"text": paras[0]}, {"nope": 1}])
        ),
    )
    table = f"{s3_prefix}/corpus.lance"
    so = so_args(s3_server)

    out = invoke_ok(
        ["ingest", f"{raw}/a.jsonl", f"{raw}/b.jsonl.zst", "--table", table, "--json", *so]
    )
    res = json.loads(out)
    assert res["rows_written"] == 61 and res["rejected"] == {"missing_text_field": 1}
    assert res["rejects_path"].startswith(f"{table}/_tokenloom/rejects/")

    out = invoke_ok(["dedup", "--table", table, "--workers", "0", "--json", *so])
    assert json.loads(out)["flagged"] == 1
    invoke_ok(["tokenize", "--table", table, "--tokenizer", "gpt2", "--workers", "0", *so])
    status = invoke_ok(["backfill", "status", "--table", table, *so])
    assert "committed" in status
    info = json.loads(invoke_ok(["info", "--table", table, "--json", *so]))
    names = {c["name"] for c in info["columns"]}
    assert {"is_dup", "input_ids", "n_tokens"} <= names

    run = str(tmp_path / "run")
    invoke_ok([
        "train", "--table", table, "--out", run, "--seq-len", "32", "--global-batch-size", "2",
        "--steps", "3", "--filter", "NOT is_dup", "--log-every", "1", "--eval-every", "100",
        "--checkpoint-every", "100", *so,
    ])  # fmt: skip
    record = json.loads((tmp_path / "run" / "last.json").read_text())
    assert json.dumps(record).count("aws_secret_access_key") == 0  # credentials never recorded
    assert record["loader"]["table"] == table

    trace = json.loads(invoke_ok(["trace", "--checkpoint", run, "--step", "2", "--json", *so]))
    assert trace["rows"] and trace["table"] == table

    invoke_ok(["index", "--table", table, "--no-vector", *so])
    word = max(re.findall(r"[A-Za-z]{6,}", paras[5]), key=len)
    hits = json.loads(invoke_ok(["search", "--table", table, word, "--json", *so]))
    assert 5 in [h["id"] for h in hits["hits"]], (word, hits)

    assert os.listdir(cwd) == []  # nothing written to the current directory


def test_aws_environment_alone_reaches_the_table(s3_server, s3_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    put_object(s3_server, f"{s3_prefix}/in.jsonl", jsonl_bytes([{"text": "hello s3 world"}]))
    table = f"{s3_prefix}/t.lance"
    out = json.loads(invoke_ok(["ingest", f"{s3_prefix}/in.jsonl", "--table", table, "--json"]))
    assert out["rows_written"] == 1
    assert json.loads(invoke_ok(["info", "--table", table, "--json"]))
    assert os.listdir(tmp_path) == []


def test_bad_storage_option_is_a_usage_error():
    out = CliRunner().invoke(cli, ["info", "--table", "s3://b/t", "--storage-options", "novalue"])
    assert out.exit_code == 2 and "KEY=VALUE" in out.output
