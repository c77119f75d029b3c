"""Shared helpers of the loader tests: synthetic corpora, a reference reader, batch comparison."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from tokenloom.loader import PackedArrays, Spans, token_ranges

EOS = 0
PAD = -1
SEQ_LENS = (1, 2, 7, 16)


def make_rows(lengths: Sequence[int], *, id_step: int = 3) -> dict[int, np.ndarray]:
    """Rows ``id -> tokens``; ids ``5, 5 + id_step, ...``; every token id in the corpus distinct.

    Token ids are ``1, 2, ...`` in row order, so they never equal ``EOS`` (0) or ``PAD`` (-1) and
    each identifies exactly one (row, position).
    """
    rows: dict[int, np.ndarray] = {}
    nxt = 1
    for i, n in enumerate(lengths):
        rows[5 + id_step * i] = np.arange(nxt, nxt + n, dtype=np.int64)
        nxt += n
    return rows


def columns(rows: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(row_ids, n_tokens)`` as the loader's filter scan returns them (ascending ids)."""
    ids = np.array(sorted(rows), dtype=np.int64)
    return ids, np.array([len(rows[i]) for i in ids], dtype=np.int64)


def gather(
    spans: Spans, rows: dict[int, np.ndarray], *, lookahead: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The reader's side of the pack contract, done the obvious way: slice each stretch."""
    start, stop = token_ranges(spans, lookahead=lookahead)
    parts = [rows[int(r)][a:b] for r, a, b in zip(spans.row_id, start, stop, strict=True)]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in parts])
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return tokens.astype(np.int32), offsets  # int32, like a Lance token column


FIELDS = (
    "input_ids",
    "labels",
    "position_ids",
    "doc_ids",
    "cu_seqlens",
    "max_seqlen",
    "continues",
    "spans",
    "real_tokens",
    "eos_positions",
    "padding_positions",
    "loss_positions",
)


def assert_packed_equal(got: PackedArrays, want: PackedArrays) -> None:
    """Every field equal, arrays with equal dtype and shape."""
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            assert np.array_equal(a, b), (name, a, b)
        else:
            assert a == b, (name, a, b)


@st.composite
def corpora(draw: st.DrawFn, max_docs: int = 10) -> tuple[int, list[int]]:
    """``(seq_len, lengths)``: lengths around the block size, including 0, 1, L-1, L, L+1, 50 L."""
    L = draw(st.sampled_from(SEQ_LENS))
    special = st.sampled_from([0, 1, max(L - 1, 0), L, L + 1, 50 * L])
    lengths = draw(st.lists(st.one_of(special, st.integers(0, 3 * L)), max_size=max_docs))
    return L, lengths


seeds = st.integers(0, 2**63)
epochs = st.integers(0, 5)
