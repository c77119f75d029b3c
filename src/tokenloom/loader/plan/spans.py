"""Which stretches of which documents each block holds, found by binary search on the plan.

A *stretch* is the part of one document that falls inside one block: some of its tokens and,
possibly, its EOS. For a block ``[lo, hi)`` of the stream the documents it touches are the ``k``
with ``starts[k] < hi`` and ``starts[k + 1] > lo``: a contiguous range found with two
``np.searchsorted`` calls over the offsets of the few documents around the requested blocks
(:meth:`~tokenloom.loader.plan.epoch.EpochPlan.covering`; the plan does not store every offset). The
work is O(len(blocks) * (log n + MARK_EVERY) + stretches), independent of how long the documents
are: a document of millions of tokens costs one stretch per block it spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenloom.loader.plan.epoch import EpochPlan, PlanError

__all__ = ["Spans", "block_spans"]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Spans:
    """The stretches of the requested blocks, ordered by block then position. Arrays: ``(S,)``."""

    seq_len: int
    """Positions per block of the plan."""
    blocks: np.ndarray
    """``(num_requested,)`` int64: the block indices asked for (``-1`` = padding block)."""
    block: np.ndarray
    """int64: index into :attr:`blocks` of the block holding the stretch."""
    pos: np.ndarray
    """int64: position in the block where the stretch starts."""
    doc: np.ndarray
    """int64: index of the document in the plan's visiting order."""
    row_id: np.ndarray
    """int64: table ``id`` of the document."""
    doc_len: np.ndarray
    """int64: tokens of the whole document (its ``n_tokens``)."""
    tok_start: np.ndarray
    """int64: first token of the document in the stretch."""
    tok_end: np.ndarray
    """int64: one past the last token in the stretch (EOS excluded); ``tok_start == tok_end ==
    doc_len`` for a stretch holding only the EOS."""
    has_eos: np.ndarray
    """bool: the stretch ends with the document's EOS, inside this block."""
    ctx_end: np.ndarray | None = None
    """Optional int64: tokens ``[tok_start, ctx_end)`` of the stretch are *context only* (a long
    document's window repeating the end of the previous window,
    :mod:`~tokenloom.loader.plan.window`): they are input, but no label targets them. ``None`` (the
    default planners), or any value ``<= tok_start``, means no context."""
    ends_window: np.ndarray | None = None
    """Optional bool: the stretch ends its window (a virtual document, never with the EOS) and the
    next window of the document re-reads its last tokens as context and trains the target that
    follows; so the stretch's last label is ``-100`` and no lookahead token is read for it.
    ``None`` means all ``False``."""

    def __len__(self) -> int:
        return int(self.block.shape[0])

    @property
    def length(self) -> np.ndarray:
        """``(S,)`` int64: positions the stretch occupies, ``tok_end - tok_start + has_eos``."""
        return self.tok_end - self.tok_start + self.has_eos


def block_spans(plan: EpochPlan, blocks: np.ndarray) -> Spans:
    """The stretches of documents held by each of ``blocks``.

    Args:
        plan: The epoch plan.
        blocks: ``(m,)`` block indices in ``[0, plan.num_blocks)``, or ``-1`` for a padding block
            (which holds no stretch), e.g. the output of
            :func:`~tokenloom.loader.plan.epoch.step_blocks`.

    Returns:
        :class:`Spans`, ordered by ``block`` (the index into ``blocks``) then ``pos``. Within a
        block the stretches are contiguous and start at position 0; the block's last stretch ends
        at ``seq_len`` except in the epoch's last block.

    Raises:
        PlanError: ``blocks`` is not 1-D or holds an index outside ``[-1, num_blocks)``.
    """
    req = np.asarray(blocks)
    if req.ndim != 1 or (req.size and not np.issubdtype(req.dtype, np.integer)):
        raise PlanError(f"blocks must be a 1-D integer array, got {req.dtype} {req.shape}")
    req = req.astype(np.int64, copy=False)
    if req.size and (int(req.min()) < -1 or int(req.max()) >= plan.num_blocks):
        bad = req[(req < -1) | (req >= plan.num_blocks)][0]
        raise PlanError(f"block {bad} is outside the epoch's blocks [0, {plan.num_blocks}) or -1")

    L = plan.seq_len
    real = np.flatnonzero(req >= 0)  # (m',) indices into blocks
    lo = req[real] * L  # (m',) block start in the stream
    hi = np.minimum(lo + L, plan.stream_len)  # (m',) block end (last block is short)
    if real.size:
        # (D,) the documents around the blocks, ascending, with their stream offsets
        docs, starts, sizes = plan.covering(lo, hi)
    else:
        docs = starts = sizes = np.zeros(0, dtype=np.int64)
    first = np.searchsorted(starts, lo, side="right") - 1  # last doc starting at or before lo
    last = np.searchsorted(starts, hi, side="left") - 1  # last doc starting before hi
    counts = last - first + 1  # (m',) >= 1: every position belongs to exactly one doc

    total = int(counts.sum())
    offsets = np.cumsum(counts) - counts  # (m',) first stretch of each block
    which = np.repeat(np.arange(real.shape[0]), counts)  # (S,) requested real block of stretch
    local = np.repeat(first, counts) + (np.arange(total) - np.repeat(offsets, counts))
    doc = docs[local]
    blk_lo, blk_hi = lo[which], hi[which]
    d_start, d_size = starts[local], sizes[local]
    d_end = d_start + d_size  # the doc's stream range, EOS included
    s0 = np.maximum(d_start, blk_lo)
    s1 = np.minimum(d_end, blk_hi)
    doc_len = d_size - 1
    return Spans(
        seq_len=L,
        blocks=req,
        block=real[which].astype(np.int64, copy=False),
        pos=s0 - blk_lo,
        doc=doc,
        row_id=plan.doc_rows(doc),
        doc_len=doc_len,
        tok_start=s0 - d_start,
        tok_end=np.minimum(s1 - d_start, doc_len),
        has_eos=s1 == d_end,
    )
