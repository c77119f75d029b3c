"""Shingling: documents -> canonical word strings -> 64-bit shingle hashes, vectorised per batch.

A *shingle* is a run of ``ngram`` consecutive words of a document's canonical form (its *key*,
see :class:`Fold`); near-duplicate detection compares documents by the Jaccard similarity of
their shingle sets. Hashing is vectorised over the batch's UTF-8 bytes, never a Python loop per
word: the keys go into one Arrow buffer, word boundaries are the space bytes, each word hashes to
a polynomial in its bytes (``sum((byte + 1) * P**k) mod 2**64``) finished with the MurmurHash3
``fmix64`` avalanche, and a shingle combines its word hashes the same way with another constant.
Every constant is fixed, so hashes are identical across processes, machines and batchings.

A document with fewer words than ``ngram`` is one shingle (all its words); a document whose key
has no words has no shingles. :func:`shingle_hashes_naive` computes the same hashes one word at a
time in plain Python, and :func:`shingle_set` gives the shingles as strings, for exact Jaccard.
"""

from __future__ import annotations

import enum
import re

import numpy as np
import pyarrow as pa

from tokenloom.curate.inputs import CurateError, TextColumn, as_texts
from tokenloom.curate.normalize import normalize_text

__all__ = [
    "Fold",
    "shingle_key",
    "word_hashes",
    "word_chars",
    "utf8_buffer",
    "shingle_hashes",
    "shingle_hashes_naive",
    "shingle_set",
    "fmix64",
]

_MASK = (1 << 64) - 1
_P = 0xC2B2AE3D27D4EB4F  # byte polynomial base (odd, so powers never vanish mod 2**64)
_Q = 0x9E3779B97F4A7C15  # word polynomial base within a shingle
_LEN = 0x165667B19E3779F9  # mixes a word's byte length into its hash

_APOSTROPHES = re.compile(r"['\u2019\u02bc]")  # "don't" -> "dont", "o'er" -> "oer"
_NON_WORD = re.compile(r"[^\w\s]+")  # punctuation and symbols -> word breaks
_INNER_VOWELS = re.compile(r"\B[aeiouy]+")  # vowels not at a word's start
_REPEATS = re.compile(r"([0-9a-z_])\1+")  # "warres" -> "wrs" once vowels go; ASCII only
_UV_IJ = str.maketrans("vj", "ui")  # 1623 printers used u/v and i/j interchangeably


class Fold(enum.Enum):
    """How a document becomes its canonical word string (its *key*) before shingling."""

    LOWER = "lower"
    """``normalize_text(s, lowercase=True)``: NFC, whitespace collapsed, lowercased; words are
    the whitespace-separated tokens, punctuation attached ("night," differs from "night")."""

    WORDS = "words"
    """``LOWER``, then apostrophes removed and every other run of punctuation or symbols turned
    into a word break: words are Unicode ``\\w+`` runs ("o'er" -> "oer")."""

    SKELETON = "skeleton"
    """``WORDS``, then an orthographic skeleton of each word: ``v``->``u`` and ``j``->``i``, the
    vowels ``aeiouy`` dropped except as first letter, repeated letters collapsed. Spelling
    variants then share a key: "haue"/"have" -> "h", "vs"/"us" -> "us", "beene"/"been" -> "bn",
    "colour"/"color" -> "clr". Distinct words collide more often too ("but"/"bat" -> "bt"), which
    the n-gram context absorbs: a 3-word skeleton shingle is still specific to its passage."""


def shingle_key(text: str, fold: Fold = Fold.SKELETON) -> str:
    """The canonical form of one document: its words, each separated by one space.

    Args:
        text: The document.
        fold: Which canonicalisation (see :class:`Fold`).

    Returns:
        The key; ``""`` when the document has no words.
    """
    key = normalize_text(text, lowercase=True)
    if fold is Fold.LOWER:
        return key
    key = _NON_WORD.sub(" ", _APOSTROPHES.sub("", key))
    if fold is Fold.SKELETON:
        key = _REPEATS.sub(r"\1", _INNER_VOWELS.sub("", key.translate(_UV_IJ)))
    return " ".join(key.split())


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, a bijective avalanche on ``uint64`` (wrapping)."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def _fmix64_int(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _MASK
    return x ^ (x >> 33)


def _powers(base: int, n: int) -> np.ndarray:
    """``(n,) uint64``: ``base**k mod 2**64`` for ``k < n``."""
    out = np.full(max(n, 1), base, dtype=np.uint64)
    out[0] = 1
    return np.multiply.accumulate(out)[:n]  # wraps mod 2**64, as intended


def utf8_buffer(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(B,) uint8`` UTF-8 of all strings back to back, and ``(N + 1,) int64`` offsets into it.

    Raises:
        CurateError: A string holds a lone surrogate (not encodable; Arrow text never does).
    """
    try:
        arr = pa.array(strings, type=pa.large_string())
    except UnicodeEncodeError as exc:
        raise CurateError(
            f"a text is not valid Unicode ({exc.reason}: {exc.object[exc.start : exc.end]!r}); "
            f"repair it first, e.g. `s.encode('utf-8', 'replace').decode()`"
        ) from exc
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[: len(strings) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else _NO_BYTES
    return data[: offsets[-1]], offsets


_NO_BYTES = np.zeros(0, dtype=np.uint8)
_SPACE = 0x20
_VOWEL = np.zeros(256, dtype=bool)
_VOWEL[list(b"aeiouy")] = True


def _drop(data: np.ndarray, offsets: np.ndarray, drop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove the bytes where ``drop`` is true, moving the document offsets accordingly."""
    kept_before = np.concatenate(([0], np.cumsum(~drop)))  # (B + 1,)
    return data[~drop], kept_before[offsets]


def _skeletonize(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`Fold.SKELETON` applied to the bytes of ``Fold.WORDS`` keys, without Python loops.

    Equal to ``shingle_key(text, Fold.SKELETON)`` (tested): the keys hold only ``\\w``
    characters and single spaces, so "not at a word's start" is "after a non-space byte of the
    same key", and ASCII bytes never occur inside a multi-byte UTF-8 character.
    """
    data = data.copy()
    data[data == ord("v")] = ord("u")
    data[data == ord("j")] = ord("i")
    doc_start = offsets[:-1][offsets[:-1] < offsets[1:]]  # first byte of each non-empty key
    inside = np.zeros(data.size, dtype=bool)  # (B,) byte follows a byte of the same word
    inside[1:] = data[:-1] != _SPACE
    inside[doc_start] = False
    data, offsets = _drop(data, offsets, _VOWEL[data] & inside)
    repeat = np.zeros(data.size, dtype=bool)  # (B',) an ASCII byte equal to the one before
    repeat[1:] = (data[1:] == data[:-1]) & (data[1:] < 0x80) & (data[1:] != _SPACE)
    repeat[offsets[:-1][offsets[:-1] < offsets[1:]]] = False
    return _drop(data, offsets, repeat)


def _word_layout(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where the words are: ``(letter, first, lengths, word_offsets)``.

    ``letter`` ``(L,)``: positions of the non-space bytes; ``first`` ``(W,)``: index into
    ``letter`` of each word's first byte; ``lengths`` ``(W,)``: bytes per word;
    ``word_offsets`` ``(N + 1,)``: key ``d``'s words are ``word_offsets[d]:word_offsets[d+1]``.
    """
    is_space = data == _SPACE
    starts = np.zeros(data.size, dtype=bool)  # (B,) first byte of a word
    starts[1:] = is_space[:-1]
    starts[offsets[:-1][offsets[:-1] < offsets[1:]]] = True  # each non-empty key's first byte
    starts &= ~is_space
    letter = np.flatnonzero(~is_space)  # (L,)
    first = np.flatnonzero(starts[letter])  # (W,)
    lengths = np.diff(np.append(first, letter.size))  # (W,)
    word_offsets = np.searchsorted(np.flatnonzero(starts), offsets).astype(np.int64)  # (N + 1,)
    return letter, first, lengths, word_offsets


def word_hashes(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hash every word of every key, vectorised over the batch's UTF-8 bytes.

    Args:
        data: ``(B,) uint8`` the keys' UTF-8 bytes back to back; each key's words separated by
            single spaces, no leading or trailing space (see :func:`shingle_key`).
        offsets: ``(N + 1,) int64``: key ``d`` is ``data[offsets[d]:offsets[d+1]]``.

    Returns:
        ``(hashes, word_offsets)``: ``(W,) uint64`` word hashes of all keys concatenated, and
        ``(N + 1,) int64``: key ``d``'s words are ``hashes[word_offsets[d]:word_offsets[d+1]]``.
    """
    letter, first, lengths, word_offsets = _word_layout(data, offsets)
    within = np.arange(letter.size) - np.repeat(first, lengths)  # (L,) byte index in its word
    powers = _powers(_P, int(lengths.max(initial=0)))
    terms = (data[letter].astype(np.uint64) + np.uint64(1)) * powers[within]  # (L,)
    sums = np.add.reduceat(terms, first) if first.size else np.zeros(0, dtype=np.uint64)
    hashes = fmix64(sums + lengths.astype(np.uint64) * np.uint64(_LEN))
    return hashes, word_offsets


def word_chars(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(W,) int64`` characters (not bytes) of each word, in :func:`word_hashes` order."""
    letter, first, _, _ = _word_layout(data, offsets)
    is_char = ((data[letter] & 0xC0) != 0x80).astype(np.int64)  # not a continuation byte
    return np.add.reduceat(is_char, first) if first.size else np.zeros(0, dtype=np.int64)


def _shingles_from_words(
    words: np.ndarray, word_offsets: np.ndarray, ngram: int
) -> tuple[np.ndarray, np.ndarray]:
    """Combine word hashes into shingle hashes; see :func:`shingle_hashes` for the layout."""
    n_words = np.diff(word_offsets)  # (N,)
    n_shingles = np.where(n_words > 0, np.maximum(n_words - ngram + 1, 1), 0)  # (N,)
    offsets = np.concatenate(([0], np.cumsum(n_shingles))).astype(np.int64)  # (N + 1,)
    doc = np.repeat(np.arange(n_words.size), n_shingles)  # (S,) document of each shingle
    start = word_offsets[doc] + np.arange(offsets[-1]) - offsets[doc]  # (S,) its first word
    width = np.minimum(n_words, ngram)[doc].astype(np.uint64)  # (S,) words in it
    acc = width.copy()  # a shingle's word count is part of it: a 2-word doc is no 3-gram
    for j, qj in enumerate(_powers(_Q, ngram)):
        take = width > j
        acc[take] += words[start[take] + j] * qj
    return fmix64(acc), offsets


def shingle_hashes(
    texts: TextColumn, *, ngram: int = 3, fold: Fold = Fold.SKELETON
) -> tuple[np.ndarray, np.ndarray]:
    """Hash the word n-gram shingles of every document.

    Args:
        texts: ``(N,)`` documents; a null counts as an empty document.
        ngram: Words per shingle.
        fold: How documents are canonicalised first (see :class:`Fold`).

    Returns:
        ``(hashes, offsets)``: ``(S,) uint64`` shingle hashes, document after document, in
        order of occurrence (repeats kept), and ``(N + 1,) int64`` offsets: document ``d`` owns
        ``hashes[offsets[d]:offsets[d+1]]``; ``max(n_words - ngram + 1, 1)`` of them, or none
        when its key has no words.

    Raises:
        CurateError: ``texts`` is not a column of strings, or ``ngram < 1``.
    """
    if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
        raise CurateError(f"ngram must be a positive int (words per shingle), not {ngram!r}")
    base = Fold.WORDS if fold is Fold.SKELETON else fold  # the rest of SKELETON is on bytes
    data, offsets = utf8_buffer([shingle_key(t, base) if t else "" for t in as_texts(texts)])
    if fold is Fold.SKELETON:
        data, offsets = _skeletonize(data, offsets)
    words, word_offsets = word_hashes(data, offsets)
    return _shingles_from_words(words, word_offsets, ngram)


def shingle_hashes_naive(
    text: str | None, *, ngram: int = 3, fold: Fold = Fold.SKELETON
) -> list[int]:
    """Reference for :func:`shingle_hashes` on one document: plain Python integers, no numpy."""
    key = shingle_key(text, fold) if text else ""
    hashes = []
    for word in key.split():
        data = word.encode("utf-8")
        h = sum((b + 1) * pow(_P, k, 1 << 64) for k, b in enumerate(data)) & _MASK
        hashes.append(_fmix64_int((h + len(data) * _LEN) & _MASK))
    if not hashes:
        return []
    width = min(len(hashes), ngram)
    out = []
    for start in range(len(hashes) - width + 1):
        acc = width + sum(hashes[start + j] * pow(_Q, j, 1 << 64) for j in range(width))
        out.append(_fmix64_int(acc & _MASK))
    return out


def shingle_set(text: str | None, *, ngram: int = 3, fold: Fold = Fold.SKELETON) -> set[str]:
    """The shingles of one document as strings (words joined by spaces), for exact Jaccard."""
    words = (shingle_key(text, fold) if text else "").split()
    if not words:
        return set()
    width = min(len(words), ngram)
    return {" ".join(words[i : i + width]) for i in range(len(words) - width + 1)}
