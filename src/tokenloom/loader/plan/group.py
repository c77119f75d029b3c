"""Several consecutive steps packed with one call, then handed out step by step.

:func:`pack_group` packs the ``k * B`` blocks of ``k`` steps as one ``(k * B, L)`` batch with
:func:`~tokenloom.loader.plan.pack.pack_blocks` and records where each step's rows, stretches and
segments are. :meth:`PackedGroup.step` returns step ``i`` exactly as ``pack_blocks`` of that
step's ``B`` blocks alone would: every block starts a segment and no label crosses a block, so a
block's row never depends on its neighbours. The numpy work is done once per group instead of once
per step (a step's arrays are views into the group's), which is what keeps the per-step cost of
the loader far below the time ``take`` needs for its rows. Pure numpy.

:class:`~tokenloom.loader.pipeline.transit.BuiltGroup` carries a packed group from the I/O thread
(or a DataLoader worker) to the training process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.pack import PackedArrays, TokenSource, pack_blocks
from tokenloom.loader.plan.spans import Spans

__all__ = ["PackedGroup", "pack_group"]


@dataclass(frozen=True, kw_only=True, eq=False)
class PackedGroup:
    """``k`` steps of ``B`` blocks packed at once (arrays are the whole group's)."""

    steps: int
    """``k``."""
    blocks_per_step: int
    """``B``."""
    arrays: Any
    """``(4, k * B, L)`` int64: ``input_ids``, ``labels``, ``position_ids``, ``doc_ids``; step
    ``i`` is rows ``[i * B, (i + 1) * B)``. A numpy array, or a torch tensor in shared memory
    once a DataLoader worker hands the group over (then :meth:`step` slices it the same way)."""
    continues: np.ndarray
    """``(k * B,)`` bool."""
    cu_seqlens: np.ndarray
    """``(num_segments + 1,)`` int32 over the flattened ``k * B * L`` positions."""
    segment_bounds: np.ndarray
    """``(k + 1,)`` int64: step ``i``'s segments are ``cu_seqlens[b[i]:b[i + 1]]``."""
    spans: np.ndarray
    """``(S, 5)`` int64 provenance, the block column already relative to its step."""
    context: np.ndarray | None
    """``(S, 2)`` int64 context-only token ranges, or ``None``."""
    stretch_bounds: np.ndarray
    """``(k + 1,)`` int64: step ``i``'s stretches are rows ``[b[i], b[i + 1])`` of ``spans``."""
    max_seqlen: np.ndarray
    """``(k,)`` int64: longest segment of each step."""
    real_tokens: np.ndarray
    """``(k,)`` int64 (and so are the next four): per-step counters of :class:`PackedArrays`."""
    eos_positions: np.ndarray
    padding_positions: np.ndarray
    loss_positions: np.ndarray
    context_positions: np.ndarray
    masked_positions: np.ndarray | None = None
    """``(k,)`` int64 labels a loss mask set to ``-100`` per step (``None``: no mask)."""
    masked_blocks: np.ndarray | None = None
    """``(k * B,)`` int64 of them per block (``None``: no mask)."""
    block_counts: np.ndarray | None = None
    """``(2, k * B)`` int64 padding positions and positions whose label trains, per block, as
    the compiled packer counted them (``None``: count them on the arrays)."""

    @property
    def input_ids(self) -> np.ndarray:
        return self.arrays[0]

    @property
    def labels(self) -> np.ndarray:
        return self.arrays[1]

    @property
    def position_ids(self) -> np.ndarray:
        return self.arrays[2]

    @property
    def doc_ids(self) -> np.ndarray:
        return self.arrays[3]

    def step(self, i: int) -> PackedArrays:
        """Step ``i`` of the group, equal field by field to ``pack_blocks`` of its blocks (its
        four ``(B, L)`` arrays are views of :attr:`arrays`)."""
        B = self.blocks_per_step
        rows = slice(i * B, (i + 1) * B)
        a, b = int(self.stretch_bounds[i]), int(self.stretch_bounds[i + 1])
        c, d = int(self.segment_bounds[i]), int(self.segment_bounds[i + 1])
        arrays = self.arrays
        flat = i * B * arrays.shape[2]
        return PackedArrays(
            input_ids=arrays[0, rows],
            labels=arrays[1, rows],
            position_ids=arrays[2, rows],
            doc_ids=arrays[3, rows],
            cu_seqlens=self.cu_seqlens[c : d + 1] - np.int32(flat),
            max_seqlen=int(self.max_seqlen[i]),
            continues=self.continues[rows],
            spans=self.spans[a:b],
            real_tokens=int(self.real_tokens[i]),
            eos_positions=int(self.eos_positions[i]),
            padding_positions=int(self.padding_positions[i]),
            loss_positions=int(self.loss_positions[i]),
            context=None if self.context is None else self.context[a:b],
            context_positions=int(self.context_positions[i]),
            masked_positions=0 if self.masked_positions is None else int(self.masked_positions[i]),
            masked_blocks=None if self.masked_blocks is None else self.masked_blocks[rows],
        )


def pack_group(
    spans: Spans,
    tokens: np.ndarray | TokenSource,
    token_offsets: np.ndarray,
    *,
    steps: int,
    blocks_per_step: int,
    seq_len: int,
    eos_id: int,
    pad_id: int,
    lookahead: bool,
    out: np.ndarray | None = None,
    masked: np.ndarray | None = None,
    overlap_loss: bool = False,
    compiled: bool = True,
) -> PackedGroup:
    """Pack ``k`` steps' stretches with one :func:`~tokenloom.loader.plan.pack.pack_blocks` call.

    Args:
        spans: The stretches of the group's ``k * B`` blocks, step after step (step ``i``'s
            blocks are indices ``[i * B, (i + 1) * B)`` of ``spans.blocks``).
        tokens, token_offsets: As :func:`~tokenloom.loader.plan.pack.pack_blocks`.
        steps: ``k``.
        blocks_per_step: ``B``.
        seq_len, eos_id, pad_id, lookahead, out, masked, overlap_loss, compiled: As
            :func:`~tokenloom.loader.plan.pack.pack_blocks` (``out`` of shape ``(4, k * B, L)``).

    Returns:
        The :class:`PackedGroup`.

    Raises:
        PlanError: The inputs break :func:`~tokenloom.loader.plan.pack.pack_blocks`' contract, or
            ``spans.blocks`` does not hold ``k * B`` blocks.
    """
    k, B, L = int(steps), int(blocks_per_step), int(seq_len)
    if k < 1 or B < 1 or len(spans.blocks) != k * B:
        raise PlanError(
            f"a group of {k} steps of {B} blocks needs {k * B} blocks, got {len(spans.blocks)}"
        )
    if out is None:
        out = np.empty((4, k * B, L), dtype=np.int64)
    packed = pack_blocks(
        spans,
        tokens,
        token_offsets,
        num_blocks_in_batch=k * B,
        seq_len=L,
        eos_id=eos_id,
        pad_id=pad_id,
        lookahead=lookahead,
        out=out,
        masked=masked,
        overlap_loss=overlap_loss,
        compiled=compiled,
    )
    step_of = spans.block // B  # (S,) step of each stretch within the group
    stretch_bounds = np.searchsorted(spans.block, np.arange(k + 1, dtype=np.int64) * B)
    cu = packed.cu_seqlens
    # every block start is a segment boundary, so each step starts exactly at one of them
    segment_bounds = np.searchsorted(cu, np.arange(k + 1, dtype=np.int64) * (B * L))
    max_seqlen = np.maximum.reduceat(np.diff(cu), segment_bounds[:-1]).astype(np.int64)

    def per_step(weights: np.ndarray | None, where: np.ndarray | None = None) -> np.ndarray:
        idx = step_of if where is None else step_of[where]
        w = weights if weights is None or where is None else weights[where]
        return np.bincount(idx, weights=w, minlength=k).astype(np.int64)

    ntok = spans.tok_end - spans.tok_start
    real = per_step(ntok)
    eos = per_step(spans.has_eos)
    windowed = spans.ctx_end is not None or spans.ends_window is not None
    if windowed:
        if packed.block_counts is not None:
            loss = packed.block_counts[1].reshape(k, B).sum(axis=1)
        else:
            loss = (packed.labels.reshape(k, B * L) != -100).sum(axis=1).astype(np.int64)
        ctx = packed.context
        assert ctx is not None  # windowed spans always carry context ranges
        context_positions = per_step(ctx[:, 1] - ctx[:, 0])
    else:
        lost = np.zeros(k, dtype=np.int64)
        if not lookahead:
            lost = per_step(None, ~spans.has_eos & (spans.tok_end != spans.doc_len))
        loss = real - lost
        if packed.masked_blocks is not None:
            loss -= packed.masked_blocks.reshape(k, B).sum(axis=1)
        context_positions = np.zeros(k, dtype=np.int64)
    masked_steps = None
    if packed.masked_blocks is not None:
        masked_steps = packed.masked_blocks.reshape(k, B).sum(axis=1).astype(np.int64)
    provenance = packed.spans  # a fresh array of pack_blocks: made step-relative in place
    provenance[:, 0] -= step_of * B
    return PackedGroup(
        steps=k,
        blocks_per_step=B,
        arrays=out,
        continues=packed.continues,
        cu_seqlens=cu,
        segment_bounds=segment_bounds,
        spans=provenance,
        context=packed.context,
        stretch_bounds=stretch_bounds,
        max_seqlen=max_seqlen,
        real_tokens=real,
        eos_positions=eos,
        padding_positions=B * L - real - eos,
        loss_positions=loss,
        context_positions=context_positions,
        masked_positions=masked_steps,
        masked_blocks=packed.masked_blocks,
        block_counts=packed.block_counts,
    )
