"""Quoted phrases keep their stop words; ``search --version V`` works for a version before the
index; the index's tokenizer, language, stemming and stop words are chosen at index time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.search.conftest import build, records
from tokenloom.corpus import build_corpus
from tokenloom.ingest import ingest

ROOT = Path(__file__).resolve().parents[2]


_run = run_cli


@pytest.fixture(scope="module")
def kjv(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The whole bundled corpus (what `tokenloom demo` builds), indexed with the defaults."""
    tmp = tmp_path_factory.mktemp("kjv")
    build_corpus(tmp / "corpus")
    uri = str(tmp / "t.lance")
    ingest(sorted((tmp / "corpus").glob("*.jsonl")), uri, progress=False)
    out = _run("index", "--table", uri, "--no-vector", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["fts_options"]["remove_stop_words"] is False
    return uri


def _hits(uri: str, query: str, *extra: str) -> list[dict]:
    out = _run("search", "--table", uri, query, "--limit", "50", "--json", *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["hits"]


def test_a_quoted_query_is_a_phrase_with_its_stop_words(kjv: str) -> None:
    import lance

    ds = lance.dataset(kjv)
    phrase = _hits(kjv, '"in the beginning"')
    texts = {
        r["id"]: r["text"]
        for r in ds.to_table(columns=["id", "text"], filter="source = 'kjv'").to_pylist()
    }
    genesis = next(i for i, t in texts.items() if t.startswith("The First Book of Moses"))
    john = next(i for i, t in texts.items() if re.match(r"The Gospel .* John 1\s", t))
    ids = [h["id"] for h in phrase]
    assert genesis in ids and john in ids
    # every hit holds the three words in order (a stemmed form of the last one)
    for hit in phrase:
        text = ds.to_table(columns=["text"], filter=f"id = {hit['id']}").column(0)[0].as_py()
        assert re.search(r"\bin\W+the\W+beginning", text, re.IGNORECASE), hit
    # ranked by the phrase, not by how often "in" and "the" occur: Genesis 1 opens with it
    assert ids[0] == genesis, [h["snippet"][:60] for h in phrase[:3]]
    assert _hits(kjv, '"in the beginning"', "--where", "source = 'kjv'")[0]["id"] == genesis
    # unquoted, it is three words: articles about "the beginning of" come first
    words = _hits(kjv, "in the beginning")
    assert [h["id"] for h in words[:5]] != ids[:5]
    assert len(words) > len(phrase)


def test_an_old_version_is_searched_with_the_newer_index(tmp_path: Path) -> None:
    uri = build(tmp_path, records(60))
    before = json.loads(_run("info", "--table", uri, "--json").stdout)["version"]
    assert _run("index", "--table", uri, "--no-vector").returncode == 0
    more = build(tmp_path, records(40, offset=60), name="more")  # other docstrings, appended
    assert ingest([f"{more}.jsonl"], uri, progress=False).rows_written == 40
    query = "return"
    latest = _hits(uri, query)
    assert any(h["id"] >= 60 for h in latest)
    out = _run("search", "--table", uri, query, "--version", str(before), "--json", "--limit", "50")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["version"] == before and res["hits"]
    assert all(h["id"] < 60 for h in res["hits"])
    assert "has no full-text index" in res["notes"][0]
    with_where = _run("search", "--table", uri, query, "--version", str(before), "--where",
                      "source = 'os_docs'", "--json")  # fmt: skip
    assert {h["source"] for h in json.loads(with_where.stdout)["hits"]} == {"os_docs"}


def test_index_options_choose_stemming_and_stop_words(tmp_path: Path) -> None:
    uri = build(tmp_path, [{"text": "the beginnings of rivers"}, {"text": "a river begins"}])
    assert _run("index", "--table", uri, "--no-vector", "--no-stem").returncode == 0
    assert [h["id"] for h in _hits(uri, "river")] == [1]
    assert _run("index", "--table", uri, "--no-vector").returncode == 0  # stemmed
    assert sorted(h["id"] for h in _hits(uri, "river")) == [0, 1]
    bad = _run("index", "--table", uri, "--no-vector", "--language", "Klingon")
    assert bad.returncode == 1 and "Klingon" in bad.stderr


def test_phrase_stats_count_occurrences_and_the_opening() -> None:
    from tokenloom.search.phrase import lead_end, phrase_stats, words

    text = "Genesis 1\n\n1 In the beginning God created. 2 And in the Beginning was light."
    stats = phrase_stats(text, words("in the beginning"))
    assert (stats.occurrences, stats.in_lead) == (2, 1)
    assert text[: lead_end(text)].endswith("created.")
    # a row Lance matched through a stemmed form still counts once, outside the opening
    stemmed = phrase_stats("Of rivers. In the beginnings of rivers.", words("in the beginning"))
    assert (stemmed.occurrences, stemmed.in_lead) == (1, 0)
