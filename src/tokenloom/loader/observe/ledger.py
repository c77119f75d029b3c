"""The ledger: what a run's steps hold, per pool, from the plan alone (no token is read).

For each step the ledger builds the same spans the loader builds and packs them with placeholder
token ids — labels, padding and the loss mask depend only on the layout, never on the ids — so
its counts equal what the loader delivers (``DataLoader.stats``) for the same steps. With a
loss-mask column the ledger reads that column (never the tokens) for the rows of each step
through the planner's ``mask_reader``, and counts the labels it masks apart (``masked_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.change import SplicedView
from tokenloom.loader.plan.view import COUNT_FIELDS, GroupCounts, StepCounts

__all__ = ["PoolLedger", "Ledger", "LedgerCounter", "ledger"]


@dataclass(kw_only=True)
class PoolLedger:
    """Counts of one pool (or of the whole selection when there is no mixture)."""

    name: str
    blocks: int = 0
    body_tokens: int = 0
    """Document tokens placed in blocks (context-only overlap tokens excluded)."""
    separator_tokens: int = 0
    """EOS positions."""
    padding_positions: int = 0
    loss_positions: int = 0
    """Positions whose label is not -100."""
    overlap_tokens: int = 0
    """Tokens repeated from the previous window as context (no loss on their targets, unless
    the ledger's ``overlap_loss``: then they are trained again and in ``loss_positions``)."""
    marker_tokens: int = 0
    """Tokens a grouped spec put before files (file markers, a document's BOS): counted here,
    not in ``body_tokens`` (their targets train like any token's)."""
    masked_tokens: int = 0
    """Labels a loss-mask column set to -100 (targets in a masked span; not in
    ``loss_positions``)."""
    unique_documents: int = 0
    documents_seen_more_than_once: int = 0
    passes: int = 1


@dataclass(kw_only=True)
class Ledger:
    """The ledger of steps ``[0, steps)`` of one epoch."""

    epoch: int
    steps: int
    seq_len: int
    global_batch: int
    pools: list[PoolLedger]
    change: dict[str, Any] | None = None
    """When a stream change splices the epoch within the steps counted: the change
    (:meth:`~tokenloom.loader.plan.change.StreamChange.to_dict`) with ``dropped_by_change``, the
    tokens of rows partly fed before it that the rest of the epoch leaves out."""
    overlap_loss: bool = False
    """Whether the windows' overlap tokens keep their loss (the recipe's ``overlap_loss``)."""

    @property
    def total(self) -> dict[str, int]:
        return {k: sum(getattr(p, k) for p in self.pools) for k in COUNT_FIELDS}

    def to_json(self) -> dict[str, Any]:
        pools = []
        for p in self.pools:
            pools.append(asdict(p))
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "overlap_loss": self.overlap_loss,
            "pools": pools,
            "total": self.total,
            **({"change": self.change} if self.change is not None else {}),
        }


class LedgerCounter:
    """Adds up :class:`~tokenloom.loader.plan.view.StepCounts` into per-pool ledgers: the ledger
    command over a plan, and a training run over the batches it was actually fed.

    Documents are tracked with one saturating byte per row of each pool (how often its first
    token was seen), so memory stays at one byte per selected row however long the run.

    Args:
        names: The pools' names.
        universes: Per pool, the ascending table ids of its rows.
    """

    _FLUSH_IDS = 1 << 16
    """Pending document ids at which :meth:`add` folds them into :attr:`seen` itself."""

    def __init__(self, names: Sequence[str], universes: Sequence[np.ndarray]) -> None:
        self.names = list(names)
        self.universes = [np.asarray(u, dtype=np.int64) for u in universes]
        self._counts = np.zeros((len(self.names), len(COUNT_FIELDS)), dtype=np.int64)
        self._seen = [np.zeros(len(u), dtype=np.uint8) for u in self.universes]
        self._pending: list[list[np.ndarray]] = [[] for _ in self.universes]
        self._pending_ids = 0
        self._steps: list | None = None
        """``[group, a, b]``: steps ``[a, b)`` of a :class:`GroupCounts` counted by
        :meth:`add_step`, added when the counts are read or another group's step comes."""

    @property
    def counts(self) -> np.ndarray:
        """``(P, len(COUNT_FIELDS))`` int64 of the steps counted so far, per pool."""
        self._fold_steps()
        return self._counts

    @counts.setter
    def counts(self, value: np.ndarray) -> None:
        self._fold_steps()
        self._counts = value

    def add(self, step: StepCounts) -> None:
        """Count one step (or one rank's share of it). The block/token counts are added at
        once; the documents are kept aside and folded into :attr:`seen` in one vectorised pass
        when it is read (a training process counts every delivered step, and per-step
        ``searchsorted`` + ``unique`` calls were most of its loader time)."""
        self._add(step.counts, step.starts)

    def add_step(self, group: GroupCounts, i: int) -> None:
        """``add(group.step(i))``, once per step handed out: consecutive steps of one group
        are added together, in one vectorised pass, when the counts are read or a step of
        another group comes (per step, slicing the group's arrays was most of the training
        process's ledger time)."""
        pending = self._steps
        if pending is not None and pending[0] is group and pending[2] == i:
            pending[2] = i + 1
            return
        self._fold_steps()
        self._steps = [group, i, i + 1]

    def _fold_steps(self) -> None:
        if self._steps is None:
            return
        group, a, b = self._steps
        self._steps = None
        P = group.counts.shape[1]
        bounds = group.bounds[a * P : b * P + 1]
        ids = group.starts[bounds[0] : bounds[-1]]  # by step, then pool
        if P == 1:
            starts = [ids]
        else:
            pool = np.repeat(np.tile(np.arange(P), b - a), np.diff(bounds))
            starts = [ids[pool == p] for p in range(P)]
        self._add(group.counts[a:b].sum(axis=0), starts)

    def _add(self, counts: np.ndarray, starts: Sequence[np.ndarray]) -> None:
        self._counts += counts
        for p, ids in enumerate(starts):
            if len(ids):
                self._pending[p].append(ids)
                self._pending_ids += len(ids)
        if self._pending_ids >= self._FLUSH_IDS:
            self._fold()

    def _fold(self) -> None:
        self._fold_steps()
        for p, pending in enumerate(self._pending):
            if not pending:
                continue
            ids = np.concatenate(pending) if len(pending) > 1 else pending[0]
            where, times = np.unique(np.searchsorted(self.universes[p], ids), return_counts=True)
            seen = self._seen[p]
            seen[where] = np.minimum(seen[where].astype(np.int64) + times, 255)
            pending.clear()
        self._pending_ids = 0

    @property
    def seen(self) -> list[np.ndarray]:
        """Per pool, one saturating byte per row: how often its first token was seen."""
        self._fold()
        return self._seen

    def merge_seen(
        self, seen: Sequence[np.ndarray], universes: Sequence[np.ndarray] | None = None
    ) -> None:
        """Replace the seen-counters with ones summed elsewhere (e.g. over ranks), saturated.

        Args:
            seen: Per pool, one counter per row.
            universes: The rows ``seen`` counts, when not this counter's (a run's counters
                saved before a stream change added rows): each is carried to its row here.
        """
        self._fold()
        merged = [np.minimum(np.asarray(s), 255).astype(np.uint8) for s in seen]
        if universes is not None:
            carried = []
            for own, rows, counts in zip(self.universes, universes, merged, strict=True):
                out = np.zeros(len(own), dtype=np.uint8)
                out[np.searchsorted(own, np.asarray(rows, dtype=np.int64))] = counts
                carried.append(out)
            merged = carried
        self._seen = merged

    def pools(self) -> list[PoolLedger]:
        """The counts as :class:`PoolLedger` values (passes left at 1)."""
        out = []
        for p, name in enumerate(self.names):
            values = dict(zip(COUNT_FIELDS, self.counts[p].tolist(), strict=True))
            out.append(
                PoolLedger(
                    name=name,
                    unique_documents=int((self.seen[p] > 0).sum()),
                    documents_seen_more_than_once=int((self.seen[p] > 1).sum()),
                    **values,
                )
            )
        return out


def ledger(planner: Any, *, steps: int | None = None, epoch: int = 0) -> Ledger:
    """Count what the first ``steps`` global steps of ``epoch`` hold, per pool.

    Args:
        planner: A :class:`~tokenloom.loader.pipeline.planner.Planner` (or anything with ``view``,
            ``spec``: a :class:`~tokenloom.loader.PackedDataset` has both).
        steps: Steps to count (default: the whole epoch).
        epoch: The epoch.
    """
    planner = getattr(planner, "planner", planner)  # a dataset's own planner
    view = planner.view(epoch)
    spec = planner.spec
    steps = view.steps if steps is None else min(int(steps), view.steps)
    counter = LedgerCounter(spec.pool_names, planner.run_universes())
    P = len(spec.pool_names)
    # with a loss-mask column the ledger reads that column (never the tokens) for each step
    masks = planner.mask_reader() if spec.loss_mask_column is not None else None
    files = getattr(planner, "files", None)
    markers = 0
    for s in range(steps):
        layout = view.layout(s)
        counter.add(view.count(layout, view.skeleton(layout, masks), P))
        if files is not None:
            markers += _markers(files, layout.spans)
    pools = counter.pools()
    if files is not None:  # grouped specs have one pool
        pools[0].marker_tokens = markers
        pools[0].body_tokens -= markers
    if spec.mixture and not isinstance(view, SplicedView):
        plan = view.plan
        G = spec.global_batch
        done = plan.passes_done(steps * G)
        taken = plan.taken(steps * G)
        for i, led in enumerate(pools):
            led.passes = int(done[i]) + int(taken[i] > plan.pass_ends[i][done[i]])
    change = None
    if isinstance(view, SplicedView) and steps > view.at:
        change = {
            **planner.changes[-1].to_dict(),
            "dropped_by_change": view.delivered.dropped_tokens,
        }
    return Ledger(
        epoch=epoch,
        steps=steps,
        seq_len=spec.seq_len,
        global_batch=spec.global_batch,
        pools=pools,
        change=change,
        overlap_loss=bool(spec.recipe.overlap_loss),
    )


def _markers(files: Any, spans: Any) -> int:
    """Prefix tokens (markers, BOS) among the new (not context-only) tokens of ``spans``."""
    real = spans.row_id >= 0
    start = spans.tok_start
    if spans.ctx_end is not None:  # (a stretch without context may hold any ctx_end <= start)
        start = np.clip(spans.ctx_end, spans.tok_start, spans.tok_end)
    return int(files.marker_counts(spans.row_id[real], start[real], spans.tok_end[real]).sum())
