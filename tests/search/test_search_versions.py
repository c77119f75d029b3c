"""Searching an old version does not see later rows; unindexed new rows are still found."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import write_jsonl
from tokenloom.search.contamination import find_contamination
from tokenloom.search.embed import embed_table
from tokenloom.search.index import index_info
from tokenloom.search.query import search
from tokenloom.table import Table

LATE = (
    "Lighthouse keepers on the northern archipelago recorded every passing ship in a "
    "leather ledger, noting the weather, the flag and the hour of the evening tide."
)


@pytest.fixture(scope="module")
def appended(search_table, tmp_path_factory):
    """A copy of the session table (indexed at ``old``) with two rows appended at ``new``."""
    from tokenloom.ingest import ingest

    tmp = tmp_path_factory.mktemp("versions")
    uri = str(tmp / "t.lance")
    shutil.copytree(search_table, uri)
    old = Table.open(uri).version
    write_jsonl(
        tmp / "late.jsonl",
        [
            {"text": LATE, "source": "late"},
            {"text": "A second late row about tides.", "source": "late"},
        ],
    )
    ingest([str(tmp / "late.jsonl")], uri, progress=False)
    embedded = embed_table(uri, workers=0)
    return uri, old, Table.open(uri).version, embedded


def test_new_rows_are_embedded_incrementally(appended):
    _, _, _, embedded = appended
    assert embedded.rows == 2 and embedded.version is not None


def test_old_version_does_not_see_later_rows(appended):
    uri, old, new, _ = appended
    for mode in ("fts", "vector", "hybrid"):
        before = search(uri, "lighthouse keepers ledger tide", mode=mode, version=old, limit=100)
        assert before.version == old
        assert all(h.source != "late" for h in before.hits), mode
        after = search(uri, "lighthouse keepers ledger tide", mode=mode, version=new, limit=5)
        assert after.hits[0].source == "late" and after.hits[0].id == 91, mode


def test_unindexed_rows_are_searched(appended):
    uri, _, new, _ = appended
    info = index_info(Table.open(uri, version=new))
    assert info["text_fts"]["unindexed_fragments"] == 1
    assert info["embedding_vec"]["unindexed_fragments"] == 1
    res = search(uri, '"leather ledger"', version=new)
    assert [h.id for h in res.hits] == [91]
    res = search(uri, "tides", mode="vector", where="source = 'late'", version=new, limit=5)
    assert sorted(h.id for h in res.hits) == [91, 92]


def test_contamination_respects_the_version(appended):
    uri, old, new, _ = appended
    item = "Question: " + " ".join(LATE.split()[2:17]) + " ?"
    assert not find_contamination(uri, [item], version=old).items
    res = find_contamination(uri, [item], version=new)
    assert [r["id"] for r in res.items[0].rows] == [91]
