"""``refresh``, ``verify`` and ``gc`` on an ``s3://`` table through the CLI, reaching the store
with ``--storage-options`` alone (no ``AWS_*`` environment), and writing nothing to the current
directory."""

from __future__ import annotations

import json

import pytest

from tests.conftest import real_paragraphs
from tests.s3.conftest import invoke_ok, jsonl_bytes, put_object, so_args
from tokenloom.table.storage import exists

pytest.importorskip("torch")


def test_refresh_verify_gc_on_s3(s3_server, s3_prefix, bare_cwd, tmp_path, monkeypatch):
    cwd = bare_cwd
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paras = real_paragraphs(50)
    for name, part in (("a", paras[:40]), ("b", paras[40:])):
        put_object(
            s3_server, f"{s3_prefix}/raw/{name}.jsonl", jsonl_bytes([{"text": t} for t in part])
        )
    table = f"{s3_prefix}/t.lance"
    so = so_args(s3_server)
    invoke_ok(["ingest", f"{s3_prefix}/raw/a.jsonl", "--table", table, *so])
    invoke_ok(["tokenize", "--table", table, "--tokenizer", "gpt2", "--workers", "0", *so])
    invoke_ok(["ingest", f"{s3_prefix}/raw/b.jsonl", "--table", table, *so])

    res = json.loads(invoke_ok(["refresh", "--table", table, "--workers", "0", "--json", *so]))
    assert res["rows"] == 50 and res["not_refreshable"] == {}
    assert [s["rows_missing"] for s in res["steps"]] == [10]
    assert "input_ids" in res["steps"][0]["columns"]

    report = json.loads(
        invoke_ok(["verify", "--table", table, "--seq-len", "64", "--steps", "2", "--json", *so])
    )
    assert report["passed"] and len(report["checks"]) == 6

    orphan = f"{table}/data/left-behind.lance"
    put_object(s3_server, orphan, b"x" * 100)
    dry = json.loads(invoke_ok(["gc", "--table", table, "--json", *so]))
    assert dry["dry_run"] and [(i["kind"], i["path"], i["bytes"]) for i in dry["items"]] == [
        ("orphan", orphan, 100)
    ]
    assert exists(orphan, s3_server.storage_options)
    done = json.loads(invoke_ok(["gc", "--table", table, "--yes", "--json", *so]))
    assert [i["path"] for i in done["items"]] == [orphan]
    assert not exists(orphan, s3_server.storage_options)
    assert json.loads(invoke_ok(["gc", "--table", table, "--json", *so]))["items"] == []
    # every version's files survived: the table still reads
    again = json.loads(invoke_ok(["verify", "--table", table, "--seq-len", "64", "--json", *so]))
    assert again["passed"]
    assert list(cwd.iterdir()) == []
