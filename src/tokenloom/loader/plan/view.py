"""One epoch seen step by step: which blocks, stretches and token ranges each step holds.

:class:`EpochView` is the one place a global step is laid out. The dataset reads and packs its
layouts; the ledger, ``trace`` and ``verify`` pack the same layouts with placeholder tokens
(:meth:`EpochView.skeleton`): labels, positions, padding and provenance depend on the layout
only, never on the ids, so what they count is what the loader delivers. Pure numpy: no Lance, no
torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tokenloom.loader.plan.epoch import (
    BlockCounts,
    EpochSteps,
    PlanError,
    epoch_steps,
    step_blocks,
    steps_blocks,
)
from tokenloom.loader.plan.group import PackedGroup, pack_group
from tokenloom.loader.plan.pack import PackedArrays, TokenSource, pack_blocks, token_ranges
from tokenloom.loader.plan.spans import Spans
from tokenloom.loader.plan.stream.topology import split_global_batch

__all__ = [
    "BlockPlan",
    "StepLayout",
    "GroupLayout",
    "StepCounts",
    "GroupCounts",
    "EpochView",
    "block_steps",
    "COUNT_FIELDS",
]

COUNT_FIELDS = (
    "blocks",
    "body_tokens",
    "separator_tokens",
    "padding_positions",
    "loss_positions",
    "overlap_tokens",
    "masked_tokens",
)
"""Per-pool counters of :class:`StepCounts`, in this order (``masked_tokens``: labels a
loss-mask column set to ``-100``, :mod:`~tokenloom.loader.pipeline.lossmask`)."""

_SCAN_BLOCKS = 1 << 16  # blocks per chunk when searching an epoch for rows


@runtime_checkable
class BlockPlan(Protocol):
    """What every epoch planner returns (concat, windows, best-fit, mixture)."""

    seed: int
    epoch: int
    seq_len: int
    num_blocks: int
    num_tokens: int
    padding_positions: int

    def spans(self, blocks: np.ndarray) -> Spans:
        """The stretches held by ``blocks`` (``-1``: a padding block), by block then position."""
        ...

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """Tokens, EOS and filled positions of blocks ``[lo, hi)`` (clipped to the epoch)."""
        ...

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` mixture pool of each block (0 without a mixture; -1 for a padding block)."""
        ...


def block_steps(
    blocks: np.ndarray, *, global_batch: int, steps: int, order: str
) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`~tokenloom.loader.plan.epoch.step_blocks` over the global batch.

    Args:
        blocks: ``(m,)`` block indices ``>= 0``.
        global_batch: ``G``.
        steps: Global steps in the epoch ``S``.
        order: ``"sequential"`` or ``"interleave"``.

    Returns:
        ``(step, slot)``: the global step holding each block and its slot in the global batch.
    """
    b = np.asarray(blocks, dtype=np.int64)
    if order == "interleave":
        return b % max(steps, 1), b // max(steps, 1)
    return b // global_batch, b % global_batch


@dataclass(frozen=True, kw_only=True, eq=False)
class StepLayout:
    """One rank's share of one global step, before any token is read."""

    step: int
    """Global step within the epoch."""
    blocks: np.ndarray
    """``(B,)`` plan block of each batch row (``-1``: a whole padding block)."""
    spans: Spans
    """The stretches of those blocks."""
    starts: np.ndarray
    """``(S,)`` first token of each stretch to read (context and lookahead included)."""
    stops: np.ndarray
    """``(S,)`` one past the last token to read."""
    pools: np.ndarray
    """``(B,)`` mixture pool of each block (0 without a mixture; -1 for a padding block)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class GroupLayout:
    """One rank's share of ``k`` consecutive global steps, laid out together (no I/O)."""

    steps: np.ndarray
    """``(k,)`` global steps, ascending and consecutive."""
    blocks_per_step: int
    """``B``: this rank's blocks per step."""
    blocks: np.ndarray
    """``(k * B,)`` plan blocks, step after step (``-1``: a whole padding block)."""
    spans: Spans
    """The stretches of those blocks (``spans.block`` indexes :attr:`blocks`)."""
    starts: np.ndarray
    """``(S,)`` first token of each stretch to read (context and lookahead included)."""
    stops: np.ndarray
    """``(S,)`` one past the last token to read."""
    pools: np.ndarray
    """``(k * B,)`` mixture pool of each block (0 without a mixture; -1 for a padding block)."""
    sources: tuple = ()
    """Across a stream change (:class:`~tokenloom.loader.plan.change.SplicedView`):
    ``((end, source), ...)``, stretches ``[previous end, end)`` are read by ``source`` (the
    phase's :class:`~tokenloom.loader.pipeline.planner.Planner`: its table version and rows); empty:
    all by the reader's own planner."""


@dataclass(frozen=True, kw_only=True, eq=False)
class StepCounts:
    """What one packed step (or one rank's share) holds, per mixture pool."""

    counts: np.ndarray
    """``(P, len(COUNT_FIELDS))`` int64: blocks, body tokens (context excluded), EOS, padding,
    loss positions and context-only tokens of each pool. A whole padding block completing the
    last step counts as padding of pool 0."""
    starts: tuple[np.ndarray, ...]
    """Per pool, table ids of the documents whose first token is in the step (a document seen
    twice, as in a repeated mixture pass, appears twice over the run)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class GroupCounts:
    """:class:`StepCounts` of each step of a group, in three arrays (cheap to send)."""

    counts: np.ndarray
    """``(k, P, len(COUNT_FIELDS))`` int64."""
    starts: np.ndarray
    """Table ids of the documents starting in the group, by step then pool."""
    bounds: np.ndarray
    """``(k * P + 1,)``: step ``i``, pool ``p`` holds ``starts[bounds[i * P + p]:...+ 1]]``."""

    def step(self, i: int) -> StepCounts:
        """The :class:`StepCounts` of step ``i`` of the group."""
        P = self.counts.shape[1]
        b = self.bounds[i * P : (i + 1) * P + 1].tolist()
        return StepCounts(
            counts=self.counts[i],
            starts=tuple(self.starts[b[p] : b[p + 1]] for p in range(P)),
        )


class EpochView:
    """An epoch plan cut into global steps of ``global_batch`` blocks (see the module docstring).

    Args:
        plan: Any :class:`BlockPlan`.
        global_batch: Blocks per global step ``G``.
        drop_last: Whether an incomplete last step is dropped.
        block_order: ``"sequential"`` or ``"interleave"``.
        lookahead: Read one token past a block ending mid-document.
        eos_id: Separator id (placed by :meth:`skeleton` too).
        pad_id: Padding id.
        overlap_loss: Keep the loss on windows' overlap (the recipe's ``overlap_loss``).
    """

    def __init__(
        self,
        plan: BlockPlan,
        *,
        global_batch: int,
        drop_last: bool,
        block_order: str,
        lookahead: bool,
        eos_id: int,
        pad_id: int,
        overlap_loss: bool = False,
    ) -> None:
        self.plan = plan
        self.overlap_loss = bool(overlap_loss)
        self.global_batch = int(global_batch)
        self.drop_last = bool(drop_last)
        self.block_order = block_order
        # A plan that lays out its own steps (a mixture: stratified, block order applied per
        # pool) is asked for its blocks step-major; any other plan in the block order.
        self.stream_order = block_order
        if getattr(plan, "lays_out_steps", False):
            if plan.global_batch != self.global_batch:  # type: ignore[attr-defined]
                raise PlanError(
                    f"the plan was laid out for global steps of {plan.global_batch} blocks "  # type: ignore[attr-defined]
                    f"but the view asks for {self.global_batch}"
                )
            self.stream_order = "sequential"
        self.lookahead = bool(lookahead)
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.sizes: EpochSteps = epoch_steps(plan, global_batch=global_batch, drop_last=drop_last)

    @property
    def steps(self) -> int:
        """Global steps in the epoch."""
        return self.sizes.steps

    @property
    def seq_len(self) -> int:
        return int(self.plan.seq_len)

    def blocks(self, step: int, *, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """``(G / W,)`` plan blocks rank ``rank`` packs at ``step`` (``-1``: padding block)."""
        return step_blocks(
            step,
            rank=rank,
            world_size=world_size,
            batch_size=split_global_batch(self.global_batch, world_size, unit="blocks"),
            num_blocks=self.plan.num_blocks,
            drop_last=self.drop_last,
            order=self.stream_order,
        )

    def group(self, steps: np.ndarray, *, rank: int = 0, world_size: int = 1) -> GroupLayout:
        """:meth:`layout` of consecutive steps at once: one ``spans`` call for all their blocks."""
        steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        B = split_global_batch(self.global_batch, world_size, unit="blocks")
        blocks = steps_blocks(
            steps,
            rank=rank,
            world_size=world_size,
            batch_size=B,
            num_blocks=self.plan.num_blocks,
            drop_last=self.drop_last,
            order=self.stream_order,
        ).reshape(-1)
        spans = self.plan.spans(blocks)
        starts, stops = token_ranges(spans, lookahead=self.lookahead)
        return GroupLayout(
            steps=steps,
            blocks_per_step=B,
            blocks=blocks,
            spans=spans,
            starts=starts,
            stops=stops,
            pools=self.plan.block_pools(blocks),
        )

    def pack_group(
        self,
        layout: GroupLayout,
        tokens: np.ndarray | TokenSource,
        offsets: np.ndarray,
        out: np.ndarray | None = None,
        masked: np.ndarray | None = None,
        compiled: bool = True,
    ) -> PackedGroup:
        """Pack a group's tokens (``offsets``: CSR over its stretches; ``tokens`` gathered, or a
        :class:`~tokenloom.loader.plan.pack.TokenSource`) into its steps' batches
        (``out``: an optional ``(4, k * B, L)`` int64 buffer; ``masked``: the read tokens in a
        loss-mask span; ``compiled``: the packer; see :func:`pack_group`)."""
        return pack_group(
            layout.spans,
            tokens,
            offsets,
            steps=len(layout.steps),
            blocks_per_step=layout.blocks_per_step,
            seq_len=self.seq_len,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            lookahead=self.lookahead,
            out=out,
            masked=masked,
            overlap_loss=self.overlap_loss,
            compiled=compiled,
        )

    def count_group(self, layout: GroupLayout, packed: PackedGroup, num_pools: int) -> GroupCounts:
        """:meth:`count` of each step of a group, computed for the whole group at once."""
        k, B, P = len(layout.steps), layout.blocks_per_step, num_pools
        spans, pools = layout.spans, layout.pools
        owner = np.where(pools >= 0, pools, 0)  # a whole padding block counts on pool 0
        key = np.arange(k * B, dtype=np.int64) // B * P + owner  # (k * B,) (step, pool) of block
        n = k * P
        out = np.zeros((n, len(COUNT_FIELDS)), dtype=np.int64)
        out[:, 0] = np.bincount(key[pools >= 0], minlength=n)
        per_block = packed.block_counts  # counted by the compiled packer, or on the arrays
        if per_block is None:
            per_block = ((packed.doc_ids == -1).sum(axis=1), (packed.labels != -100).sum(axis=1))
        out[:, 3] = np.bincount(key, weights=per_block[0], minlength=n)
        out[:, 4] = np.bincount(key, weights=per_block[1], minlength=n)
        if packed.masked_blocks is not None:
            out[:, 6] = np.bincount(key, weights=packed.masked_blocks, minlength=n)
        ids = np.zeros(0, dtype=np.int64)
        bounds = np.zeros(n + 1, dtype=np.int64)
        if len(spans):
            skey = key[spans.block]  # (S,) (step, pool) of each stretch
            ctx = packed.context
            ctx_len = ctx[:, 1] - ctx[:, 0] if ctx is not None else np.zeros(len(spans), np.int64)
            body = spans.tok_end - spans.tok_start - ctx_len
            out[:, 1] = np.bincount(skey, weights=body, minlength=n)
            out[:, 2] = np.bincount(skey, weights=spans.has_eos, minlength=n)
            out[:, 5] = np.bincount(skey, weights=ctx_len, minlength=n)
            first = spans.tok_start == 0
            ids, fkey = spans.row_id[first], skey[first]
            if P > 1:
                order = np.argsort(fkey, kind="stable")
                ids, fkey = ids[order], fkey[order]
            bounds = np.searchsorted(fkey, np.arange(n + 1))
        return GroupCounts(counts=out.reshape(k, P, len(COUNT_FIELDS)), starts=ids, bounds=bounds)

    def layout(self, step: int, *, rank: int = 0, world_size: int = 1) -> StepLayout:
        """Rank ``rank``'s blocks of ``step`` with their stretches and token ranges (no I/O):
        :meth:`group` of that one step."""
        g = self.group(np.array([step]), rank=rank, world_size=world_size)
        return StepLayout(
            step=step, blocks=g.blocks, spans=g.spans, starts=g.starts, stops=g.stops, pools=g.pools
        )

    def pack(
        self,
        layout: StepLayout,
        tokens: np.ndarray,
        offsets: np.ndarray,
        masked: np.ndarray | None = None,
    ) -> PackedArrays:
        """Pack a layout's tokens (``offsets``: CSR over its stretches; ``masked``: the read
        tokens in a loss-mask span) into its batch."""
        return pack_blocks(
            layout.spans,
            tokens,
            offsets,
            num_blocks_in_batch=len(layout.blocks),
            seq_len=self.seq_len,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            lookahead=self.lookahead,
            masked=masked,
            overlap_loss=self.overlap_loss,
        )

    def count(self, layout: StepLayout, packed: PackedArrays, num_pools: int) -> StepCounts:
        """Per-pool counts of a packed layout (:class:`StepCounts`): :meth:`count_group` of that
        one step, so the ledger (step by step) and the loader (group by group) count with one
        function."""
        one = GroupLayout(
            steps=np.array([layout.step]),
            blocks_per_step=len(layout.blocks),
            blocks=layout.blocks,
            spans=layout.spans,
            starts=layout.starts,
            stops=layout.stops,
            pools=layout.pools,
        )
        return self.count_group(one, packed, num_pools).step(0)  # type: ignore[arg-type]

    def skeleton(self, layout: StepLayout, masks: Any = None) -> PackedArrays:
        """:meth:`pack` with placeholder token ids: every field but the ids, without reading
        tokens. ``masks``: a function of ``(layout, offsets)`` returning the read tokens in a
        loss-mask span (it reads the mask column only), or ``None``."""
        lengths = layout.stops - layout.starts
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        masked = masks(layout, offsets) if masks is not None else None
        return self.pack(layout, np.zeros(int(offsets[-1]), dtype=np.int64), offsets, masked)

    def steps_holding(self, row_ids: np.ndarray) -> list[int]:
        """Ascending global steps whose blocks hold any token or EOS of ``row_ids``."""
        want = np.asarray(row_ids, dtype=np.int64)
        n = self.plan.num_blocks
        if self.drop_last:
            n = self.steps * self.global_batch
        found = []
        for lo in range(0, n, _SCAN_BLOCKS):
            spans = self.plan.spans(np.arange(lo, min(lo + _SCAN_BLOCKS, n), dtype=np.int64))
            found.append(spans.blocks[spans.block[np.isin(spans.row_id, want)]])
        blocks = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
        step, _ = block_steps(
            blocks, global_batch=self.global_batch, steps=self.steps, order=self.stream_order
        )
        return sorted(set(step.tolist()))
