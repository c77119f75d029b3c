"""``tokenloom index`` run again commits nothing while its indexes cover every fragment."""

from __future__ import annotations

import json

from tests.conftest import run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.search.index import index_info
from tokenloom.table import Table


def _index(uri, *extra):
    proc = run_cli("--quiet", "index", "--table", uri, "--no-vector", *extra)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_rerun_commits_nothing_and_an_append_is_indexed(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in paragraphs[:20]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    first = json.loads(_index(uri, "--json").stdout)
    built = Table.open(uri).version
    assert first["versions"] == [built] and first["up_to_date"] == []

    again = _index(uri)
    assert "up to date" in again.stdout and "nothing committed" in again.stdout
    assert "versions none" in again.stdout
    assert Table.open(uri).version == built

    # Other parameters are another index: rebuilt, a new version.
    other = json.loads(_index(uri, "--no-stem", "--json").stdout)
    assert other["versions"] == [built + 1] and other["up_to_date"] == []
    built += 1

    # Rows appended since: a new fragment the index does not cover, so it is rebuilt.
    write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in paragraphs[20:25]])
    ingest([tmp_path / "b.jsonl"], uri, progress=False)
    appended = Table.open(uri).version
    after = json.loads(_index(uri, "--no-stem", "--json").stdout)
    assert after["versions"] == [appended + 1] and after["up_to_date"] == []
    indexes = index_info(Table.open(uri))
    assert indexes["text_fts"]["unindexed_fragments"] == 0
    assert indexes["text_fts"]["rows_indexed"] == 25
    assert json.loads(_index(uri, "--no-stem", "--json").stdout)["versions"] == []
