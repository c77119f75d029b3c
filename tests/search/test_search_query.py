"""FTS, vector and hybrid search on a real table, with filters."""

from __future__ import annotations

import numpy as np
import pytest

from tests.search.conftest import PLANTED, SOURCES, build, records
from tokenloom.search.index import SearchError, build_indexes, choose_vector_index, index_info
from tokenloom.search.query import rrf_fuse, search, snippet
from tokenloom.table import Table


def test_indexes_are_committed_versions_covering_every_fragment(search_table):
    info = index_info(Table.open(search_table))
    assert info["text_fts"]["type"] == "Inverted" and info["text_fts"]["unindexed_fragments"] == 0
    assert info["embedding_vec"]["type"] == "IVF_FLAT"
    assert info["embedding_vec"]["rows_indexed"] == 91
    ops = [v.operation for v in Table.open(search_table).versions()]
    assert ops[-2:] == ["createindex", "createindex"]


def test_fts_finds_the_planted_phrase(search_table):
    res = search(search_table, "zebra quartermaster telescopes", limit=5)
    assert res.hits[0].id == 90 and res.hits[0].source == "planted"
    assert "zebra quartermaster" in res.hits[0].snippet
    assert res.hits[0].score > 0 and all(h.id != 90 for h in res.hits[1:])
    phrase = search(search_table, '"seventeen brass telescopes"', limit=5)
    assert [h.id for h in phrase.hits] == [90]
    assert not search(search_table, '"brass seventeen telescopes"', limit=5).hits


def test_fts_snippet_is_around_the_match():
    text = "x " * 200 + "the needle is here " + "y " * 200
    snip = snippet(text, "needle")
    assert "the needle is here" in snip and snip.startswith("…") and snip.endswith("…")
    assert snippet("short text", "absent") == "short text"


def test_where_composes_with_every_mode(search_table):
    for mode in ("fts", "vector", "hybrid"):
        res = search(search_table, "copy a file", mode=mode, where="source = 'os_docs'", limit=8)
        assert len(res.hits) == 8, mode
        assert {h.source for h in res.hits} == {"os_docs"}, mode


def test_vector_search_with_a_selective_where_still_returns_k_rows(search_table):
    where = "id % 15 = 3"  # 6 of 91 rows, spread over the IVF partitions
    expected = sorted(
        r["id"]
        for r in Table.open(search_table).dataset.to_table(columns=["id"], filter=where).to_pylist()
    )
    assert len(expected) == 6
    res = search(search_table, "directory", mode="vector", where=where, limit=5)
    assert len(res.hits) == 5 and all(h.id % 15 == 3 for h in res.hits)
    # Probing one partition cannot hold 5 matches: the search falls back to an exact flat one.
    narrow = search(search_table, "directory", mode="vector", where=where, limit=5, nprobes=1)
    assert [h.id for h in narrow.hits] == [h.id for h in res.hits]
    assert narrow.notes and "flat" in narrow.notes[0]
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True)


def test_vector_scores_are_cosine_similarities(search_table):
    from tokenloom.search.embed import embed_texts

    res = search(search_table, PLANTED, mode="vector", limit=3)
    assert res.hits[0].id == 90
    vec = Table.open(search_table).dataset.to_table(columns=["embedding"], filter="id = 90")
    stored = np.asarray(vec.column(0).to_pylist()[0], dtype=np.float32)
    q = embed_texts([PLANTED])[0]
    assert res.hits[0].score == pytest.approx(float(q @ stored), abs=1e-4)


def test_hybrid_is_the_rank_fusion_of_both_lists(search_table):
    query = "remove a directory tree"
    fts = search(search_table, query, mode="fts", limit=50)
    vec = search(search_table, query, mode="vector", limit=50)
    hyb = search(search_table, query, mode="hybrid", limit=10)
    fts_rank = {h.id: i + 1 for i, h in enumerate(fts.hits)}
    vec_rank = {h.id: i + 1 for i, h in enumerate(vec.hits)}
    assert len(hyb.hits) == 10
    for h in hyb.hits:
        assert h.id in fts_rank or h.id in vec_rank
        assert h.fts_rank == fts_rank.get(h.id) and h.vector_rank == vec_rank.get(h.id)
        want = sum(1 / (60 + r) for r in (h.fts_rank, h.vector_rank) if r)
        assert h.score == pytest.approx(want)
    assert [h.score for h in hyb.hits] == sorted((h.score for h in hyb.hits), reverse=True)
    both = set(fts_rank) | set(vec_rank)
    best = sorted(
        both, key=lambda i: -sum(1 / (60 + r[i]) for r in (fts_rank, vec_rank) if i in r)
    )[:10]
    assert {h.id for h in hyb.hits} == set(best)


def test_rrf_fuse():
    fused = rrf_fuse([[1, 2, 3], [3, 4]], k=60)
    assert [f[0] for f in fused] == [3, 1, 2, 4]
    assert fused[0][1] == pytest.approx(1 / 63 + 1 / 61) and fused[0][2] == [3, 1]
    assert fused[3][2] == [None, 2]


def test_choose_vector_index_rule():
    assert choose_vector_index(9_999).kind == "none"
    ivf = choose_vector_index(250_000)
    assert ivf.kind == "ivf_flat" and ivf.num_partitions == 500
    pq = choose_vector_index(4_000_000)
    assert pq.kind == "ivf_pq" and pq.num_sub_vectors == 48 and pq.num_partitions == 2000
    with pytest.raises(SearchError, match="--vector-index none"):
        choose_vector_index(10, "ivf_flat")


def test_missing_embedding_or_index_names_the_command(tmp_path):
    uri = build(tmp_path, records(80))
    with pytest.raises(SearchError, match="tokenloom index"):
        search(uri, "file")
    build_indexes(uri)
    assert search(uri, "file", limit=3).hits
    with pytest.raises(SearchError, match="tokenloom embed"):
        search(uri, "file", mode="vector")
    with pytest.raises(SearchError, match="tokenloom embed"):
        search(uri, "file", mode="hybrid")
    assert SOURCES[0] in {h.source for h in search(uri, "path", limit=10).hits}
