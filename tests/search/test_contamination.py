"""N-gram contamination: the vectorised scan against a naive reference, planted overlaps."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs
from tokenloom.search.contamination import (
    _WordHasher,
    find_contamination,
    ngram_hashes,
    normalize_words,
    read_eval,
)
from tokenloom.search.index import SearchError


def _naive_words(text: str) -> list[str]:
    import re
    import unicodedata

    return [w for w in re.split(r"[^\w]+|_", unicodedata.normalize("NFKC", text).lower()) if w]


def test_normalize_words_matches_a_naive_split():
    texts = ["Hello, World!  café—NAÏVE", "", "don't stop_me 3.14", "  ﬁne  "]
    words, doc = normalize_words(pa.array(texts))
    got = [[] for _ in texts]
    for w, d in zip(words.to_pylist(), doc.tolist(), strict=True):
        got[d].append(w)
    assert got == [_naive_words(t) for t in texts]
    assert got[3] == ["fine"]  # NFKC folds the ligature


def test_ngram_hashes_stay_inside_documents_and_match_a_loop():
    texts = ["a b c d e", "f g", "h i j k"]
    words, doc = normalize_words(pa.array(texts))
    wh = _WordHasher()(words)
    hashes, starts = ngram_hashes(wh, doc, 3)
    flat = words.to_pylist()
    want = [i for i in range(len(flat) - 2) if doc[i] == doc[i + 2]]
    assert starts.tolist() == want  # no n-gram crosses a document boundary
    grams = {tuple(flat[s : s + 3]) for s in want}
    by_gram = {tuple(flat[s : s + 3]): h for s, h in zip(starts, hashes.tolist(), strict=True)}
    assert len(set(by_gram.values())) == len(grams)
    again, _ = ngram_hashes(_WordHasher()(pa.array(["c", "d", "e"])), np.zeros(3, int), 3)
    assert again[0] == by_gram[("c", "d", "e")]  # a pure function of the words


def test_finds_a_planted_13_gram_and_not_unrelated_text(search_table):
    text = next(p for p in real_paragraphs(90) if len(p.split()) > 40)
    words = text.split()
    planted = "Q: " + " ".join(words[5:20]).upper() + " -- which option?"
    twelve = " ".join(_naive_words(text)[5:17])  # 12 normalised words: below n
    unrelated = "The tide came in over the northern sands while gulls circled the old pier."
    res = find_contamination(search_table, [unrelated, planted, twelve])
    assert res.eval_items == 3 and res.items_contaminated == 1
    (item,) = res.items
    assert item.item == 1 and len(item.rows) >= 1
    row = item.rows[0]
    assert len(row["ngram"].split()) == 13 and row["shared"] >= 2
    assert row["ngram"] in " ".join(_naive_words(text))
    assert res.rows_scanned == 91
    assert find_contamination(search_table, [planted], n=30).items == []


def test_filter_limits_the_training_rows(search_table):
    text = next(p for p in real_paragraphs(90) if len(p.split()) > 40)
    planted = " ".join(text.split()[:20])
    row_id = real_paragraphs(90).index(text)
    hit = find_contamination(search_table, [planted], filter=f"id = {row_id}")
    assert hit.rows_scanned == 1 and hit.items[0].rows[0]["id"] == row_id
    miss = find_contamination(search_table, [planted], filter=f"id != {row_id}")
    assert all(r["id"] != row_id for i in miss.items for r in i.rows)


def test_read_eval_jsonl_and_text(tmp_path):
    (tmp_path / "e.jsonl").write_text(
        "\n".join(json.dumps({"question": q}) for q in ["one two", "three"]) + "\n"
    )
    assert read_eval(str(tmp_path / "e.jsonl"), "question") == ["one two", "three"]
    with pytest.raises(SearchError, match="--eval-field"):
        read_eval(str(tmp_path / "e.jsonl"))
    (tmp_path / "e.txt").write_text("first item\n\nsecond item\n")
    assert read_eval(str(tmp_path / "e.txt")) == ["first item", "second item"]
    with pytest.raises(SearchError, match="does not exist"):
        read_eval(str(tmp_path / "nope.txt"))
