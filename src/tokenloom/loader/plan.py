"""The epoch plan: visiting order, token stream layout, blocks and global steps (pure numpy).

The plan is computed from the stored ``n_tokens`` column alone, never from the tokens (★3):

* **Visiting order.** Rows with ``n_tokens == 0`` (null or empty token lists) contribute *nothing*
  to the stream, not even an EOS, and are counted as ``empty_rows``; an EOS that separates nothing
  would only add a label-less position. The remaining rows are visited in
  :func:`~tokenloom.loader.shuffle.epoch_permutation` order.
* **Token stream.** Document ``k`` (``k``-th in visiting order) occupies stream positions
  ``[starts[k], starts[k + 1])``: its ``lengths[k]`` tokens, then one EOS at ``starts[k + 1] - 1``.
* **Blocks.** Block ``b`` is stream positions ``[b * seq_len, (b + 1) * seq_len)``; the last block
  is padded up to ``seq_len`` (``padding_positions``).
* **Global steps.** Step ``s`` holds ``G`` blocks (``[s * G, (s + 1) * G)`` in sequential
  order; see :func:`step_blocks`); rank ``r`` of ``W`` takes the ``r``-th slice of ``G / W``, so
  the global batch is the same whatever the world size. The last step is completed with whole
  padding blocks (index ``-1``) or dropped with ``drop_last=True`` (its real tokens reported in
  :class:`EpochSteps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.errors import TokenloomError
from tokenloom.loader.shuffle import epoch_permutation

__all__ = [
    "PlanError",
    "BlockCounts",
    "clip_range",
    "EpochPlan",
    "EpochSteps",
    "plan_epoch",
    "epoch_steps",
    "steps_in_epoch",
    "step_blocks",
    "steps_blocks",
    "check_block_order",
    "BLOCK_ORDERS",
    "stream_counts",
]


class PlanError(TokenloomError):
    """Inputs of the loader's plan math are inconsistent (lengths, ranges, ranks, spans, tokens)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockCounts:
    """What a range of blocks holds."""

    tokens: int
    """Real token positions (repeated context included)."""
    eos: int
    """EOS positions."""
    filled: int
    """``tokens + eos``; the rest of the range is padding."""


def clip_range(lo: int, hi: int, num_blocks: int) -> tuple[int, int]:
    """``[lo, hi)`` clipped to ``[0, num_blocks]`` (``hi >= lo``)."""
    lo = min(max(int(lo), 0), num_blocks)
    return lo, min(max(int(hi), lo), num_blocks)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class EpochPlan:
    """Where every document of one epoch lands in the token stream. Arrays are read-only."""

    seed: int
    epoch: int
    seq_len: int
    """Positions per block (``L``)."""
    row_ids: np.ndarray
    """``(n,)`` int64: table ``id`` of each non-empty row, in visiting order."""
    lengths: np.ndarray
    """``(n,)`` int64: tokens of each document in visiting order (all ``>= 1``)."""
    starts: np.ndarray
    """``(n + 1,)`` int64: stream offset of each document; ``starts[n] == stream_len``."""
    empty_rows: int
    """Selected rows with no tokens; they contribute nothing to the stream."""
    num_tokens: int
    """Real tokens in the epoch (EOS excluded)."""
    stream_len: int
    """Positions of the stream: ``num_tokens + n`` (one EOS per document)."""
    num_blocks: int
    """``ceil(stream_len / seq_len)``."""
    padding_positions: int
    """Padding at the end of the last block: ``num_blocks * seq_len - stream_len``."""

    @property
    def num_docs(self) -> int:
        """Documents in the stream (non-empty rows)."""
        return int(self.row_ids.shape[0])

    def spans(self, blocks: np.ndarray) -> Any:
        """:func:`~tokenloom.loader.spans.block_spans` of this plan."""
        from tokenloom.loader.spans import block_spans

        return block_spans(self, blocks)

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What blocks ``[lo, hi)`` hold (clipped to the epoch). O(log n)."""
        lo, hi = clip_range(lo, hi, self.num_blocks)
        tokens, eos = stream_counts(self, lo * self.seq_len, hi * self.seq_len)
        return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool of each block: 0, or -1 for a padding block (``-1``)."""
        return np.where(np.asarray(blocks) >= 0, 0, -1).astype(np.int64)


def _as_int64_1d(name: str, values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise PlanError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PlanError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


def plan_epoch(
    row_ids: np.ndarray, n_tokens: np.ndarray, *, seed: int, epoch: int, seq_len: int
) -> EpochPlan:
    """Lay out one epoch of the filtered rows as a token stream cut into blocks. O(n log n).

    Args:
        row_ids: ``(n,)`` integers: the table ``id`` of each selected row, strictly ascending (the
            order the permutation is applied to, so every process must pass the same one).
        n_tokens: ``(n,)`` integers ``>= 0``: tokens of each row (0 for null/empty token lists).
        seed: The job's seed (non-negative).
        epoch: The epoch number (non-negative).
        seq_len: Positions per block, ``>= 1``.

    Returns:
        The :class:`EpochPlan`.

    Raises:
        PlanError: Shapes differ, ids are not strictly ascending, a count is negative or
            ``seq_len < 1``.
    """
    ids = _as_int64_1d("row_ids", row_ids)
    lens = _as_int64_1d("n_tokens", n_tokens)
    if ids.shape != lens.shape:
        raise PlanError(f"row_ids has {ids.shape[0]} rows but n_tokens has {lens.shape[0]}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 1:
        raise PlanError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        bad = int(np.flatnonzero(ids[1:] <= ids[:-1])[0])
        raise PlanError(
            f"row_ids must be strictly ascending (row_ids[{bad}]={ids[bad]}, "
            f"row_ids[{bad + 1}]={ids[bad + 1]}); sort the filtered rows by id first"
        )
    if lens.size and int(lens.min()) < 0:
        bad = int(np.argmin(lens))
        raise PlanError(f"n_tokens must be >= 0, got {lens[bad]} for row id {ids[bad]}")

    keep = lens > 0
    ids, lens = ids[keep], lens[keep]
    perm = epoch_permutation(ids.shape[0], seed=seed, epoch=epoch)
    order_ids, order_lens = ids[perm], lens[perm]
    starts = np.zeros(order_lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(order_lens + 1, out=starts[1:])
    stream_len = int(starts[-1])
    seq_len = int(seq_len)
    num_blocks = -(-stream_len // seq_len)
    return EpochPlan(
        seed=int(seed),
        epoch=int(epoch),
        seq_len=seq_len,
        row_ids=_readonly(order_ids),
        lengths=_readonly(order_lens),
        starts=_readonly(starts),
        empty_rows=int((~keep).sum()),
        num_tokens=stream_len - int(order_lens.shape[0]),
        stream_len=stream_len,
        num_blocks=num_blocks,
        padding_positions=num_blocks * seq_len - stream_len,
    )


def stream_counts(plan: EpochPlan, lo: int, hi: int) -> tuple[int, int]:
    """Real tokens and EOS positions among stream positions ``[lo, hi)``. O(log n).

    Args:
        plan: The epoch plan.
        lo: First stream position (clipped to ``[0, stream_len]``).
        hi: One past the last stream position (clipped likewise; padding counts as neither).

    Returns:
        ``(tokens, eos)``.
    """
    lo = min(max(int(lo), 0), plan.stream_len)
    hi = min(max(int(hi), lo), plan.stream_len)
    eos_at = plan.starts[1:] - 1  # (n,) ascending stream position of each EOS
    eos = int(np.searchsorted(eos_at, hi) - np.searchsorted(eos_at, lo))
    return hi - lo - eos, eos


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochSteps:
    """How one epoch's blocks group into global steps, with what is padded or dropped."""

    steps: int
    """Global steps in the epoch."""
    global_batch: int
    """Blocks per global step ``G``."""
    padding_blocks: int
    """Whole padding blocks completing the last step (0 with ``drop_last``)."""
    padding_positions: int
    """All padding positions delivered: whole padding blocks plus the last block's tail."""
    dropped_blocks: int
    """Blocks of the incomplete last step left out with ``drop_last`` (0 otherwise)."""
    dropped_tokens: int
    """Real tokens in the dropped blocks (they are not seen this epoch)."""
    dropped_eos: int
    """EOS positions in the dropped blocks."""


def _check_topology(batch_size: int, world_size: int, rank: int = 0) -> None:
    if batch_size < 1:
        raise PlanError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise PlanError(f"rank must be in [0, {world_size}), got {rank}")


def epoch_steps(plan: Any, *, global_batch: int, drop_last: bool) -> EpochSteps:
    """Count an epoch's global steps and what padding or dropping they imply, for any plan.

    ``padding_positions`` counts every padding position delivered: inside blocks (best-fit
    tails, the last block) and the whole padding blocks completing the last step.

    Args:
        plan: Any plan (``num_blocks``, ``seq_len``, ``padding_positions``, ``counts``).
        global_batch: Blocks per global step ``G`` (over all ranks).
        drop_last: Drop an incomplete last step instead of padding it with whole blocks.

    Returns:
        The :class:`EpochSteps`.
    """
    _check_topology(global_batch, 1)
    g = int(global_batch)
    n, L = plan.num_blocks, plan.seq_len
    if drop_last:
        steps = n // g
        kept = steps * g
        dropped = plan.counts(kept, n)
        inside = plan.padding_positions - ((n - kept) * L - dropped.filled)  # kept blocks' padding
        return EpochSteps(
            steps=steps,
            global_batch=g,
            padding_blocks=0,
            padding_positions=inside,
            dropped_blocks=n - kept,
            dropped_tokens=dropped.tokens,
            dropped_eos=dropped.eos,
        )
    steps = -(-n // g)
    pad_blocks = steps * g - n
    return EpochSteps(
        steps=steps,
        global_batch=g,
        padding_blocks=pad_blocks,
        padding_positions=plan.padding_positions + pad_blocks * L,
        dropped_blocks=0,
        dropped_tokens=0,
        dropped_eos=0,
    )


def steps_in_epoch(plan: Any, *, global_batch: int, drop_last: bool) -> int:
    """Global steps in the epoch: ``floor`` (``drop_last``) or ``ceil`` of ``num_blocks / G``."""
    return epoch_steps(plan, global_batch=global_batch, drop_last=drop_last).steps


BLOCK_ORDERS = ("sequential", "interleave")


def check_block_order(order: str) -> str:
    """``order`` if it is one of :data:`BLOCK_ORDERS`, else :class:`PlanError`."""
    if order not in BLOCK_ORDERS:
        raise PlanError(f"block order must be one of {', '.join(BLOCK_ORDERS)}, not {order!r}")
    return order


def step_blocks(
    step: int,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    num_blocks: int,
    drop_last: bool,
    order: str = "sequential",
) -> np.ndarray:
    """The blocks rank ``rank`` packs at global step ``step``.

    ``sequential``: rank ``r`` gets blocks ``[s*G + r*B, s*G + (r+1)*B)`` with
    ``G = B * world_size``, so the concatenation over ranks, ``[s*G, (s+1)*G)``, depends on ``G``
    only, not on the world size. ``interleave``: global slot ``j`` of step ``s`` holds block
    ``j*S + s`` (``S`` steps in the epoch), so a global batch gathers one block from each of
    ``G`` far-apart stretches of the shuffled stream and the blocks of a long document go to
    consecutive steps instead of filling one batch. Both depend on ``G`` only, and both visit
    every block once.

    Args:
        step: Global step within the epoch, ``0 <= step < steps_in_epoch``.
        rank: This rank, ``0 <= rank < world_size``.
        world_size: Number of ranks.
        batch_size: Blocks per rank per step (``B``).
        num_blocks: Blocks in the epoch (``EpochPlan.num_blocks``).
        drop_last: Whether the incomplete last step is dropped (then it is out of range).

    Returns:
        ``(batch_size,)`` int64 block indices, ``-1`` for the whole padding blocks that complete
        the last step.

    Raises:
        PlanError: ``step`` is outside the epoch, or the topology is invalid.
    """
    return steps_blocks(
        np.array([step], dtype=np.int64),
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        num_blocks=num_blocks,
        drop_last=drop_last,
        order=order,
    )[0]


def steps_blocks(
    steps: np.ndarray,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    num_blocks: int,
    drop_last: bool,
    order: str = "sequential",
) -> np.ndarray:
    """:func:`step_blocks` of several global steps at once (vectorised).

    Args:
        steps: ``(k,)`` global steps within the epoch.
        rank, world_size, batch_size, num_blocks, drop_last, order: As :func:`step_blocks`.

    Returns:
        ``(k, batch_size)`` int64: row ``i`` is ``step_blocks(steps[i], ...)``.

    Raises:
        PlanError: A step is outside the epoch, or the topology is invalid.
    """
    _check_topology(batch_size, world_size, rank)
    check_block_order(order)
    g = batch_size * world_size
    total = num_blocks // g if drop_last else -(-num_blocks // g)
    s = np.asarray(steps, dtype=np.int64).reshape(-1)
    bad = (s < 0) | (s >= total)
    if bad.any():
        raise PlanError(
            f"step {int(s[bad][0])} is outside the epoch: it has {total} global steps of {g} "
            f"blocks ({num_blocks} blocks, drop_last={drop_last})"
        )
    slots = rank * batch_size + np.arange(batch_size, dtype=np.int64)
    if order == "interleave":
        blocks = slots[None, :] * total + s[:, None]
    else:
        blocks = s[:, None] * g + slots[None, :]
    blocks[blocks >= num_blocks] = -1
    return blocks
