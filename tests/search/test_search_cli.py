"""The search commands through click's CliRunner: text and JSON outputs, errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.search.conftest import PLANTED, build, records
from tokenloom.cli.main import cli
from tokenloom.search.index import SearchError


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=True)


def test_search_cli_text_and_json(search_table):
    res = _invoke("search", "--table", search_table, "zebra quartermaster", "-k", "3")
    assert res.exit_code == 0, res.output
    assert "hits (fts, version" in res.output and "planted" in res.output
    res = _invoke(
        "search",
        "--table",
        search_table,
        "telescopes at dawn",
        "--hybrid",
        "--where",
        "source = 'planted' OR id < 10",
        "--limit",
        "4",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["mode"] == "hybrid" and len(out["hits"]) == 4
    assert out["hits"][0]["id"] == 90 and out["hits"][0]["fts_rank"] == 1
    assert {"id", "source", "score", "snippet"} <= set(out["hits"][0])


def test_search_cli_vector_with_where_and_version(search_table):
    res = _invoke(
        "search",
        "--table",
        search_table,
        PLANTED,
        "--vector",
        "--where",
        "id % 15 = 3",
        "-k",
        "5",
        "--json",
    )
    out = json.loads(res.output)
    assert len(out["hits"]) == 5 and all(h["id"] % 15 == 3 for h in out["hits"])
    res = _invoke("search", "--table", search_table, "x", "--vector", "--version", "2")
    assert isinstance(res.exception, SearchError) and "tokenloom embed" in str(res.exception)


def test_embed_index_and_contamination_cli(tmp_path):
    uri = build(tmp_path, records(12))
    res = _invoke("index", "--table", uri)
    assert res.exit_code == 0 and "no 'embedding' column" in res.output
    res = _invoke("embed", "--table", uri, "--workers", "0", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["rows"] == 12 and out["model"]["dim"] == 384 and out["version"]
    res = _invoke("embed", "--table", uri, "--workers", "0")
    assert "nothing to do" in res.output
    res = _invoke("index", "--table", uri, "--json")
    out = json.loads(res.output)
    assert out["vector_index"] == "none" and out["fts_column"] == "text"
    res = _invoke("search", "--table", uri, "a file path", "--hybrid", "-k", "2")
    assert res.exit_code == 0 and "[fts" in res.output
    text = records(12)[4]["text"]
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"text": "unrelated words only here"}) + "\n" + json.dumps({"text": text})
    )
    res = _invoke(
        "contamination",
        "--table",
        uri,
        "--eval",
        str(tmp_path / "eval.jsonl"),
        "--n",
        "5",
        "--json",
    )
    out = json.loads(res.output)
    assert out["items_contaminated"] == 1 and out["items"][0]["item"] == 1
    assert 4 in [r["id"] for r in out["items"][0]["rows"]]
    res = _invoke(
        "contamination",
        "--table",
        uri,
        "--eval",
        str(tmp_path / "eval.jsonl"),
        "--n",
        "5",
        "--filter",
        "id != 4",
    )
    assert res.exit_code == 0 and "of 11 training rows" in res.output
