"""Token-quota mixing: pools planned on their own, stratified into every global step.

**Pools.** The caller defines each :class:`Pool` by its rows (``row_ids``, ``n_tokens``), a target
share and an optional cap on passes. Pool ``p`` is planned alone with the job's
:class:`~tokenloom.loader.plan.recipe.Recipe`; its pass ``q`` uses the permutation of
``(pool_seed(seed, p, q), epoch)`` (:func:`pool_seed`), so a pool whose quota exceeds its inventory
repeats with a new order each pass, up to its cap. With an ``order_by`` every pass of a pool visits
its rows in the pool's curriculum order (:mod:`~tokenloom.loader.plan.order`; the buckets shuffled
by the pass's seed).

**Schedule** (:mod:`~tokenloom.loader.plan.schedule`). Shares become integer weights ``w_p``
(:func:`share_weights`, ``W = sum(w)``). The mixture lays out its own global steps of ``G``
blocks: **every step gives pool ``p`` either ``floor(G w_p / W)`` or ``ceil(G w_p / W)`` blocks**
(stratified by systematic sampling), and after ``W`` steps every pool has had exactly
``G w_p`` blocks, so the shares hold within each step as far as ``G`` allows and over the epoch.
Global block ``k`` is slot ``k % G`` of step ``k // G`` (step-major: the epoch view asks for a
mixture's blocks in that order whatever the block order); the block order decides how a pool
numbers its blocks (``interleave``: consecutive blocks of a pool go to consecutive steps, so a long
document spreads over steps). Any block's source and any pool's count before a block are O(P)
from one precomputed period, so resume needs only ``(epoch, step)``.

**Epoch length.** ``budget_tokens`` gives ``ceil(budget_tokens / L)`` global blocks (the budget
counts positions: tokens, EOS and padding). A capped pool can supply at most the blocks of its
``max_passes`` passes; the epoch ends at the first global block a capped pool cannot supply (so the
shares hold over the whole epoch) and :attr:`MixturePlan.limited_by` names that pool. Without a
budget, the first capped pool to run out ends the epoch; with neither, planning refuses.

The shares are shares of **blocks** (positions). Token shares follow up to each pool's density of
EOS and padding; ``docs/recipes.md`` reports both deviations.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenloom.loader.plan.epoch import BlockCounts, PlanError, clip_range
from tokenloom.loader.plan.recipe import Recipe, RecipePlan, plan_recipe_epoch
from tokenloom.loader.plan.schedule import (
    StepSchedule,
    naive_step_sources,
    share_weights,
    step_schedule,
    window_share_deviation,
)
from tokenloom.loader.plan.spans import Spans
from tokenloom.loader.plan.window import check_blocks, empty_spans

__all__ = [
    "MIXTURE_ALGORITHM",
    "Pool",
    "StepSchedule",
    "PoolReport",
    "MixturePlan",
    "share_weights",
    "pool_seed",
    "step_schedule",
    "naive_step_sources",
    "plan_mixture",
    "mixture_block_source",
    "mixture_spans",
    "window_share_deviation",
]

MIXTURE_ALGORITHM = "stratified-steps-v1;pool-seed=seedseq[seed,pool,pass]"
"""Identity of the schedule and the per-pass seeds (part of the fingerprint of a mixture)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Pool:
    """One source of a mixture."""

    name: str
    """Unique name, used in reports and errors."""
    row_ids: np.ndarray
    """``(n,)`` strictly ascending table ids of its rows."""
    n_tokens: np.ndarray
    """``(n,)`` their token counts."""
    share: float
    """Target share of the blocks (any positive number; shares are normalised)."""
    max_passes: int | None = None
    """At most this many passes over the pool per epoch (``None``: as many as the quota needs)."""
    ordering: Any = None
    """Optional :class:`~tokenloom.loader.plan.order.Ordering` of the pool's rows: every pass visits
    them in that curriculum order (its buckets shuffled by the pass's seed)."""
    cuts: Any = None
    """Optional windows of the pool's long rows (a
    :class:`~tokenloom.loader.plan.window.WindowTable` cut at a cut column, the same every pass),
    else cut by the recipe alone."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"pool name must be a non-empty string, got {self.name!r}")
        ids, n = self.row_ids, self.n_tokens  # plain or CompactInts: never copied here
        if np.ndim(ids) != 1 or np.shape(ids) != np.shape(n):
            raise PlanError(
                f"pool {self.name!r}: row_ids {np.shape(ids)} and n_tokens {np.shape(n)} must "
                "be 1-D and of equal length"
            )
        share = self.share
        if isinstance(share, bool) or not isinstance(share, int | float | np.integer | np.floating):
            raise PlanError(f"pool {self.name!r}: share must be a number, got {share!r}")
        if not (math.isfinite(share) and share > 0):
            raise PlanError(f"pool {self.name!r}: share must be > 0, got {share!r}")
        mp = self.max_passes
        if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
            raise PlanError(f"pool {self.name!r}: max_passes must be None or >= 1, got {mp!r}")
        if int(np.sum(n, dtype=np.int64)) <= 0:
            raise PlanError(f"pool {self.name!r} has no tokens; drop it from the mixture")

    @property
    def num_tokens(self) -> int:
        """Tokens in one pass over the pool."""
        return int(np.sum(self.n_tokens, dtype=np.int64))


def pool_seed(seed: int, pool: int, pass_: int) -> int:
    """Seed of pool ``pool``'s pass ``pass_``: 63 bits of ``SeedSequence([seed, pool, pass_])``."""
    state = np.random.SeedSequence([int(seed), int(pool), int(pass_)]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) | (int(state[1]) >> 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolReport:
    """What one pool contributes to the epoch."""

    name: str
    target_share: float
    """The requested share, normalised."""
    share: float
    """The scheduled share of blocks, ``w_p / W``."""
    blocks: int
    """Blocks taken this epoch."""
    full_passes: int
    """Complete passes over the pool."""
    passes: int
    """Passes started (the last one may be partial)."""
    max_passes: int | None
    tokens: int
    """Real token positions delivered (repeated context included)."""
    exhausted: bool
    """The pool's cap ran out before the budget: it ended the epoch."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class MixturePlan:
    """One epoch of a mixture; same duck-typed surface as the other plans (``spans``, counts)."""

    seed: int
    epoch: int
    seq_len: int
    recipe: Recipe
    pools: tuple[Pool, ...]
    schedule: StepSchedule
    """Which pool fills each slot of each step (its ``global_batch`` and ``block_order``)."""
    pass_ends: tuple[np.ndarray, ...]
    """Per pool, ``(passes + 1,)`` cumulative blocks at the end of each planned pass."""
    pass_counts: tuple[tuple[BlockCounts, ...], ...]
    """Per pool, what each planned pass holds."""
    num_blocks: int
    """Global blocks in the epoch."""
    budget_blocks: int | None
    limited_by: str | None
    """Name of the capped pool that ended the epoch before the budget, if any."""
    num_tokens: int
    padding_positions: int
    reports: tuple[PoolReport, ...]
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _store: Any = field(default=None, repr=False)
    """Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore` the pool passes are shared
    in."""

    def pool_plan(self, pool: int, pass_: int) -> RecipePlan:
        """The plan of pool ``pool``'s pass ``pass_`` (a small LRU cache keeps recent ones)."""
        return _pool_plan(
            self._cache,
            self.pools,
            pool,
            pass_,
            self.seed,
            self.epoch,
            self.seq_len,
            self.recipe,
            self._store,
        )

    lays_out_steps = True
    """The plan places its blocks in steps itself: global block ``k`` is slot ``k % G`` of step
    ``k // G`` (the epoch view asks for step-major blocks, whatever the block order)."""

    @property
    def global_batch(self) -> int:
        """``G``: the blocks of a step this plan was laid out for."""
        return self.schedule.global_batch

    def source(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(pool, pool_block, pass, block_in_pass)`` of global blocks (``>= 0``)."""
        k = np.asarray(blocks, dtype=np.int64)
        p, j = self.schedule.source(k, self.num_blocks)
        q = np.zeros_like(j)
        for i, ends in enumerate(self.pass_ends):
            sel = p == i
            q[sel] = np.searchsorted(ends, j[sel], side="right") - 1
        start = np.zeros_like(j)
        for i, ends in enumerate(self.pass_ends):
            sel = p == i
            start[sel] = ends[q[sel]]
        return p, j, q, j - start

    def stream_position(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` a key ordering global blocks (``>= 0``) as their pools' streams run: blocks
        of one pool by its numbering (pass after pass), pools apart. Step order is not stream
        order under ``interleave``, so what reads a document's stretches in delivery order
        (a document delivered once per pass) sorts by this."""
        p, j = self.schedule.source(np.asarray(blocks, dtype=np.int64), self.num_blocks)
        return _stream_key(p, j)

    def epoch_ends(self) -> frozenset[int]:
        """The :meth:`stream_position` of each pool's last block of the epoch: where a pool's
        stream stops, a document can be cut short (a partial last pass)."""
        return frozenset(
            int(_stream_key(p, r.blocks - 1)) for p, r in enumerate(self.reports) if r.blocks > 0
        )

    def taken(self, k: int) -> np.ndarray:
        """``(P,)`` blocks taken from each pool before global block ``k``."""
        return self.schedule.taken(min(max(int(k), 0), self.num_blocks))

    def passes_done(self, k: int) -> np.ndarray:
        """``(P,)`` complete passes of each pool before global block ``k``."""
        t = self.taken(k)
        return np.array(
            [int(np.searchsorted(e, t[i], side="right")) - 1 for i, e in enumerate(self.pass_ends)]
        )

    def spans(self, blocks: np.ndarray) -> Spans:
        """:func:`mixture_spans` of this plan."""
        return mixture_spans(self, blocks)

    def block_pools(self, blocks: np.ndarray) -> np.ndarray:
        """``(m,)`` pool index of each global block, -1 for a padding block (``-1``)."""
        req = np.asarray(blocks, dtype=np.int64)
        out = np.full(req.shape, -1, dtype=np.int64)
        real = req >= 0
        if real.any():
            out[real] = self.source(req[real])[0]
        return out

    def counts(self, lo: int, hi: int) -> BlockCounts:
        """What global blocks ``[lo, hi)`` hold (per pool, per pass; full passes are stored).

        A pool's blocks in ``[lo, hi)`` are a contiguous run of its numbering when the order is
        sequential, and for the whole epoch or its partial last step in any order: those are
        counted from the passes; any other range is counted block by block from its stretches.
        """
        lo, hi = clip_range(lo, hi, self.num_blocks)
        G = self.schedule.global_batch
        contiguous = (
            self.schedule.block_order == "sequential"
            or (lo == 0 and hi == self.num_blocks)
            or lo >= self.num_blocks // G * G
        )
        if not contiguous:
            return _spans_counts(self.spans(np.arange(lo, hi, dtype=np.int64)))
        a, b = self.taken(lo), self.taken(hi)
        tokens = eos = filled = 0
        for p in range(len(self.pools)):
            c = _pool_range_counts(
                self.pass_ends[p],
                self.pass_counts[p],
                lambda q, p=p: self.pool_plan(p, q),
                int(a[p]),
                int(b[p]),
            )
            tokens, eos, filled = tokens + c.tokens, eos + c.eos, filled + c.filled
        return BlockCounts(tokens=tokens, eos=eos, filled=filled)


def _stream_key(pool: Any, pool_block: Any) -> Any:
    """The sortable key of a pool's block in its stream (:meth:`MixturePlan.stream_position`)."""
    return pool * (1 << 40) + pool_block


def _spans_counts(spans: Spans) -> BlockCounts:
    """Tokens, EOS and filled positions of the stretches of some blocks (context included, as
    in the plans' own counts)."""
    tokens = int(np.sum(spans.tok_end - spans.tok_start, dtype=np.int64))
    eos = int(np.sum(spans.has_eos, dtype=np.int64))
    return BlockCounts(tokens=tokens, eos=eos, filled=tokens + eos)


def _pool_plan(
    cache: OrderedDict,
    pools: tuple[Pool, ...],
    pool: int,
    pass_: int,
    seed: int,
    epoch: int,
    seq_len: int,
    recipe: Recipe,
    store: Any = None,
) -> RecipePlan:
    key = (pool, pass_)
    plan = cache.get(key)
    if plan is None:
        pl = pools[pool]
        plan = plan_recipe_epoch(
            pl.row_ids,
            pl.n_tokens,
            seed=pool_seed(seed, pool, pass_),
            epoch=epoch,
            seq_len=seq_len,
            recipe=recipe,
            cut_points=pl.cuts,
            store=store,
            ordering=pl.ordering,
        )
        cache[key] = plan
        # A pass is consumed in order: keep the recent ones. The reader thread and the main
        # thread may both touch the cache; a lost race only costs a re-plan, never an error.
        while len(cache) > 2 * len(pools) + 2:
            try:
                cache.popitem(last=False)
            except KeyError:
                break
    else:
        try:
            cache.move_to_end(key)
        except KeyError:
            pass
    return plan


def _pool_range_counts(
    ends: Sequence[int] | np.ndarray,
    pass_counts: Sequence[BlockCounts],
    pass_plan: Callable[[int], RecipePlan],
    a: int,
    b: int,
) -> BlockCounts:
    """Counts of one pool's blocks ``[a, b)`` (its own numbering across passes)."""
    tokens = eos = filled = 0
    q = int(np.searchsorted(ends, a, side="right")) - 1
    while a < b:
        lo, hi = a - int(ends[q]), min(b, int(ends[q + 1])) - int(ends[q])
        if lo == 0 and hi == int(ends[q + 1] - ends[q]):
            c = pass_counts[q]  # a full pass: stored
        else:
            c = pass_plan(q).counts(lo, hi)
        tokens, eos, filled = tokens + c.tokens, eos + c.eos, filled + c.filled
        a = int(ends[q]) + hi
        q += 1
    return BlockCounts(tokens=tokens, eos=eos, filled=filled)


def plan_mixture(
    pools: Sequence[Pool],
    *,
    seed: int,
    epoch: int,
    seq_len: int,
    recipe: Recipe | None = None,
    budget_tokens: int | None = None,
    global_batch: int = 1,
    block_order: str = "sequential",
    resolution: int = 10_000,
    store: Any = None,
) -> MixturePlan:
    """Plan one epoch of a token-quota mixture (see the module docstring).

    Args:
        pools: The pools, in a fixed order (their index seeds their permutations).
        seed: The job's seed.
        epoch: The epoch.
        seq_len: ``L``.
        recipe: Packing of every pool (default: concat).
        budget_tokens: Positions in the epoch (``ceil(budget / L)`` blocks); ``None``: until the
            first capped pool runs out.
        global_batch: Blocks per global step ``G``: every step holds the shares as nearly as
            ``G`` allows.
        block_order: How a pool numbers its blocks over the steps (``sequential`` or
            ``interleave``, see :mod:`~tokenloom.loader.plan.schedule`).
        resolution: Share resolution of :func:`share_weights` (the period is about this long).
        store: Optional :class:`~tokenloom.loader.pipeline.planstore.PlanStore` for the pools'
        passes.

    Returns:
        The :class:`MixturePlan`.

    Raises:
        PlanError: No pool, duplicate names, a bad share/cap/budget, or neither a budget nor a cap.
    """
    pools = tuple(pools)
    recipe = recipe or Recipe()
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise PlanError(f"pool names must be unique, got {names}")
    if budget_tokens is not None and (
        isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1
    ):
        raise PlanError(f"budget_tokens must be a positive integer or None, got {budget_tokens!r}")
    if budget_tokens is None and all(p.max_passes is None for p in pools):
        raise PlanError(
            "a mixture epoch needs an end: pass budget_tokens=, or max_passes= on some pool"
        )
    w = share_weights([p.share for p in pools], resolution=resolution)
    sched = step_schedule(w, global_batch=global_batch, block_order=block_order)
    L = int(seq_len)
    cache: OrderedDict = OrderedDict()
    invariant = recipe.packing == "concat"  # concat passes have the same size in any order

    def pass_counts(p: int, q: int) -> tuple[int, BlockCounts]:
        plan = _pool_plan(cache, pools, p, 0 if invariant else q, seed, epoch, L, recipe, store)
        return plan.num_blocks, plan.counts(0, plan.num_blocks)

    ends: list[list[int]] = [[0] for _ in pools]
    counts: list[list[BlockCounts]] = [[] for _ in pools]
    first: dict[int, tuple[int, BlockCounts]] = {}

    def extend(p: int, needed: float, cap: int | None) -> None:
        while ends[p][-1] < needed and (cap is None or len(counts[p]) < cap):
            q = len(counts[p])
            got = first[p] if invariant and p in first else pass_counts(p, q)
            first.setdefault(p, got)
            ends[p].append(ends[p][-1] + got[0])
            counts[p].append(got[1])

    budget = None if budget_tokens is None else -(-budget_tokens // L)
    need = sched.taken(budget) if budget is not None else None
    limits: list[tuple[int, int]] = []
    for p, pool in enumerate(pools):
        if pool.max_passes is None:
            continue
        extend(p, math.inf if need is None else int(need[p]), pool.max_passes)
        if need is None or ends[p][-1] < int(need[p]):
            limits.append((sched.position(p, ends[p][-1]), p))
    n_blocks = min([*(pos for pos, _ in limits), *([budget] if budget is not None else [])])
    limited_by = None
    if limits and min(limits)[0] == n_blocks and (budget is None or n_blocks < budget):
        limited_by = pools[min(limits)[1]].name
    final = sched.taken(n_blocks)
    for p, pool in enumerate(pools):
        extend(p, int(final[p]), pool.max_passes)
    total_share = float(sum(float(p.share) for p in pools))
    reports, tokens, filled = [], 0, 0
    for p, pool in enumerate(pools):
        c = _pool_range_counts(
            ends[p],
            counts[p],
            lambda q, p=p: _pool_plan(cache, pools, p, q, seed, epoch, L, recipe, store),
            0,
            int(final[p]),
        )
        full = int(np.searchsorted(ends[p], final[p], side="right")) - 1
        reports.append(
            PoolReport(
                name=pool.name,
                target_share=float(pool.share) / total_share,
                share=int(w[p]) / sched.period,
                blocks=int(final[p]),
                full_passes=full,
                passes=full + int(final[p] > ends[p][full]),
                max_passes=pool.max_passes,
                tokens=c.tokens,
                exhausted=limited_by == pool.name,
            )
        )
        tokens, filled = tokens + c.tokens, filled + c.filled
    return MixturePlan(
        seed=int(seed),
        epoch=int(epoch),
        seq_len=L,
        recipe=recipe,
        pools=pools,
        schedule=sched,
        pass_ends=tuple(np.asarray(e, dtype=np.int64) for e in ends),
        pass_counts=tuple(tuple(c) for c in counts),
        num_blocks=int(n_blocks),
        budget_blocks=budget,
        limited_by=limited_by,
        num_tokens=tokens,
        padding_positions=n_blocks * L - filled,
        reports=tuple(reports),
        _cache=cache,
        _store=store,
    )


def mixture_block_source(plan: MixturePlan, k: Any) -> tuple[Any, Any]:
    """``(pool, pool_block_index)`` of global block ``k`` (an int or an array), O(P) each.

    Computed from the periodic schedule without iterating from block 0.
    """
    p, j = plan.schedule.source(np.asarray(k, dtype=np.int64).reshape(-1), plan.num_blocks)
    if np.ndim(k) == 0:
        return int(p[0]), int(j[0])
    return p, j


def mixture_spans(plan: MixturePlan, blocks: np.ndarray) -> Spans:
    """The stretches of global blocks: each block is one block of one pool's pass plan.

    Args:
        plan: The mixture plan.
        blocks: ``(m,)`` global block indices in ``[0, num_blocks)`` or ``-1``.

    Returns:
        :class:`Spans` ordered by block then position; ``doc`` indexes the pool pass plan's
        visiting order (use :meth:`MixturePlan.source` for the pool and pass of each block).
    """
    req = check_blocks(blocks, plan.num_blocks)
    real = np.flatnonzero(req >= 0)
    parts: list[tuple[np.ndarray, Spans]] = []
    if real.size:
        p, _, q, b = plan.source(req[real])
        key = p * (int(q.max()) + 1) + q
        for u in np.unique(key).tolist():
            idx = np.flatnonzero(key == u)
            sub = plan.pool_plan(int(p[idx[0]]), int(q[idx[0]])).spans(b[idx])
            parts.append((real[idx][sub.block], sub))
    windowed = any(s.ctx_end is not None or s.ends_window is not None for _, s in parts)
    if not parts or sum(len(s) for _, s in parts) == 0:
        return empty_spans(req, plan.seq_len, windowed=windowed)
    block = np.concatenate([blk for blk, _ in parts])
    order = np.argsort(block, kind="stable")

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(s, name) for _, s in parts])[order]

    ctx = ends = None
    if windowed:
        ctx = np.concatenate(
            [s.ctx_end if s.ctx_end is not None else s.tok_start for _, s in parts]
        )[order]
        ends = np.concatenate(
            [
                s.ends_window if s.ends_window is not None else np.zeros(len(s), dtype=bool)
                for _, s in parts
            ]
        )[order]
    return Spans(
        seq_len=plan.seq_len,
        blocks=req,
        block=block[order],
        pos=cat("pos"),
        doc=cat("doc"),
        row_id=cat("row_id"),
        doc_len=cat("doc_len"),
        tok_start=cat("tok_start"),
        tok_end=cat("tok_end"),
        has_eos=cat("has_eos"),
        ctx_end=ctx,
        ends_window=ends,
    )
