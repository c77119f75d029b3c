"""Tests of shingling and MinHash signatures: vectorised vs reference, vs datasketch, vs exact."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.curate import (
    EMPTY,
    CurateError,
    Fold,
    MinHashConfig,
    estimate_jaccard,
    minhash_signatures,
    minhash_signatures_naive,
    shingle_key,
    shingle_set,
)
from tokenloom.curate import minhash as minhash_mod
from tokenloom.curate.shingle import shingle_hashes, shingle_hashes_naive

EDGE_CASES = ["", None, "word", "two words", "!!! ... ---", "Ünïcödé wörds ääh – dash", "a  b"]


def _exact_jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def test_skeleton_folds_1623_spelling_onto_modern():
    assert shingle_key("Haue you had quiet Guard?") == shingle_key("have you had quiet guard")
    assert shingle_key("What say'st thou, vs?") == shingle_key("What sayst thou, us!")
    assert shingle_key("colour") == shingle_key("color") == "clr"
    assert shingle_key("Don't stop", Fold.WORDS) == "dont stop"
    assert shingle_key("Night, night.", Fold.LOWER) == "night, night."


@pytest.mark.parametrize("fold", list(Fold))
@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_vectorised_shingle_hashes_equal_the_reference(wiki, plays, fold, ngram):
    texts = [r["text"] for r in wiki[:40]] + [plays[-1]["text"][:3000]] + EDGE_CASES
    hashes, offsets = shingle_hashes(texts, ngram=ngram, fold=fold)
    assert offsets.shape == (len(texts) + 1,) and hashes.dtype == np.uint64
    for i, text in enumerate(texts):
        got = hashes[offsets[i] : offsets[i + 1]].tolist()
        assert got == shingle_hashes_naive(text, ngram=ngram, fold=fold)
        assert len(set(got)) == len(shingle_set(text, ngram=ngram, fold=fold))


def test_signatures_equal_the_reference_across_chunks(wiki, monkeypatch):
    texts = [r["text"] for r in wiki[:12]] + EDGE_CASES
    config = MinHashConfig(num_perm=32)
    expected = minhash_signatures_naive(texts, config)
    monkeypatch.setattr(minhash_mod, "_CHUNK", 7)  # documents straddle many chunks
    got = minhash_signatures(pa.array(texts, pa.large_string()), config)
    assert got.shape == (len(texts), 32) and got.dtype == np.uint32
    np.testing.assert_array_equal(got, expected)
    alone = np.stack([minhash_signatures([t], config)[0] for t in texts])
    np.testing.assert_array_equal(alone, expected)  # a row's signature ignores its batch


def test_documents_without_words_get_the_empty_signature():
    sig = minhash_signatures(["", None, "  ...  ", "one"])
    assert (sig[:3] == EMPTY).all() and not (sig[3] == EMPTY).all()


def _pairs(plays: list[dict]) -> list[tuple[str, str]]:
    """Real pairs over the whole range of similarity: overlapping windows of one play, the two
    editions of three plays, and three pairs of different plays."""
    words = plays[0]["text"].split()[:2000]
    pairs = [(" ".join(words[:600]), " ".join(words[s : s + 600])) for s in range(0, 700, 50)]
    by_work: dict[str, list[str]] = {}
    for r in plays:
        by_work.setdefault(r["work"], []).append(r["text"])
    twins = [texts for texts in by_work.values() if len(texts) == 2]
    pairs += [(a, b) for a, b in twins[:3]]
    pairs += [(twins[i][0], twins[i + 1][1]) for i in range(3)]
    return pairs


def test_estimates_track_exact_jaccard_like_datasketch(plays):
    datasketch = pytest.importorskip("datasketch")
    config = MinHashConfig()
    ours, theirs, exact = [], [], []
    for a, b in _pairs(plays):
        sa, sb = shingle_set(a), shingle_set(b)
        exact.append(_exact_jaccard(sa, sb))
        sig = minhash_signatures([a, b], config)
        ours.append(float(estimate_jaccard(sig[0], sig[1])))
        ma, mb = (datasketch.MinHash(num_perm=config.num_perm, seed=1) for _ in range(2))
        ma.update_batch([s.encode() for s in sa])
        mb.update_batch([s.encode() for s in sb])
        theirs.append(ma.jaccard(mb))
    ours_err = np.abs(np.array(ours) - exact)
    theirs_err = np.abs(np.array(theirs) - exact)
    assert min(exact) < 0.05 and max(exact) == 1.0  # the pairs span the whole range
    assert ours_err.max() < 0.15 and theirs_err.max() < 0.15
    assert ours_err.mean() < 0.04 and ours_err.mean() < theirs_err.mean() + 0.02


def test_config_is_validated_and_versioned():
    assert MinHashConfig().version == "minhash1-skeleton-n3-p128-s1"
    with pytest.raises(CurateError, match="num_perm"):
        MinHashConfig(num_perm=0)
    with pytest.raises(CurateError, match="Fold"):
        MinHashConfig(fold="skeleton")
    with pytest.raises(CurateError, match="ngram must be an int"):
        MinHashConfig(ngram=2.5)
    with pytest.raises(CurateError, match="ngram must be a positive int"):
        shingle_hashes(["a b"], ngram=0)
    other_seed = minhash_signatures(["a b c d"], MinHashConfig(seed=2))
    assert not np.array_equal(other_seed, minhash_signatures(["a b c d"]))
