"""Loss by provenance: the training and validation loss of each mixture pool and named slice,
from the batch's own spans (no extra loader, no extra forward pass).

A batch says where each of its positions comes from: ``spans`` (``(S, 5)``: block, position,
table ``id``, token range) lists the stretches of each block in order, ``doc_ids`` numbers them
within the block (``-1`` on padding), and with a mixture ``block_pool`` gives each block's pool.
So the stretch of position ``(b, t)`` is ``first[b] + doc_ids[b, t]`` and a stretch belongs to a
group (a pool, a slice) or not. Each step the forward pass returns per-token losses
(``reduction="none"``; their sum is what is back-propagated), which are summed per stretch on the
device (``index_add_``) and then per group (``(S, G)`` membership matrix): a few hundred
numbers per step, all-reduced only when the loop logs.

Groups, named ``pool/NAME`` and ``slice/NAME``:

* training: the mixture's pools from ``block_pool`` (the blocks the ledger counts, so each
  pool's target count equals the ledger's ``loss_positions``) and every ``--loss-slice``;
* validation (no mixture: the validation loader reads the held-out rows plainly): each pool's
  filter and every slice, resolved to row membership (:mod:`~tokenloom.train.slices`).

A group's loss is the mean over its target tokens (positions whose label is not ``-100``) of the
steps since the last log line (training) or of one evaluation (validation). Without a mixture and
without slices nothing is tracked and the loss is computed exactly as before (``reduction="sum"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tokenloom.train.slices import SliceMembership, resolve_slices

__all__ = ["GroupLoss", "ProvenanceLoss", "ProvenanceLosses", "stretch_index"]


def stretch_index(spans: np.ndarray, doc_ids: np.ndarray) -> np.ndarray:
    """``(B, T)`` int64: the row of ``spans`` each position comes from, ``-1`` on padding.

    Args:
        spans: ``(S, 5)`` provenance of the batch, ordered by block then position.
        doc_ids: ``(B, T)`` segment index within each block (``-1`` on padding).
    """
    doc_ids = np.asarray(doc_ids)
    B = doc_ids.shape[0]
    blocks = np.asarray(spans)[:, 0] if len(spans) else np.zeros(0, dtype=np.int64)
    first = np.searchsorted(blocks, np.arange(B))  # (B,) first stretch of each block
    return np.where(doc_ids >= 0, first[:, None] + doc_ids, -1).astype(np.int64)


@dataclass(frozen=True)
class GroupLoss:
    """One group's mean loss over its target tokens."""

    loss: float
    """``nan`` when the group had no target token."""
    tokens: int
    """Target tokens of the group (all ranks)."""


class ProvenanceLoss:
    """Per-group loss sums and target counts, accumulated step by step on the device."""

    def __init__(
        self,
        names: Sequence[str],
        weigh: Callable[[dict], np.ndarray],
        device: torch.device,
    ) -> None:
        """``names``: the groups; ``weigh(batch)``: ``(S, G)`` membership of each stretch."""
        self.names = tuple(names)
        self.weigh = weigh
        self.device = device
        self.totals = torch.zeros(2, len(self.names), dtype=torch.float64, device=device)
        self._parts: list[torch.Tensor] = []

    @property
    def active(self) -> bool:
        """Whether any group is tracked."""
        return bool(self.names)

    @property
    def reduction(self) -> str:
        """What the forward pass returns: per-token losses when tracking, else their sum."""
        return "none" if self.active else "sum"

    def take(self, loss: torch.Tensor) -> torch.Tensor:
        """The summed loss of a micro-batch; keeps its per-token losses for :meth:`add`."""
        if not self.active:
            return loss
        self._parts.append(loss.detach())
        return loss.sum()

    def add(self, batch: dict) -> None:
        """Add the step's batch: the per-token losses :meth:`take` kept, by group."""
        if not self.active:
            return
        losses = torch.cat(self._parts).double() if self._parts else None
        self._parts = []
        spans = np.asarray(batch["spans"])
        if losses is None or not len(spans):
            return
        idx = stretch_index(spans, batch["doc_ids"]).reshape(-1)  # (B * T,)
        target = np.asarray(batch["labels"]).reshape(-1) != -100
        keep = target & (idx >= 0)
        S = spans.shape[0]
        counts = np.bincount(idx[keep], minlength=S).astype(np.float64)  # (S,)
        where = torch.from_numpy(np.flatnonzero(keep)).to(self.device, non_blocking=True)
        which = torch.from_numpy(idx[keep]).to(self.device, non_blocking=True)
        sums = torch.zeros(S, dtype=torch.float64, device=self.device)
        sums.index_add_(0, which, losses[where])  # (S,) loss of each stretch's targets
        weights = torch.from_numpy(self.weigh(batch).astype(np.float64)).to(self.device)
        per = torch.stack([sums, torch.from_numpy(counts).to(self.device)])  # (2, S)
        self.totals += per @ weights  # (2, G)

    def report(self, dist) -> dict[str, GroupLoss]:  # noqa: ANN001 - a train.dist.Dist
        """The groups' losses since the last report, over all ranks (every rank calls this at
        the same step); the sums start again."""
        totals = dist.all_reduce_sum(self.totals.clone()).cpu()
        self.totals.zero_()
        out = {}
        for g, name in enumerate(self.names):
            n = int(totals[1, g])
            out[name] = GroupLoss(float(totals[0, g] / n) if n else math.nan, n)
        return out


def _slice_weights(slices: Sequence[SliceMembership], spans: np.ndarray) -> np.ndarray:
    rows = spans[:, 2]
    if not slices:
        return np.zeros((len(rows), 0), dtype=bool)
    return np.stack([s.contains(rows) for s in slices], axis=1)  # (S, K)


class ProvenanceLosses:
    """The run's two trackers (training, validation) and how their results are reported."""

    def __init__(self, train: ProvenanceLoss, val: ProvenanceLoss) -> None:
        self.train, self.val = train, val

    @classmethod
    def setup(cls, cfg, spec, device: torch.device, warn) -> ProvenanceLosses:  # noqa: ANN001
        """Resolve the slices and the pools' filters on the pinned table version (``spec``);
        a slice matching no row is reported through ``warn``.

        Raises:
            SliceError: a slice (or a pool filter) that does not work on the table.
        """
        slices = resolve_slices(
            spec.table,
            cfg.loss_slices,
            version=spec.version,
            storage_options=cfg.storage_options,
        )
        for s in slices:
            if not s.rows:
                warn(
                    f"warning: --loss-slice {s.name}={s.sql} matches no row of {spec.table} "
                    f"v{spec.version}; its loss stays empty (check it with `tokenloom stats "
                    f'--table {spec.table} --filter "{s.sql}"`)'
                )
        pools = tuple(p.name for p in spec.mixture)
        slice_names = tuple(f"slice/{s.name}" for s in slices)

        def train_weights(batch: dict) -> np.ndarray:
            spans = np.asarray(batch["spans"])
            P = len(pools)
            onehot = np.zeros((spans.shape[0], P), dtype=bool)
            if P and "block_pool" in batch:
                pool = np.asarray(batch["block_pool"])[spans[:, 0]]  # (S,) pool of the block
                real = pool >= 0
                onehot[np.flatnonzero(real), pool[real]] = True
            return np.concatenate([onehot, _slice_weights(slices, spans)], axis=1)

        train = ProvenanceLoss((*(f"pool/{p}" for p in pools), *slice_names), train_weights, device)
        val_groups: list[SliceMembership] = []
        if cfg.val_filter and (pools or slices):
            pool_sets = resolve_slices(
                spec.table,
                [(p.name, p.filter) for p in spec.mixture],
                version=spec.version,
                storage_options=cfg.storage_options,
            )
            val_groups = [*pool_sets, *slices]
        val = ProvenanceLoss(
            (*(f"pool/{p}" for p in pools), *slice_names) if val_groups else (),
            lambda batch: _slice_weights(val_groups, np.asarray(batch["spans"])),
            device,
        )
        return cls(train, val)

    def log_train(self, step: int, dist, metrics, log, history: dict) -> None:  # noqa: ANN001
        """At a log step (every rank): the training groups since the last log line, to the log,
        the metric sinks and the run's history."""
        if self.train.active:
            self._publish(step, "train", self.train.report(dist), metrics, log, history)

    def log_val(self, step: int, dist, metrics, log, history: dict) -> None:  # noqa: ANN001
        """After an evaluation (every rank): the validation groups of that evaluation."""
        if self.val.active:
            self._publish(step, "val", self.val.report(dist), metrics, log, history)

    @staticmethod
    def last(history: dict) -> dict[str, dict]:
        """``{"train"|"val": {group: {"loss", "tokens"}}}``: the last values in ``history``."""
        by = {split: history.get(f"{split}_by") for split in ("train", "val")}
        return {split: values[-1][1] for split, values in by.items() if values}

    def _publish(self, step, split, values, metrics, log, history) -> None:  # noqa: ANN001
        log(f"{'':>13}{split} loss by: {self.line(values)}")
        as_json = self.as_json(values)
        metrics.groups(step, split, {k: (v["loss"], v["tokens"]) for k, v in as_json.items()})
        history.setdefault(f"{split}_by", []).append((step, as_json))

    @staticmethod
    def line(values: dict[str, GroupLoss]) -> str:
        """``pool/web 3.2104 (1,024 tok)  slice/code 2.9876 (512 tok)`` for the log."""
        return "  ".join(f"{name} {v.loss:.4f} ({v.tokens:,} tok)" for name, v in values.items())

    @staticmethod
    def as_json(values: dict[str, GroupLoss]) -> dict[str, dict]:
        """``{name: {"loss": ..., "tokens": ...}}`` (``loss`` ``None`` for an empty group)."""
        return {
            name: {"loss": None if math.isnan(v.loss) else v.loss, "tokens": v.tokens}
            for name, v in values.items()
        }
