"""Per-document statistics that the quality rules threshold, computed for a batch at once.

Line and word counts are cheap C-level string operations per document. The repetition
statistics of Gopher (Rae et al. 2021, table A1) -- how much of a document's text sits in
repeated word n-grams -- are vectorised over the whole batch: words are hashed with the
shingle hasher, n-grams keyed by ``(document, n-gram hash)``, and counted with one ``np.unique``
per ``n``. :func:`text_stats_naive` computes every statistic with ``str`` and ``Counter`` for one
document, as the reference the tests compare against.

Conventions (shared by both paths):

* *words* are the whitespace-separated tokens of the text (punctuation attached); repetition
  statistics use them lowercased, after NFC;
* *lines* are the ``\\n``-separated lines, stripped; fractions over lines ignore empty lines;
* *characters* of an n-gram statistic are the characters of its words (whitespace excluded);
* a *duplicate* line/paragraph/n-gram is an occurrence after the first of the same text.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from tokenloom.curate.normalize import normalize_text
from tokenloom.curate.shingle import fmix64, utf8_buffer, word_chars, word_hashes

__all__ = ["STAT_NAMES", "TOP_NGRAMS", "DUP_NGRAMS", "text_stats", "text_stats_naive"]

TOP_NGRAMS = (2, 3, 4)
"""``n`` of the "most frequent n-gram" character fractions."""
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)
"""``n`` of the "duplicated n-grams" character fractions."""

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
"""Gopher's stop words: English prose uses at least two of them."""
BULLETS = frozenset("-*•‣◦⁃▪▫●○■□➤–—·")
"""First characters that make a line a bullet point."""
TERMINAL = (".", "!", "?", '"', "'", "\u201d", "\u2019")
"""Endings that make a line end a sentence (C4)."""

_STOP = re.compile(r"(?<!\w)(?:" + "|".join(sorted(STOP_WORDS)) + r")(?!\w)")
_NO_ALPHA_WORD = re.compile(r"(?<!\S)(?:[^\s\w]|[\d_])+(?!\S)")  # tokens without a letter
_NOISE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd\ue000-\uf8ff\ud800-\udfff]")
_PARAGRAPHS = re.compile(r"\n\s*\n")

STAT_NAMES = (
    "n_words",
    "mean_word_length",
    "symbol_ratio",
    "alpha_word_fraction",
    "stop_words",
    "bullet_line_fraction",
    "ellipsis_line_fraction",
    "terminal_line_fraction",
    "dup_line_fraction",
    "dup_line_char_fraction",
    "dup_paragraph_fraction",
    "dup_paragraph_char_fraction",
    *(f"top_{n}gram_char_fraction" for n in TOP_NGRAMS),
    *(f"dup_{n}gram_char_fraction" for n in DUP_NGRAMS),
    "max_line_length",
    "mean_line_length",
    "alnum_fraction",
    "noise_fraction",
    "lorem_ipsum",
)
"""Every statistic, in the order of :func:`text_stats`'s dict."""


def _dup_fractions(parts: list[str]) -> tuple[float, float]:
    """Fraction of ``parts`` (and of their characters) that repeat an earlier part."""
    if not parts:
        return 0.0, 0.0
    distinct = set(parts)
    chars = sum(map(len, parts))
    dup_chars = chars - sum(map(len, distinct))  # every occurrence after a part's first
    return (len(parts) - len(distinct)) / len(parts), dup_chars / max(chars, 1)


def _line_stats(text: str) -> dict[str, float]:
    """Every statistic except the n-gram ones, for one document."""
    raw_lines = text.split("\n")
    lines = [s for s in (line.strip() for line in raw_lines) if s]
    paragraphs = [s for s in (p.strip() for p in _PARAGRAPHS.split(text)) if s]
    words = text.split()
    n_words, n_lines, n_chars = len(words), len(lines), len(text)
    dup_line, dup_line_chars = _dup_fractions(lines)
    dup_par, dup_par_chars = _dup_fractions(paragraphs)
    symbols = text.count("#") + text.count("...") + text.count("\u2026")
    return {
        "n_words": n_words,
        "mean_word_length": sum(map(len, words)) / n_words if n_words else 0.0,
        "symbol_ratio": symbols / n_words if n_words else float(symbols > 0),
        "alpha_word_fraction": 1 - len(_NO_ALPHA_WORD.findall(text)) / n_words if n_words else 0.0,
        "stop_words": len(set(_STOP.findall(text.lower()))),
        "bullet_line_fraction": sum(s[0] in BULLETS for s in lines) / n_lines if n_lines else 0.0,
        "ellipsis_line_fraction": (
            sum(s.endswith(("...", "\u2026")) for s in lines) / n_lines if n_lines else 0.0
        ),
        "terminal_line_fraction": sum(s.endswith(TERMINAL) for s in lines) / n_lines
        if n_lines
        else 0.0,
        "dup_line_fraction": dup_line,
        "dup_line_char_fraction": dup_line_chars,
        "dup_paragraph_fraction": dup_par,
        "dup_paragraph_char_fraction": dup_par_chars,
        "max_line_length": max(map(len, raw_lines)),
        "mean_line_length": n_chars / len(raw_lines),
        "noise_fraction": len(_NOISE.findall(text)) / n_chars if n_chars else 0.0,
        "lorem_ipsum": float("lorem ipsum" in text.lower()),
    }


def _ngram_stats(keys: list[str]) -> dict[str, np.ndarray]:
    """The n-gram character fractions of every key (lowercased normalised text), vectorised."""
    data, offsets = utf8_buffer(keys)
    words, word_off = word_hashes(data, offsets)  # (W,), (N + 1,)
    n = len(keys)
    wchars = word_chars(data, offsets)  # (W,) characters per word
    wcum = np.concatenate(([0], np.cumsum(wchars)))  # (W + 1,)
    total = (wcum[word_off[1:]] - wcum[word_off[:-1]]).astype(np.float64)  # (N,)
    doc_of_word = np.repeat(np.arange(n), np.diff(word_off))  # (W,)
    doc_end = word_off[1:][doc_of_word]  # (W,) end of each word's document
    start = np.arange(words.size)  # (W,) n-gram start positions
    padded = np.concatenate((words, np.zeros(max(DUP_NGRAMS), dtype=np.uint64)))
    key = fmix64(doc_of_word.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))  # per-doc salt
    out: dict[str, np.ndarray] = {}
    for size in range(1, max(DUP_NGRAMS) + 1):
        key = fmix64(key ^ padded[start + size - 1])  # (W,) hash of words[i : i + size]
        if size not in TOP_NGRAMS and size not in DUP_NGRAMS:
            continue
        pos = np.flatnonzero(start + size <= doc_end)  # (G,) n-grams inside one document
        doc = doc_of_word[pos]
        _, inverse, counts = np.unique(key[pos], return_inverse=True, return_counts=True)
        count = counts[inverse]  # (G,) occurrences of each position's n-gram in its document
        frac = np.zeros(n)
        if size in TOP_NGRAMS:
            rep = count >= 2  # only a repeated n-gram is repetition
            r_doc, r_count = doc[rep], count[rep]
            r_chars = (wcum[pos + size] - wcum[pos])[rep]  # characters of each n-gram
            # most frequent n-gram per document (ties: the longest), times its count
            order = np.lexsort((r_chars, r_count, r_doc))
            best = order[np.flatnonzero(np.append(np.diff(r_doc[order]) != 0, True))[: order.size]]
            frac[r_doc[best]] = r_count[best] * r_chars[best]
        else:
            cover = np.zeros(words.size + 1, dtype=np.int64)  # difference array over words
            dup = pos[count >= 2]
            np.add.at(cover, dup, 1)
            np.add.at(cover, dup + size, -1)
            covered = np.cumsum(cover[:-1]) > 0  # (W,) word inside a repeated n-gram
            frac = np.bincount(doc_of_word[covered], wchars[covered], minlength=n)
        name = "top" if size in TOP_NGRAMS else "dup"
        out[f"{name}_{size}gram_char_fraction"] = np.divide(
            frac, total, out=np.zeros(n), where=total > 0
        )
    return out


def _alnum_fractions(texts: list[str]) -> np.ndarray:
    """``(N,)`` fraction of each text's characters that are ASCII letters or digits."""
    data, offsets = utf8_buffer(texts)
    n_alnum = _segment_counts(_ASCII_ALNUM[data], offsets)  # (N,)
    n_chars = _segment_counts((data & 0xC0) != 0x80, offsets).astype(np.float64)  # code points
    return np.divide(n_alnum, n_chars, out=np.zeros(len(texts)), where=n_chars > 0)


def _segment_counts(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(N,)`` true values of a ``(B,) bool`` mask inside each ``offsets`` segment."""
    cum = np.zeros(mask.size + 1, dtype=np.int64)
    np.cumsum(mask, dtype=np.int64, out=cum[1:])
    return np.diff(cum[offsets])


_ASCII_ALNUM = np.zeros(256, dtype=bool)
_ASCII_ALNUM[list(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")] = True


def text_stats(texts: list[str]) -> dict[str, np.ndarray]:
    """Compute every statistic in :data:`STAT_NAMES` for a batch.

    Args:
        texts: ``N`` documents.

    Returns:
        Statistic name -> ``(N,) float64``.
    """
    per_doc = [_line_stats(t) for t in texts]
    out = {name: np.array([d[name] for d in per_doc], dtype=np.float64) for name in per_doc[0]}
    out["alnum_fraction"] = _alnum_fractions(texts)
    out.update(_ngram_stats([normalize_text(t, lowercase=True) for t in texts]))
    return {name: out[name] for name in STAT_NAMES}


def text_stats_naive(text: str) -> dict[str, float]:
    """Reference for :func:`text_stats` on one document: ``Counter`` over n-gram tuples."""
    stats: dict[str, float] = dict(_line_stats(text))
    n_alnum = sum(c.isascii() and c.isalnum() for c in text)
    stats["alnum_fraction"] = n_alnum / len(text) if text else 0.0
    words = normalize_text(text, lowercase=True).split()
    total = sum(map(len, words))
    for size in (*TOP_NGRAMS, *DUP_NGRAMS):
        grams = [tuple(words[i : i + size]) for i in range(len(words) - size + 1)]
        counts = Counter(grams)
        if size in TOP_NGRAMS:
            reps = [(c, sum(map(len, g))) for g, c in counts.items() if c >= 2]
            c, chars = max(reps, default=(0, 0))
            stats[f"top_{size}gram_char_fraction"] = c * chars / total if total else 0.0
        else:
            covered = [False] * len(words)
            for i, g in enumerate(grams):
                if counts[g] >= 2:
                    covered[i : i + size] = [True] * size
            dup = sum(len(w) for w, c in zip(words, covered, strict=True) if c)
            stats[f"dup_{size}gram_char_fraction"] = dup / total if total else 0.0
    return {name: float(stats[name]) for name in STAT_NAMES}
