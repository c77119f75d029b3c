"""``refresh``, ``verify`` and ``gc`` on an ``s3://`` table through the CLI, reaching the store
with ``--storage-options`` alone (no ``AWS_*`` environment), and writing nothing to the current
directory."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from tests.conftest import real_paragraphs
from tests.s3.conftest import put_object, so_args
from tokenloom.cli.main import cli
from tokenloom.table.storage import exists

pytest.importorskip("torch")


def _jsonl(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _invoke(args: list[str]) -> str:
    out = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def test_refresh_verify_gc_on_s3(s3_server, s3_prefix, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    paras = real_paragraphs(50)
    put_object(s3_server, f"{s3_prefix}/raw/a.jsonl", _jsonl([{"text": t} for t in paras[:40]]))
    put_object(s3_server, f"{s3_prefix}/raw/b.jsonl", _jsonl([{"text": t} for t in paras[40:]]))
    table = f"{s3_prefix}/t.lance"
    so = so_args(s3_server)
    _invoke(["ingest", f"{s3_prefix}/raw/a.jsonl", "--table", table, *so])
    _invoke(["tokenize", "--table", table, "--tokenizer", "gpt2", "--workers", "0", *so])
    _invoke(["ingest", f"{s3_prefix}/raw/b.jsonl", "--table", table, *so])

    res = json.loads(_invoke(["refresh", "--table", table, "--workers", "0", "--json", *so]))
    assert res["rows"] == 50 and res["not_refreshable"] == {}
    assert [s["rows_missing"] for s in res["steps"]] == [10]
    assert "input_ids" in res["steps"][0]["columns"]

    report = json.loads(
        _invoke(["verify", "--table", table, "--seq-len", "64", "--steps", "2", "--json", *so])
    )
    assert report["passed"] and len(report["checks"]) == 5

    orphan = f"{table}/data/left-behind.lance"
    put_object(s3_server, orphan, b"x" * 100)
    dry = json.loads(_invoke(["gc", "--table", table, "--json", *so]))
    assert dry["dry_run"] and [(i["kind"], i["path"], i["bytes"]) for i in dry["items"]] == [
        ("orphan", orphan, 100)
    ]
    assert exists(orphan, s3_server.storage_options)
    done = json.loads(_invoke(["gc", "--table", table, "--yes", "--json", *so]))
    assert [i["path"] for i in done["items"]] == [orphan]
    assert not exists(orphan, s3_server.storage_options)
    assert json.loads(_invoke(["gc", "--table", table, "--json", *so]))["items"] == []
    # every version's files survived: the table still reads
    again = json.loads(_invoke(["verify", "--table", table, "--seq-len", "64", "--json", *so]))
    assert again["passed"]
    assert list(cwd.iterdir()) == []
