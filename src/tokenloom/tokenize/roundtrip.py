"""Check that ``decode(encode(text)) == text``, and say where it is not.

A byte-level BPE (GPT-2's, or one from :func:`~tokenloom.tokenize.train_bpe`) must round-trip
every valid text; a tokenizer with a normalizer (lower-casing, NFKC) or an unknown token will not,
and the failures show what it loses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.tokenize.base import EncodeError, TextBatch, Tokenizer, texts_to_list

__all__ = ["RoundtripFailure", "roundtrip_failures", "first_difference"]

_SNIPPET = 20
"""Characters shown on each side of the first difference."""
_CHUNK = 512
"""Texts encoded and decoded per batch, to bound memory on a large corpus."""


@dataclass(frozen=True, kw_only=True)
class RoundtripFailure:
    """One text that did not come back unchanged."""

    index: int
    """Position of the text in the input."""
    id: Any
    """The caller's id for the text (``ids[index]``), or ``None`` when no ids were given."""
    position: int
    """First character at which the decoded text differs from the original."""
    expected: str
    """The original text around ``position``."""
    got: str
    """The decoded text around ``position``."""
    chars: int
    """Length of the original text."""
    decoded_chars: int
    """Length of the decoded text."""


def first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (``min(len)`` if one is a prefix).

    Binary search on slice equality, so the comparisons run in C.
    """
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def roundtrip_failures(
    tokenizer: Tokenizer,
    texts: TextBatch,
    ids: Sequence[Any] | pa.Array | None = None,
    *,
    sample: int | None = None,
    seed: int = 0,
    encoded: pa.Array | pa.ChunkedArray | None = None,
) -> list[RoundtripFailure]:
    """Encode and decode texts and return those that do not come back unchanged.

    Args:
        tokenizer: The tokenizer to check.
        texts: The texts (nulls are skipped).
        ids: Optional row ids, one per text, reported in each failure.
        sample: Check only this many texts, drawn without replacement with ``seed``
            (all when ``None`` or at least ``len(texts)``).
        seed: Seed of the sample.
        encoded: Ids already computed for ``texts`` (e.g. a stored ``input_ids`` column), checked
            instead of encoding again.

    Returns:
        The failures, in input order; empty when every checked text round-trips.

    Raises:
        ValueError: ``ids`` or ``encoded`` has another length than ``texts``, or ``sample < 1``.
        EncodeError: the tokenizer fails on a text; the message names its row id (or index).
    """
    items = texts_to_list(texts)
    n = len(items)
    for what, other in (("ids", ids), ("encoded", encoded)):
        if other is not None and len(other) != n:
            raise ValueError(f"{what} has {len(other)} entries but texts has {n}; pass one each")
    if sample is not None and sample < 1:
        raise ValueError(f"sample must be at least 1, got {sample}")
    if sample is None or sample >= n:
        order = np.arange(n)
    else:
        order = np.sort(np.random.default_rng(seed).choice(n, size=sample, replace=False))
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    id_list = ids.to_pylist() if isinstance(ids, pa.Array | pa.ChunkedArray) else ids

    failures: list[RoundtripFailure] = []
    for start in range(0, len(order), _CHUNK):
        chunk = order[start : start + _CHUNK].tolist()
        batch = [items[i] for i in chunk]
        if encoded is None:
            try:
                token_ids = tokenizer.encode_batch(batch)
            except EncodeError as exc:
                at = chunk[exc.index]
                row = f"text {at}" if id_list is None else f"row id {id_list[at]}"
                raise EncodeError(f"{row}: {exc}", at) from None
        else:
            token_ids = encoded.take(pa.array(chunk, type=pa.int64()))
        for i, text, decoded in zip(chunk, batch, tokenizer.decode_batch(token_ids), strict=True):
            if text is None or decoded == text:
                continue
            decoded = decoded or ""
            pos = first_difference(text, decoded)
            lo = max(0, pos - _SNIPPET)
            failures.append(
                RoundtripFailure(
                    index=i,
                    id=None if id_list is None else id_list[i],
                    position=pos,
                    expected=text[lo : pos + _SNIPPET],
                    got=decoded[lo : pos + _SNIPPET],
                    chars=len(text),
                    decoded_chars=len(decoded),
                )
            )
    return failures
