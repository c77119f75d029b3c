"""The epoch plan: visiting order, token stream layout, blocks and global steps (pure numpy).

The plan is computed from the stored ``n_tokens`` column alone, never from the tokens (★3):

* **Visiting order.** Rows with ``n_tokens == 0`` (null or empty token lists) contribute *nothing*
  to the stream, not even an EOS, and are counted as ``empty_rows``; an EOS that separates nothing
  would only add a label-less position. The remaining rows are visited in
  :func:`~tokenloom.loader.plan.shuffle.epoch_permutation` order, or with an ``order_by`` in the
  curriculum order of :mod:`~tokenloom.loader.plan.order`.
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.errors import TokenloomError
from tokenloom.loader.plan.compact import CompactInts, count_nonzero, nonzero_positions
from tokenloom.loader.plan.shuffle import chunk_size, epoch_order, order_dtype

__all__ = [
    "PlanError",
    "BlockCounts",
    "clip_range",
    "EpochPlan",
    "EpochSteps",
    "plan_epoch",
    "check_selection",
    "check_seq_len",
    "Visit",
    "narrow_counts",
    "visiting_order",
    "stream_marks",
    "MARK_EVERY",
    "pass_chunk",
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


MARK_EVERY = 64
"""Documents between two stored stream offsets (:attr:`EpochPlan.marks`); the offsets in between
are summed on the fly from the lengths, so a lookup costs O(log n + MARK_EVERY)."""

_MARK_CHUNK = MARK_EVERY << 10  # most documents summed per pass when building the marks


def pass_chunk(n: int) -> int:
    """Documents per chunk of a pass over ``n`` (:func:`~tokenloom.loader.plan.shuffle.chunk_size`):
    whole :data:`MARK_EVERY` groups, from 16 groups up to :data:`_MARK_CHUNK`
    (each chunk's temporaries are tens of bytes per document of the chunk)."""
    return chunk_size(n, least=16 * MARK_EVERY, most=_MARK_CHUNK, multiple=MARK_EVERY)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class EpochPlan:
    """Where every document of one epoch lands in the token stream. Arrays are read-only.

    Held per document: one position into the selection (``order``, 4 bytes below ``2**32``
    rows) and 8 bytes per :data:`MARK_EVERY` documents (``marks``); row ids and lengths are read
    through ``order`` from the selection's own arrays, which the plan shares (no copy). The
    layout may be memory-mapped from a :class:`~tokenloom.loader.pipeline.planstore.PlanStore`, one
    copy per node for every process.
    """

    seed: int
    epoch: int
    seq_len: int
    """Positions per block (``L``)."""
    order: np.ndarray
    """``(n,)`` uint32 (int64 from ``2**32`` rows): position in the selection (``source_ids``)
    of each non-empty row, in visiting order."""
    marks: np.ndarray
    """``(ceil(n / MARK_EVERY) + 1,)`` int64: stream offset of documents ``0, M, 2M, ...``
    (``M = MARK_EVERY``), then ``stream_len``."""
    source_ids: np.ndarray
    """``(N,)`` int64: table ``id`` of each selected row, ascending (empty rows included)."""
    source_lens: np.ndarray
    """``(N,)`` int64 (or int32, as the selection holds them): tokens of each selected row."""
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
        return int(self.order.shape[0])

    @property
    def row_ids(self) -> np.ndarray:
        """``(n,)`` int64: table ``id`` of each document in visiting order. Built on each call
        (8 bytes per document): for references and tests; the loader uses :meth:`doc_rows`."""
        return _readonly(self.source_ids[self.order])

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` int64: tokens of each document in visiting order (all ``>= 1``). Built on
        each call, like :attr:`row_ids`."""
        return _readonly(self.source_lens[self.order].astype(np.int64, copy=False))

    @property
    def starts(self) -> np.ndarray:
        """``(n + 1,)`` int64: stream offset of each document; ``starts[n] == stream_len``.
        Built on each call, like :attr:`row_ids`."""
        out = np.zeros(self.num_docs + 1, dtype=np.int64)
        np.cumsum(np.add(self.source_lens[self.order], 1, dtype=np.int64), out=out[1:])
        return _readonly(out)

    def doc_rows(self, docs: np.ndarray) -> np.ndarray:
        """Table ``id`` of documents ``docs`` (indices in visiting order), int64."""
        return self.source_ids[self.order[docs]]

    def covering(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every document overlapping any stream range ``[lo[i], hi[i])``, with its offset.

        Args:
            lo: ``(m,)`` first positions, ``0 <= lo < stream_len``.
            hi: ``(m,)`` ends, ``lo < hi <= stream_len``.

        Returns:
            ``(docs, starts, sizes)``, each ``(D,)`` int64 and ascending by document: whole
            groups of :data:`MARK_EVERY` documents around the ranges, so the documents of one
            range are consecutive; ``starts`` is each one's stream offset and ``sizes`` its
            positions (tokens + EOS). O(m log n + D).
        """
        K, n, marks = MARK_EVERY, self.num_docs, self.marks
        lo, hi = np.asarray(lo), np.asarray(hi)
        g0 = int(np.searchsorted(marks, lo.min(), side="right")) - 1
        g1 = int(np.searchsorted(marks, hi.max() - 1, side="right"))  # past the last group
        wanted = int((hi - lo).sum())
        if int(marks[g1] - marks[g0]) <= 2 * wanted + 4 * K * self.stream_len // max(n, 1):
            # Nearby ranges (a step's consecutive blocks): one run of groups, one prefix sum.
            docs = np.arange(g0 * K, min(g1 * K, n), dtype=np.int64)
            sizes = np.add(self.source_lens[self.order[g0 * K : g1 * K]], 1, dtype=np.int64)
            starts = np.cumsum(sizes)
            starts -= sizes
            starts += marks[g0]
            return docs, starts, sizes
        c0 = np.searchsorted(marks, lo, side="right") - 1  # (m,) group holding lo
        c1 = np.searchsorted(marks, hi - 1, side="right") - 1  # (m,) group holding hi - 1
        span = c1 - c0 + 1
        total = int(span.sum())
        offsets = np.cumsum(span) - span
        groups = np.unique(np.repeat(c0, span) + (np.arange(total) - np.repeat(offsets, span)))
        docs = (groups[:, None] * K + np.arange(K, dtype=np.int64)).ravel()  # (g * K,)
        docs = docs[docs < n]  # only the last group can be short
        sizes = np.add(self.source_lens[self.order[docs]], 1, dtype=np.int64)
        ends = np.cumsum(sizes)
        before = ends - sizes  # exclusive prefix over all groups taken
        head = (np.arange(docs.shape[0]) // K) * K  # (D,) index of each group's first document
        starts = marks[docs // K] + before - before[head]
        return docs, starts, sizes

    def docs_before(self, pos: int) -> int:
        """Documents whose EOS lies before stream position ``pos`` (clipped). O(log n)."""
        if pos <= 0:
            return 0
        if pos >= self.stream_len:
            return self.num_docs
        docs, starts, _ = self.covering(np.array([pos]), np.array([pos + 1]))
        return int(docs[np.searchsorted(starts, pos, side="right") - 1])

    def spans(self, blocks: np.ndarray) -> Any:
        """:func:`~tokenloom.loader.plan.spans.block_spans` of this plan."""
        from tokenloom.loader.plan.spans import block_spans

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
    if isinstance(values, CompactInts) and values.dtype == np.int64:
        return values  # type: ignore[return-value]  # read through gathers, never copied
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise PlanError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PlanError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def narrow_counts(counts: np.ndarray) -> np.ndarray:
    """Token counts as int32 when every one fits (exact), else int64: what a selection holds
    (4 bytes per row instead of 8; :func:`plan_epoch` reads either in place)."""
    counts = np.asarray(counts)
    if counts.size == 0 or int(counts.max()) <= np.iinfo(np.int32).max:
        return counts.astype(np.int32, copy=False)
    return counts.astype(np.int64, copy=False)


def _as_counts_1d(values: np.ndarray) -> np.ndarray:
    """Token counts as given when int32 or int64, plain or :class:`~tokenloom.loader.plan.compact.
    CompactInts` (a shared selection's counts are read in place, not copied per process), else
    as int64."""
    if isinstance(values, CompactInts) and values.dtype in (np.int32, np.int64):
        return values  # type: ignore[return-value]
    arr = np.asarray(values)
    if arr.ndim == 1 and arr.dtype in (np.dtype(np.int32), np.dtype(np.int64)):
        return arr
    return _as_int64_1d("n_tokens", arr)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


def _readonly_view(arr: np.ndarray) -> np.ndarray:
    """A read-only view: the caller's array stays writeable, the plan's handle does not (a
    :class:`~tokenloom.loader.plan.compact.CompactInts` column is read-only already)."""
    if isinstance(arr, CompactInts):
        return arr  # type: ignore[return-value]
    return _readonly(arr.view())


def _first_not_ascending(ids: np.ndarray) -> int | None:
    """First ``i`` with ``ids[i + 1] <= ids[i]``, checked in chunks (no ``(n,)`` temporary)."""
    if isinstance(ids, CompactInts) and ids.is_sorted and ids.stats.get("strict"):
        return None  # known when it was encoded
    step = pass_chunk(ids.shape[0])
    for a in range(0, max(ids.shape[0] - 1, 0), step):
        b = min(a + step, ids.shape[0] - 1)
        down = ids[a + 1 : b + 1] <= ids[a:b]
        if down.any():
            return a + int(np.argmax(down))
    return None


def visiting_order(
    lens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    out: np.ndarray | None = None,
    ordering: Any = None,
) -> np.ndarray:
    """Positions of the non-empty rows of ``lens`` in visiting order (see the module docstring).

    Args:
        lens: ``(N,)`` int64 token counts ``>= 0``.
        seed: The job's seed.
        epoch: The epoch.
        out: Optional ``(n,)`` array of ``order_dtype(N)`` to write the result into (e.g. the
            plan store's file, mapped for writing).
        ordering: Optional :class:`~tokenloom.loader.plan.order.Ordering` of the selection: a
            curriculum (:func:`~tokenloom.loader.plan.order.curriculum_order`) instead of the
            uniform permutation.

    Returns:
        ``(n,)`` :func:`~tokenloom.loader.plan.shuffle.order_dtype` ``(N)`` positions into ``lens``
        of its ``n`` non-empty rows, in :func:`~tokenloom.loader.plan.shuffle.epoch_permutation`
        order of those rows (or the curriculum's).
    """
    if ordering is not None:
        from tokenloom.loader.plan.order import curriculum_order

        return curriculum_order(lens, ordering, seed=seed, epoch=epoch, out=out)
    N = lens.shape[0]
    kept = count_nonzero(lens)  # counts are >= 0: non-zero is non-empty
    dtype = np.dtype(order_dtype(N))
    if out is None:
        out = np.empty(kept, dtype=dtype)
    elif out.shape != (kept,) or out.dtype != dtype:
        raise PlanError(f"out must be ({kept},) {dtype}, got {out.shape} {out.dtype}")
    # The permutation of the kept rows, written in place when the dtypes agree (below 2**32).
    same = dtype == order_dtype(kept)
    order = epoch_order(kept, seed=seed, epoch=epoch, out=out if same else None)
    if kept == N:
        if order is not out:
            out[:] = order
        return out
    where = nonzero_positions(lens, dtype)  # (n,) position of each kept row
    step = pass_chunk(kept)
    for a in range(0, kept, step):  # rank among the kept rows -> position, in place
        out[a : a + step] = where[order[a : a + step]]
    return out


def stream_marks(order: np.ndarray, lens: np.ndarray, *, visit: Visit | None = None) -> np.ndarray:
    """The stream offset of every :data:`MARK_EVERY`-th document, then the stream's length.

    Args:
        order: ``(n,)`` positions into ``lens``, in visiting order.
        lens: ``(N,)`` int64 token counts.
        visit: Optional :data:`Visit` called with each chunk of ``order`` and its counts.

    Returns:
        ``(ceil(n / MARK_EVERY) + 1,)`` int64: ``starts[0::MARK_EVERY]`` and ``starts[n]``
        where ``starts[k + 1] = starts[k] + lens[order[k]] + 1``.
    """
    n, K = order.shape[0], MARK_EVERY
    marks = np.empty(-(-n // K) + 1, dtype=np.int64)
    base = 0
    step = pass_chunk(n)
    for a in range(0, n, step):
        at = order[a : a + step]
        counts = lens[at]
        if visit is not None:
            visit(a, at, counts)
        sizes = np.add(counts, 1, dtype=np.int64)
        ends = np.cumsum(sizes)
        marks[a // K : a // K + -(-sizes.shape[0] // K)] = base + (ends - sizes)[::K]
        base += int(ends[-1])
    marks[-1] = base
    return marks


def check_selection(row_ids: Any, n_tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lens)`` of a selection as the planners read them (see :func:`plan_epoch`).

    Raises:
        PlanError: Shapes differ, ids are not strictly ascending or a count is negative.
    """
    ids = _as_int64_1d("row_ids", row_ids)
    lens = _as_counts_1d(n_tokens)
    if ids.shape != lens.shape:
        raise PlanError(f"row_ids has {ids.shape[0]} rows but n_tokens has {lens.shape[0]}")
    bad = _first_not_ascending(ids)
    if bad is not None:
        raise PlanError(
            f"row_ids must be strictly ascending (row_ids[{bad}]={ids[bad]}, "
            f"row_ids[{bad + 1}]={ids[bad + 1]}); sort the filtered rows by id first"
        )
    if lens.size and int(lens.min()) < 0:
        bad = int(np.argmin(lens))
        raise PlanError(f"n_tokens must be >= 0, got {lens[bad]} for row id {ids[bad]}")
    return ids, lens


def check_seq_len(seq_len: Any) -> int:
    """``seq_len`` as an int, or :class:`PlanError` unless it is an integer ``>= 1``."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 1:
        raise PlanError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    return int(seq_len)


Visit = Callable[[int, np.ndarray, np.ndarray], None]
"""``visit(k, positions, counts)``: documents ``k, k + 1, ...`` of the visiting order are
selection positions ``positions`` with ``counts`` tokens (a chunk at a time, in order)."""


def plan_epoch(
    row_ids: np.ndarray,
    n_tokens: np.ndarray,
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    store: Any = None,
    visit: Visit | None = None,
    ordering: Any = None,
    order: np.ndarray | None = None,
) -> EpochPlan:
    """Lay out one epoch of the filtered rows as a token stream cut into blocks. O(n log n).

    Args:
        row_ids: ``(n,)`` integers: the table ``id`` of each selected row, strictly ascending (the
            order the permutation is applied to, so every process must pass the same one).
        n_tokens: ``(n,)`` integers ``>= 0``: tokens of each row (0 for null/empty token lists).
        seed: The job's seed (non-negative).
        epoch: The epoch number (non-negative).
        seq_len: Positions per block, ``>= 1``.
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore`: the layout is built
        once
            per node and memory-mapped by every process (large selections only).
        visit: Optional :data:`Visit`, called with each chunk of the visiting order and its
            counts while the layout is built here (not when it is mapped from ``store``): a
            planner that needs every count in visiting order reads them once, with the marks.
        ordering: Optional :class:`~tokenloom.loader.plan.order.Ordering`: visit the rows in its
            curriculum order instead of the uniform permutation.
        order: Optional explicit visiting order instead of the seeded one: positions into
            ``n_tokens`` of its non-empty rows, each once (a stream change that keeps an
            earlier order, :func:`check_order`); ``store`` is then not used.

    Returns:
        The :class:`EpochPlan`.

    Raises:
        PlanError: Shapes differ, ids are not strictly ascending, a count is negative or
            ``seq_len < 1``.
    """
    ids, lens = check_selection(row_ids, n_tokens)
    check_seq_len(seq_len)

    def build(alloc: Any = None) -> tuple[np.ndarray, np.ndarray]:
        out = None
        if alloc is not None:  # the store's file for the order, mapped for writing
            out = alloc(count_nonzero(lens), order_dtype(lens.shape[0]))
        order = visiting_order(lens, seed=int(seed), epoch=int(epoch), out=out, ordering=ordering)
        return order, stream_marks(order, lens, visit=visit)

    if order is not None:
        order = check_order(order, lens)
        marks = stream_marks(order, lens, visit=visit)
    elif store is not None:
        variant = None if ordering is None else ordering.digest
        order, marks = store.layout(
            ids, lens, seed=int(seed), epoch=int(epoch), build=build, variant=variant
        )
    else:
        order, marks = build()
    n = int(order.shape[0])
    stream_len = int(marks[-1])
    seq_len = int(seq_len)
    num_blocks = -(-stream_len // seq_len)
    return EpochPlan(
        seed=int(seed),
        epoch=int(epoch),
        seq_len=seq_len,
        order=_readonly_view(order),
        marks=_readonly_view(marks),
        source_ids=_readonly_view(ids),
        source_lens=_readonly_view(lens),
        empty_rows=int(lens.shape[0]) - n,
        num_tokens=stream_len - n,
        stream_len=stream_len,
        num_blocks=num_blocks,
        padding_positions=num_blocks * seq_len - stream_len,
    )


def check_order(order: Any, lens: np.ndarray) -> np.ndarray:
    """``order`` as an int64 array if it visits every non-empty row of ``lens`` exactly once.

    Raises:
        PlanError: It names a position outside ``lens``, an empty row, or a row twice.
    """
    out = np.asarray(order, dtype=np.int64).reshape(-1)
    N = int(lens.shape[0])
    if out.size and (int(out.min()) < 0 or int(out.max()) >= N):
        raise PlanError(f"an explicit visiting order names positions outside 0..{N - 1}")
    seen = np.zeros(N, dtype=bool)
    seen[out] = True
    if int(seen.sum()) != out.size or not np.array_equal(seen, np.asarray(lens) > 0):
        raise PlanError(
            "an explicit visiting order must name every non-empty row exactly once and no empty row"
        )
    return out


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
    eos = plan.docs_before(hi) - plan.docs_before(lo)
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
    from tokenloom.loader.plan.stream.topology import check_rank  # imports this module's PlanError

    if batch_size < 1:
        raise PlanError(f"batch_size must be >= 1, got {batch_size}")
    check_rank(rank, world_size)


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
