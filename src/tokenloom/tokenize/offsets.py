"""Where each stored token lies in its document's text: character ranges per token id.

A loss-mask backfill finds spans of *text* (an email address, a license header) and must name
them as token positions of the token column. The ranges are derived from the stored ids, never
from a fresh tokenization alone, and a row whose ids do not spell its text is refused:

* tiktoken: each id's bytes (``decode_single_token_bytes``), summed along the row; a token that
  ends inside a multi-byte character covers that whole character.
* Hugging Face ``tokenizers``: the encoding's offsets of the text, used only when the encoding's
  ids equal the stored ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenloom.tokenize.base import Tokenizer, TokenizerError

__all__ = ["TokenTextMismatch", "token_char_ranges", "tokens_touching"]


class TokenTextMismatch(TokenizerError):
    """A row's stored ids do not spell its text with this tokenizer."""


class _ByteLengths:
    """Bytes of every id of a tiktoken encoding, computed once per tokenizer."""

    _cache: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, tok: Any) -> np.ndarray:
        key = id(tok)
        if key not in cls._cache:
            enc = tok._enc
            lens = np.zeros(tok.vocab_size, dtype=np.int64)
            for i in range(tok.vocab_size):
                try:
                    lens[i] = len(enc.decode_single_token_bytes(i))
                except KeyError:  # a gap in the ids (no token)
                    lens[i] = 0
            cls._cache[key] = lens
        return cls._cache[key]


def token_char_ranges(tok: Tokenizer, text: str, ids: np.ndarray) -> np.ndarray:
    """``(n, 2)`` int64 ``[start, end)`` character range of each of the row's ``n`` ids.

    Raises:
        TokenTextMismatch: The ids do not spell ``text`` with ``tok``.
        TokenizerError: The tokenizer's backend gives no offsets.
    """
    ids = np.asarray(ids, dtype=np.int64)
    from tokenloom.tokenize.hf import HFTokenizer
    from tokenloom.tokenize.tiktoken_backend import TiktokenTokenizer

    if isinstance(tok, TiktokenTokenizer):
        raw = text.encode("utf-8", "surrogatepass")
        if tok._enc.decode_bytes(ids.tolist()) != raw:
            raise TokenTextMismatch("the stored ids do not spell the text")
        ends = np.cumsum(_ByteLengths.of(tok)[ids])  # (n,) byte end of each token
        starts = ends - _ByteLengths.of(tok)[ids]
        b = np.frombuffer(raw, dtype=np.uint8)
        first = (b & 0xC0) != 0x80  # (bytes,) the byte starts a character
        char_of = np.cumsum(first) - 1  # (bytes,) character holding each byte
        char_of = np.append(char_of, len(text))  # one past the end
        lo = char_of[starts]
        hi = np.where(ends > starts, char_of[np.maximum(ends - 1, 0)] + 1, lo)
        return np.stack([lo, hi], axis=1).reshape(-1, 2)
    if isinstance(tok, HFTokenizer):
        enc = tok._tok.encode(text, add_special_tokens=False)
        if not np.array_equal(np.asarray(enc.ids, dtype=np.int64), ids):
            raise TokenTextMismatch("the stored ids differ from the tokenizer's ids of the text")
        return np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    raise TokenizerError(
        f"tokenizer {tok.name!r} ({type(tok).__name__}) gives no token offsets; loss masks from "
        "text need a tiktoken or Hugging Face tokenizer"
    )


def tokens_touching(ranges: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Token spans covering every token whose characters overlap a text span.

    Args:
        ranges: ``(n, 2)`` character range of each token (:func:`token_char_ranges`).
        spans: ``(m, 2)`` character spans ``[start, end)`` (any order, overlaps allowed).

    Returns:
        ``(k, 2)`` int64 sorted, disjoint ``[start, end)`` token spans (runs of touched tokens).
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    spans = spans[spans[:, 1] > spans[:, 0]]
    if not len(spans) or not len(ranges):
        return np.zeros((0, 2), dtype=np.int64)
    order = np.argsort(spans[:, 0], kind="stable")
    s, e = spans[order, 0], np.maximum.accumulate(spans[order, 1])
    # the last span starting before each token ends; the running max of ends covers overlaps
    k = np.searchsorted(s, ranges[:, 1], side="left") - 1
    hit = (k >= 0) & (e[np.maximum(k, 0)] > ranges[:, 0]) & (ranges[:, 1] > ranges[:, 0])
    edges = np.diff(np.concatenate([[0], hit.astype(np.int8), [0]]))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1)
