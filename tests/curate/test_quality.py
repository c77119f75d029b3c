"""Tests of the quality rules on real text, planted junk, and code."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.curate import (
    CODE,
    PROSE,
    RULES,
    CurateError,
    Rule,
    detect_kind,
    quality_scores,
    quality_scores_naive,
)
from tokenloom.curate.textstats import STAT_NAMES, text_stats, text_stats_naive

PROSE_ONLY = {r.name for r in RULES if CODE not in r.kinds}


@pytest.fixture(scope="module")
def base(long_wiki) -> str:
    """A real article that passes every prose rule, with one sentence per line."""
    for text in long_wiki:
        lined = text.replace(". ", ".\n")
        if lined.count("\n") >= 3 and quality_scores([lined], kinds=PROSE)[1] == [[]]:
            return lined
    raise AssertionError("no clean article")


def _junk(base: str) -> dict[str, str]:
    lines = base.split("\n")
    words = base.split()
    return {
        "repeated_lines": "\n".join(line for line in lines for _ in range(3)),
        "bullets": "\n".join(f"\u2022 {line}" for line in lines),
        "symbol_spam": " ".join(w + (" #" if i % 3 == 0 else "") for i, w in enumerate(words)),
        "ellipsis_lines": "\n".join(line.rstrip(".") + "..." for line in lines),
        "too_short": " ".join(words[:30]),
        "lorem": base + "\nLorem ipsum dolor sit amet.",
        "mojibake": "\ufffd\x07".join(base[i : i + 40] for i in range(0, len(base), 40)),
        "no_stop_words": "\n".join(
            w.strip(",.")
            for w in words
            if w.lower() not in {"the", "be", "to", "of", "and", "that", "have", "with"}
        ),
        "repeated_ngrams": base + "\n" + " ".join(words[: len(words) // 2]),
    }


EXPECTED = {
    "repeated_lines": {"dup_lines", "dup_line_chars", "dup_5gram_chars", "dup_10gram_chars"},
    "bullets": {"bullet_lines"},
    "symbol_spam": {"symbol_ratio"},
    "ellipsis_lines": {"ellipsis_lines"},
    "too_short": {"word_count"},
    "lorem": {"lorem_ipsum"},
    "mojibake": {"noise_chars"},
    "no_stop_words": {"stop_words", "terminal_punct_lines"},
    "repeated_ngrams": {"dup_5gram_chars", "dup_10gram_chars"},
}


def test_planted_junk_fails_for_the_expected_reasons(base):
    junk = _junk(base)
    quality, reasons = quality_scores(list(junk.values()), kinds=PROSE)
    for (name, _), q, why in zip(junk.items(), quality, reasons, strict=True):
        assert EXPECTED[name] <= set(why), (name, why)
        assert q == pytest.approx(1 - len(why) / len(PROSE_ONLY | {"noise_chars"}))
    assert quality_scores([base], kinds=PROSE) == (pytest.approx([1.0]), [[]])


def test_most_real_wiki_articles_pass(wiki):
    texts = pa.array([r["text"] for r in wiki[::2]])  # half the articles keeps the test quick
    quality, reasons = quality_scores(texts, kinds=PROSE)
    assert quality.dtype == np.float32 and ((quality >= 0) & (quality <= 1)).all()
    passed = quality == 1.0
    assert (passed == [not r for r in reasons]).all()
    assert passed.mean() > 0.75  # 77.6%: Gopher's 50-word minimum rejects short leads
    only_short = [set(r) <= {"word_count"} for r in reasons]
    assert np.mean(only_short) > 0.97  # 97.8%


def test_stdlib_code_is_not_condemned_by_prose_rules(stdlib):
    texts = [r["text"] for r in stdlib[::4]]  # a quarter of the files keeps the test quick
    quality, reasons = quality_scores(texts, kinds=CODE)
    assert (quality == 1.0).mean() > 0.99
    assert not PROSE_ONLY & {name for r in reasons for name in r}
    detected = [detect_kind(t) for t in texts]
    assert detected.count(CODE) / len(texts) > 0.9  # 96% of all files on CPython 3.11
    as_prose, _ = quality_scores(texts, kinds=PROSE)
    assert (as_prose == 1.0).mean() < 0.5  # what the prose rules would have done


def test_the_detector_calls_prose_prose(wiki, plays):
    texts = [r["text"] for r in wiki[:2000] + plays]
    assert sum(detect_kind(t) == PROSE for t in texts) >= len(texts) - 2


def test_fast_statistics_equal_the_reference(wiki, plays, stdlib, base):
    texts = [r["text"] for r in wiki[:150] + stdlib[:40]] + [r["text"][:20_000] for r in plays[:3]]
    texts += list(_junk(base).values()) + ["", "x", "é é é é é é", "a b a b a b a b a b a b"]
    fast = text_stats(texts)
    for i, text in enumerate(texts):
        ref = text_stats_naive(text)
        for name in STAT_NAMES:
            assert fast[name][i] == pytest.approx(ref[name]), (i, name)
    kinds = [detect_kind(t) for t in texts]
    q, r = quality_scores(texts, kinds=kinds)
    q_ref, r_ref = quality_scores_naive(texts, kinds=kinds)
    np.testing.assert_array_equal(q, q_ref)
    assert r == r_ref


def test_kinds_arguments():
    texts = ["def f(x):\n    return {x: [x]}\n", "A plain sentence about the sea and the sky."]
    assert quality_scores(texts)[1] == quality_scores(texts, kinds=[CODE, PROSE])[1]
    assert quality_scores(texts, kinds=pa.array([CODE, CODE]))[1] == [[], []]
    assert quality_scores([], kinds=PROSE)[0].shape == (0,)
    assert quality_scores([None], kinds=PROSE)[1] == [
        ["word_count", "mean_word_length", "alpha_words", "stop_words", "terminal_punct_lines"]
    ]
    with pytest.raises(CurateError, match="unknown kind"):
        quality_scores(texts, kinds="poetry")
    with pytest.raises(CurateError, match="align"):
        quality_scores(texts, kinds=[CODE])
    with pytest.raises(CurateError, match="unknown statistic"):
        Rule(name="x", stat="nope", high=1)
    with pytest.raises(CurateError, match="bound"):
        Rule(name="x", stat="n_words")
