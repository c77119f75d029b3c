"""``Planner``: a :class:`~tokenloom.loader.plan.spec.LoaderSpec` resolved against its table.

Opening a planner pins the table version and resolves what the plan is computed from — ``(id,
n_tokens)`` of the selected rows (per pool for a mixture), cut points of long rows, the token
column's tokenizer identity — and nothing else: no token list is read. From there every epoch's
plan, its :class:`~tokenloom.loader.plan.view.EpochView`, its exact sizes and the plan's fingerprint
inputs are pure computations. A large selection's visiting order is shared by every process of
the node through a :class:`~tokenloom.loader.pipeline.planstore.PlanStore` (built once,
memory-mapped), and so are the scanned inputs of a large selection (one scan per node).
The dataset reads through a planner; the ledger, ``trace``, ``verify`` and ``stats`` use one
without torch.

A run whose data changed mid-stream has a planner per phase: the last phase's planner holds the
run's :class:`~tokenloom.loader.plan.change.StreamChange` records (``changes``) and builds the
previous phase's on demand (:meth:`Planner.previous`), so :meth:`Planner.view` of a changed epoch
is a :class:`~tokenloom.loader.plan.change.SplicedView` and every reader sees the run's real stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from tokenloom.loader.pipeline.exclude import excluded_rows, keep_mask, later_epoch_plan
from tokenloom.loader.pipeline.exclude import register as _register_exclude
from tokenloom.loader.pipeline.groups import group_inputs, scan_files
from tokenloom.loader.pipeline.inputs import (
    INPUTS_FORMAT,
    PlanInputs,
    compact_inputs,
    input_parts,
    inputs_from,
    scan_ordering,
    scan_plan_inputs,
    table_identity,
)
from tokenloom.loader.pipeline.planstore import PlanStore
from tokenloom.loader.pipeline.read import (
    LoaderError,
    check_cut_column,
    read_cut_points,
    take_cut_points,
)
from tokenloom.loader.plan.change import (
    SplicedView,
    StreamChange,
    change_kind,
    changes_inputs,
    delivered_rows,
)
from tokenloom.loader.plan.compact import count_nonzero
from tokenloom.loader.plan.files import Files, group_cuts
from tokenloom.loader.plan.mixture import MIXTURE_ALGORITHM, Pool, plan_mixture
from tokenloom.loader.plan.recipe import plan_recipe_epoch
from tokenloom.loader.plan.reweight import register as _register_reweight
from tokenloom.loader.plan.shuffle import PERMUTATION_ALGORITHM
from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.loader.plan.stream.cursor import PlanCache
from tokenloom.loader.plan.view import BlockPlan, EpochView
from tokenloom.loader.plan.window import WindowTable, window_table
from tokenloom.table.filters import and_filters

__all__ = ["Planner", "EmptyEpochError"]


class EmptyEpochError(LoaderError):
    """An epoch of the loader has no global step: iterating it would yield nothing, forever."""


_register_exclude()  # the kinds of stream change beyond ``continue``
_register_reweight()

_PLANS_KEPT = 2  # the current epoch and the next (a reader thread may look ahead)


def union_inputs(parts: list[PlanInputs], store: PlanStore | None = None) -> PlanInputs:
    """One row-id -> stable-row-id map over every pool (a row may sit in several pools); shared
    through ``store`` when every pool's inputs are."""

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        ids = np.concatenate([np.asarray(p.row_ids) for p in parts])
        uniq, first = np.unique(ids, return_index=True)
        del ids
        counts = np.concatenate([np.asarray(p.n_tokens) for p in parts])[first]
        rowids = np.concatenate([np.asarray(p.rowids) for p in parts])[first]
        columns = compact_inputs(uniq, counts, rowids)
        meta = {
            "version": parts[0].version,
            "null_rows": sum(p.null_rows for p in parts),
            "filter_nulls": sum(p.filter_nulls for p in parts),  # per pool, as each filter
            "filter_null_columns": sorted({c for p in parts for c in p.filter_null_columns}),
        }
        return input_parts(columns, {**meta, "tokenizer": parts[0].tokenizer})

    path = None
    if store is not None and all(p.shared is not None for p in parts):
        pools = ";".join(os.path.basename(p.shared or "") for p in parts)
        key = hashlib.sha256(f"union-v2;{INPUTS_FORMAT};{pools}".encode()).hexdigest()[:32]
        arrays, meta, path = store.arrays(key, build)
    else:
        arrays, meta = build()
    return inputs_from(arrays, meta, path)


class Planner:
    """The loader's whole stream, planned from stored counts (see the module docstring).

    Args:
        spec: What to deliver. ``spec.version=None`` pins the latest version now.
        storage_options: Object-store options for Lance (not part of the stream).
        table: An already open :class:`tokenloom.table.Table` to use instead of opening
            ``spec.table``.
        plan_store: Where epoch layouts are shared between the processes of a node (not part
            of the stream): a :class:`PlanStore`, ``None`` to keep them in memory, or
            ``"default"`` for :meth:`PlanStore.default`.
        changes: The run's stream changes, in order (:mod:`~tokenloom.loader.plan.change`); the last
            one's ``version_after`` must be the version this planner reads.

    Raises:
        LoaderError: A column is missing, the filter does not work, or no EOS id is known.
    """

    def __init__(
        self,
        spec: LoaderSpec,
        *,
        storage_options: Mapping[str, str] | None = None,
        table: Any = None,
        plan_store: PlanStore | str | None = "default",
        changes: tuple[StreamChange, ...] = (),
    ) -> None:
        from tokenloom.table import Table

        handle = table or Table.open(
            spec.table, version=spec.version, storage_options=storage_options
        )
        if spec.version is not None and handle.version != spec.version:
            handle = handle.checkout(spec.version)
        self.uri: str = handle.uri
        self.storage_options = dict(storage_options) if storage_options else None
        ds = handle.dataset
        if isinstance(plan_store, str) and plan_store != "default":
            raise LoaderError(
                f"plan_store must be a PlanStore, None or 'default', not {plan_store!r}"
            )
        self.store: PlanStore | None = (
            PlanStore.default() if isinstance(plan_store, str) else plan_store
        )
        """Where large plan inputs and epoch layouts are shared on this node (``None``: in
        memory)."""
        count = spec.count_column
        assert count is not None  # derived by LoaderSpec
        if spec.mixture:
            self.pool_inputs: list[PlanInputs] = [
                scan_plan_inputs(
                    ds,
                    token_column=spec.token_column,
                    count_column=count,
                    filter=and_filters(ds, pool.filter, spec.filter),
                    allow_missing=spec.allow_missing,
                    store=self.store,
                )
                for pool in spec.mixture
            ]
            self.inputs: PlanInputs = union_inputs(self.pool_inputs, self.store)
        else:
            self.pool_inputs = []
            self.inputs = scan_plan_inputs(
                ds,
                token_column=spec.token_column,
                count_column=count,
                filter=spec.filter,
                allow_missing=spec.allow_missing,
                store=self.store,
            )
        self.files: Files | None = None
        """With ``spec.group``: the selection's rows as groups (the plan's documents), and
        :attr:`row_inputs` the rows' own inputs; :attr:`inputs` are then the groups'."""
        self.row_inputs: PlanInputs = self.inputs
        if spec.group is not None and changes:
            raise LoaderError(
                "grouped rows (--group-by, --file-marker, --bos) are not combined with data "
                "changes (--data-change continue, --reweight, --exclude) yet; start a new run "
                "with --init-from instead"
            )
        if spec.group is not None:
            self.files = scan_files(ds, self.inputs, spec.group, spec.token_column)
            self.inputs = group_inputs(self.files, self.row_inputs)
        self.orderings: list[Any] = []
        """With ``spec.order_by``: per pool (one without a mixture), the
        :class:`~tokenloom.loader.plan.order.Ordering` of its rows."""
        if spec.order_by is not None:
            self.orderings = [
                scan_ordering(
                    ds,
                    inp,
                    filter=flt,
                    order_by=spec.order_by,
                    jitter=spec.order_jitter,
                    store=self.store,
                )
                for inp, flt in zip(
                    self.pool_inputs or [self.inputs],
                    [and_filters(ds, p.filter, spec.filter) for p in spec.mixture] or [spec.filter],
                    strict=True,
                )
            ]
        recipe = spec.recipe
        self.cuts: Any
        self.pool_cuts: list[Any] = [None] * len(self.pool_inputs)
        """Per mixture pool, its :class:`WindowTable` (windows or best-fit), else ``None``."""
        if recipe.windows or recipe.packing == "best_fit":
            # The windows (best-fit's pieces of long rows too) do not depend on the epoch: cut
            # them once per selection (per pool in a mixture), reading the cut points a batch
            # of long rows at a time, and keep only the windows.
            if recipe.cut_column is not None:
                check_cut_column(ds, recipe.cut_column, units=recipe.long_docs == "units")
            tables = [
                _window_table(ds, inp, recipe, spec.seq_len, files=self._window_files(recipe))
                for inp in (self.pool_inputs if spec.mixture else [self.inputs])
            ]
            if spec.mixture:
                self.cuts, self.pool_cuts = None, tables
            else:
                self.cuts = tables[0]
        else:
            self.cuts = read_cut_points(
                ds,
                self.inputs,
                recipe.cut_column,
                recipe.window or spec.seq_len,
                bool(spec.mixture),
            )
        if spec.loss_mask_column is not None:
            check_loss_mask(ds, spec, self.inputs.rowids, handle.uri)
        tok = self.inputs.tokenizer
        eos = spec.eos_id if spec.eos_id is not None else tok.get("eos_id")
        if eos is None:
            raise LoaderError(
                f"no EOS id: the column {spec.token_column!r} records no tokenizer; set eos_id "
                f"in the loader spec (--eos-id)"
            )
        pad = spec.pad_id if spec.pad_id is not None else tok.get("pad_id")
        self.eos_id: int = int(eos)
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        self.identity: str = table_identity(ds)
        """Which table this is (not only which version): see ``table_identity``."""
        self.spec: LoaderSpec = spec.replace(version=handle.version)
        """The spec with the version pinned (what checkpoints record)."""
        self._plans: PlanCache[BlockPlan] = PlanCache(keep=_PLANS_KEPT)
        self.changes: tuple[StreamChange, ...] = tuple(changes)
        """The run's stream changes so far, in order (empty: one phase)."""
        if self.changes and self.changes[-1].version_after != self.version:
            raise LoaderError(
                f"the run's last stream change moved to table version "
                f"{self.changes[-1].version_after} but the loader reads version {self.version}"
            )
        self._previous: Planner | None = None
        self._spliced: dict[int, SplicedView] = {}
        self._excluded: np.ndarray | None = None

    def _window_files(self, recipe: Any) -> tuple[Files, PlanInputs] | None:
        """Grouped windows: the layout whose file edges are cut points, and the rows' inputs."""
        if self.files is None or not recipe.windows:
            return None
        return self.files, self.row_inputs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plans"] = PlanCache(keep=_PLANS_KEPT)  # a worker maps the shared layouts
        state["_spliced"] = {}
        return state

    @property
    def version(self) -> int:
        """The pinned table version."""
        return int(self.spec.version)  # type: ignore[arg-type]

    # -- plans --------------------------------------------------------------------------------

    def previous(self) -> Planner:
        """The previous phase's planner: the one before the last change (built once).

        Raises:
            LoaderError: This planner has no change.
        """
        if not self.changes:
            raise LoaderError("a planner without a stream change has no previous phase")
        if self._previous is None:
            change = self.changes[-1]
            spec = change_kind(change.kind).previous_spec(change, self.spec)
            self._previous = Planner(
                spec,
                storage_options=self.storage_options,
                plan_store=self.store,
                changes=self.changes[:-1],
            )
        return self._previous

    def plan(self, epoch: int) -> BlockPlan:
        """Epoch ``epoch``'s plan (the last few are cached). Across a stream change: the previous
        phase's plan of an earlier epoch, the tail's of the changed one."""
        epoch = int(epoch)
        if self.changes and epoch <= self.changes[-1].epoch:
            return self.view(epoch).plan
        return self._own_plan(epoch)

    @property
    def excluded(self) -> np.ndarray:
        """Ascending table ids the run's ``exclude`` changes left out of its stream (read from
        their quarantines once; :mod:`~tokenloom.loader.pipeline.exclude`)."""
        if self._excluded is None:
            self._excluded = excluded_rows(self.changes, storage_options=self.storage_options)
        return self._excluded

    def _not_excluded(self, inputs: PlanInputs) -> np.ndarray:
        """A selection's token counts with the rows the run excluded counted as empty."""
        n = np.asarray(inputs.n_tokens)
        if not len(self.excluded):
            return n
        return np.where(keep_mask(inputs.row_ids, self.excluded), n, 0)

    def _own_plan(self, epoch: int) -> BlockPlan:
        """This phase's plan of ``epoch``, from its own version and spec (the last few cached)."""
        return self._plans.get(epoch, self._build_plan)

    def _build_plan(self, epoch: int) -> BlockPlan:
        spec = self.spec
        if len(self.excluded):  # the seeded order of every row, the excluded ones left out
            plan: BlockPlan = later_epoch_plan(self, epoch, self.excluded)
        elif spec.mixture:
            pools = [
                Pool(
                    name=p.name,
                    row_ids=inp.row_ids,
                    n_tokens=inp.n_tokens,
                    share=p.share,
                    max_passes=p.max_passes,
                    ordering=self.orderings[i] if self.orderings else None,
                    cuts=cuts,
                )
                for i, (p, inp, cuts) in enumerate(
                    zip(spec.mixture, self.pool_inputs, self.pool_cuts, strict=True)
                )
            ]
            plan = plan_mixture(
                pools,
                seed=spec.seed,
                epoch=epoch,
                seq_len=spec.seq_len,
                recipe=spec.recipe,
                budget_tokens=spec.budget_tokens,
                global_batch=spec.global_batch,
                block_order=spec.block_order,
                store=self.store,
            )
        else:
            plan = plan_recipe_epoch(
                self.inputs.row_ids,
                self.inputs.n_tokens,
                seed=spec.seed,
                epoch=epoch,
                seq_len=spec.seq_len,
                recipe=spec.recipe,
                cut_points=self.cuts,
                store=self.store,
                ordering=self.orderings[0] if self.orderings else None,
            )
        return plan

    def view(self, epoch: int) -> EpochView:
        """Epoch ``epoch`` cut into global steps (across a stream change, the previous phase's
        view of an earlier epoch, and a :class:`~tokenloom.loader.plan.change.SplicedView` of the
        changed one).

        Every reader of an epoch (the dataset and its workers, training, resume, ``verify``,
        ``stats``, the ledger) comes through here, so an epoch of zero steps is refused here
        once: a loop rolling over epochs would otherwise spin without ever yielding a batch.

        Raises:
            EmptyEpochError: The epoch has no global step; the message names the cause (a
                selection without tokens, or ``drop_last`` with less than one global batch).
        """
        epoch = int(epoch)
        if self.changes and epoch <= self.changes[-1].epoch:
            change = self.changes[-1]
            if epoch < change.epoch:
                return self.previous().view(epoch)
            spliced = self._spliced.get(epoch)
            if spliced is None:
                spliced = self._splice(change)
                self._spliced = {epoch: spliced}
            if spliced.steps == 0:
                raise EmptyEpochError(self._empty_epoch(spliced.tail, epoch))
            return spliced
        view = self._view_of(self._own_plan(epoch))
        if view.steps == 0:
            raise EmptyEpochError(self._empty_epoch(view, int(epoch)))
        return view

    def _view_of(self, plan: BlockPlan) -> EpochView:
        """``plan`` cut into this spec's global steps."""
        s = self.spec
        return EpochView(
            plan,
            global_batch=s.global_batch,
            drop_last=s.drop_last,
            block_order=s.block_order,
            lookahead=s.lookahead,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            overlap_loss=s.recipe.overlap_loss,
        )

    def _splice(self, change: StreamChange) -> SplicedView:
        """The changed epoch: the previous phase's steps before the change, the tail after."""
        prev = self.previous()
        try:
            head = prev.view(change.epoch)
        except EmptyEpochError:
            head = None
        at = change.step
        if head is None or at > head.steps:
            steps = 0 if head is None else head.steps
            raise LoaderError(
                f"the stream change at step {at} of epoch {change.epoch} is past that epoch's "
                f"{steps} steps on table version {change.version_before}"
            )
        delivered = delivered_rows(head, at)  # a spliced head: every earlier phase's rows too
        index = len(self.changes) - 1
        tail = change_kind(change.kind).tail_plan(self, change, index, head, delivered)
        return SplicedView(
            head,
            self._view_of(tail),
            at=at,
            head_source=prev,
            tail_source=self,
            delivered=delivered,
        )

    def plan_rows(
        self,
        keep: list[np.ndarray],
        *,
        seed: int,
        epoch: int,
        budget_tokens: int | None = None,
        order: np.ndarray | None = None,
    ) -> BlockPlan:
        """This phase's recipe over a subset of its selection, in its own order: the plan a
        stream change's tail reads (vectorised: the left-out rows count as empty, so the
        selection's ids, and the cut points keyed by them, stay as they are). Rows the run
        excluded (:attr:`excluded`) are left out whatever ``keep`` says.

        Args:
            keep: Per pool (one entry without a mixture), ``(N,)`` bool aligned with
                :meth:`universes`: which rows to plan (a mixture's pool left with no token
                is planned whole: a new pass, keeping its share).
            seed: The seed of the visiting order (a change derives its own).
            epoch: The epoch.
            budget_tokens: A mixture's budget for this plan (``None``: the spec's).
            order: An explicit visiting order (positions into the selection of the rows kept,
                each once) instead of the seeded one; not for a mixture.
        """
        spec = self.spec
        if len(self.excluded):
            universes = self.universes()
            keep = [k & keep_mask(u, self.excluded) for k, u in zip(keep, universes, strict=True)]
        if spec.mixture:
            if order is not None:
                raise LoaderError("a mixture's tail has no single visiting order to keep")
            lens = [
                np.where(k, np.asarray(inp.n_tokens), 0)
                for inp, k in zip(self.pool_inputs, keep, strict=True)
            ]
            budget = spec.budget_tokens if budget_tokens is None else budget_tokens
            if budget == 0 or not any(int(n.sum()) for n in lens):
                return _empty_plan(seed, epoch, spec.seq_len)
            # a pool with none of its rows left keeps its share with a new pass over all of
            # them, as a mixture repeats a pool it has used up
            lens = [
                n if int(n.sum()) else self._not_excluded(inp)
                for n, inp in zip(lens, self.pool_inputs, strict=True)
            ]
            pools = [
                Pool(
                    name=p.name,
                    row_ids=inp.row_ids,
                    n_tokens=n,
                    share=p.share,
                    max_passes=p.max_passes,
                    ordering=self.orderings[i] if self.orderings else None,
                    cuts=self._tail_cuts(inp, n) if self._windowed() else None,
                )
                for i, (p, inp, n) in enumerate(
                    zip(spec.mixture, self.pool_inputs, lens, strict=True)
                )
            ]
            return plan_mixture(
                pools,
                seed=seed,
                epoch=epoch,
                seq_len=spec.seq_len,
                recipe=spec.recipe,
                budget_tokens=budget,
                global_batch=spec.global_batch,
                block_order=spec.block_order,
            )
        (mask,) = keep
        lens = np.where(mask, np.asarray(self.inputs.n_tokens), 0)
        recipe = spec.recipe
        cuts = self._tail_cuts(self.inputs, lens) if self._windowed() else self.cuts
        return plan_recipe_epoch(
            np.asarray(self.inputs.row_ids),
            lens,
            seed=seed,
            epoch=epoch,
            seq_len=spec.seq_len,
            recipe=recipe,
            cut_points=cuts,
            ordering=self.orderings[0] if self.orderings else None,  # a curriculum goes on
            order=order,
        )

    def _windowed(self) -> bool:
        """Whether the recipe cuts long rows into windows once per selection (windows, units,
        best-fit's pieces): then a tail's windows are cut again over the rows it keeps."""
        recipe = self.spec.recipe
        return bool(recipe.windows or recipe.packing == "best_fit")

    def _tail_cuts(self, inputs: PlanInputs, lens: np.ndarray) -> WindowTable:
        """The windows of a change's tail: ``inputs``' rows with lengths ``lens`` (left-out
        rows empty), cut at the cut column of this phase's version."""
        ds = None
        if self.spec.recipe.cut_column is not None:
            from tokenloom.table import Table

            ds = Table.open(
                self.uri, version=self.version, storage_options=self.storage_options
            ).dataset
        return _window_table(ds, inputs, self.spec.recipe, self.spec.seq_len, lens)

    def _empty_epoch(self, view: EpochView, epoch: int) -> str:
        """Why epoch ``epoch`` has no step, and what to change."""
        s, plan = self.spec, view.plan
        where = f"{self.uri} (version {self.version})"
        if plan.num_blocks == 0:
            what = (
                f"the mixture's pools ({', '.join(s.pool_names)}) and --filter {s.filter!r}"
                if s.mixture
                else f"--filter {s.filter!r}"
            )
            rows = len(self.inputs.row_ids)
            return (
                f"epoch {epoch} has no step: {what} selects {rows:,} rows and no token in "
                f"{where}; widen the filter (`tokenloom stats --table {s.table}` shows what "
                "the table holds)"
            )
        return (
            f"epoch {epoch} has no step: its {plan.num_blocks:,} blocks of {s.seq_len} tokens "
            f"are fewer than one global batch of {s.global_batch} blocks, and --drop-last "
            f"leaves that incomplete step out; pass --global-batch-size {plan.num_blocks} or "
            "less, or drop --drop-last"
        )

    def universes(self) -> list[Any]:
        """Per pool, the ascending table ids of its rows (the selection without a mixture)."""
        return [inp.row_ids for inp in self.pool_inputs] or [self.inputs.row_ids]

    def run_universes(self) -> list[np.ndarray]:
        """:meth:`universes` of every phase of the run, united per pool: the rows a run's
        ledger counts (a row deleted by a change was still fed before it)."""
        own = [np.asarray(u, dtype=np.int64) for u in self.universes()]
        if not self.changes:
            return own
        before = self.previous().run_universes()
        if len(before) != len(own):
            return own
        return [np.union1d(a, b) for a, b in zip(before, own, strict=True)]

    def mask_reader(self) -> Any:
        """With a loss-mask column, what reads its spans for a layout (the ledger's one read:
        that column, never the tokens); ``None`` without one."""
        column = self.spec.loss_mask_column
        if column is None:
            return None
        import lance

        from tokenloom.loader.pipeline.lossmask import MaskReader

        ds = lance.dataset(self.uri, version=self.version, storage_options=self.storage_options)
        return MaskReader(ds, column, self.inputs)

    def steps(self, epoch: int) -> int:
        """Global steps of epoch ``epoch``."""
        return self.view(epoch).steps

    def locate(self, global_step: int) -> tuple[int, int]:
        """A step counted from the start of epoch 0 → ``(epoch, step within it)``.

        Raises:
            EmptyEpochError: An epoch on the way has no step (an endless search otherwise).
        """
        g, epoch = int(global_step), 0
        while True:
            n = self.steps(epoch)  # never 0: view() refuses an empty epoch
            if g < n:
                return epoch, g
            g, epoch = g - n, epoch + 1

    def epoch_info(self, epoch: int) -> dict[str, Any]:
        """Exact sizes of an epoch from stored counts: steps, blocks, tokens, padding, dropped."""
        view = self.view(epoch)
        plan, sizes = view.plan, view.sizes
        info: dict[str, Any] = {
            "epoch": plan.epoch,
            "rows": len(self.inputs.row_ids),
            "empty_rows": len(self.inputs.n_tokens) - count_nonzero(self.inputs.n_tokens),
            "null_rows": self.inputs.null_rows,
            "filter_null_rows": self.inputs.filter_nulls,
            "filter_null_columns": list(self.inputs.filter_null_columns),
            "tokens": plan.num_tokens,
            "blocks": plan.num_blocks,
            "steps": sizes.steps,
            "padding_positions": sizes.padding_positions,
            "padding_blocks": sizes.padding_blocks,
            "dropped_tokens": sizes.dropped_tokens,
        }
        if isinstance(view, SplicedView):
            d = view.delivered
            info["change"] = {
                **self.changes[-1].to_dict(),
                "rows_delivered_before": int(len(d.row_ids)),
                "partial_rows": int(len(d.partial_ids)),
                "dropped_by_change": d.dropped_tokens,
            }
            info["tokens"] = _head_tokens(view) + plan.num_tokens
            info["blocks"] = view.at * view.global_batch + plan.num_blocks
        if self.files is not None:
            info["groups"] = {
                "documents": self.files.groups,
                "rows": int(self.files.rows.shape[0]),
                "prefix_tokens": self.files.prefix_tokens,
            }
        if self.orderings:
            info["order_by"] = self.spec.order_by
            info["order_null_rows"] = sum(o.null_rows for o in self.orderings)
        if self.spec.mixture and hasattr(plan, "limited_by"):
            info["limited_by"] = plan.limited_by  # type: ignore[attr-defined]
            info["pools"] = [dataclasses.asdict(r) for r in plan.reports]  # type: ignore[attr-defined]
        return info

    # -- fingerprint --------------------------------------------------------------------------

    def plan_inputs(self) -> dict[str, Any]:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        out = {
            "table_version": self.version,
            "table_identity": self.identity,
            **self.spec.fingerprint_inputs(),
            "tokenizer": self.inputs.tokenizer,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "permutation": PERMUTATION_ALGORITHM,
            **changes_inputs(self.changes),
        }
        if self.spec.mixture:
            pools = []
            for p, inp in zip(self.spec.mixture, self.pool_inputs, strict=True):
                digest = hashlib.sha256()  # of the int64 bytes, as ever, whatever the storage
                for col in (inp.row_ids, inp.n_tokens):
                    for _, part in col.blocks():
                        digest.update(part.astype(np.int64, copy=False).tobytes())
                pools.append(
                    {
                        "name": p.name,
                        "filter": p.filter,
                        "share": p.share,
                        "max_passes": p.max_passes,
                        "rows": digest.hexdigest()[:16],
                    }
                )
            out["mixture"] = {
                "pools": pools,
                "budget_tokens": self.spec.budget_tokens,
                "algorithm": MIXTURE_ALGORITHM,
            }
        return out


def _empty_plan(seed: int, epoch: int, seq_len: int) -> BlockPlan:
    """A plan with no block (a change's tail with nothing left to deliver)."""
    from tokenloom.loader.plan.epoch import plan_epoch

    return plan_epoch(
        np.zeros(0, np.int64), np.zeros(0, np.int64), seed=seed, epoch=epoch, seq_len=seq_len
    )


def _head_tokens(view: SplicedView) -> int:
    """Real tokens (repeated context included, EOS excluded) of a spliced epoch's head steps,
    counted from their layouts."""
    tokens = 0
    for lo in range(0, view.at, 256):
        spans = view.head.group(np.arange(lo, min(lo + 256, view.at))).spans
        tokens += int((spans.tok_end - spans.tok_start).sum())
    return tokens


def check_loss_mask(ds: Any, spec: LoaderSpec, rowids: np.ndarray, uri: str) -> None:
    """Refuse a loss-mask column of the wrong type, or null on selected rows (unless
    ``allow_missing``, when a null masks nothing), naming the fix.

    Raises:
        LossMaskColumnError: The column is missing or not a list of integers.
        LoaderError: Selected rows have no mask computed.
    """
    from tokenloom.loader.pipeline.lossmask import check_mask_field, null_mask_rows

    column = spec.loss_mask_column
    assert column is not None
    check_mask_field(ds.schema, column, uri)
    if spec.allow_missing:
        return
    nulls = null_mask_rows(ds, column, rowids)
    if len(nulls):
        raise LoaderError(
            f"{len(nulls):,} selected rows have no value in the loss-mask column {column!r} "
            f"(rows added since it was computed, or left out by its --where); compute them "
            f"with `tokenloom refresh --table {uri}`, or pass --allow-missing to mask nothing "
            "on them"
        )


def _window_table(
    ds: Any,
    inputs: PlanInputs,
    recipe: Any,
    seq_len: int,
    n_tokens: Any = None,
    files: tuple[Files, PlanInputs] | None = None,
) -> WindowTable:
    """The windows of one selection's long rows, cut at the recipe's cut column if any
    (``n_tokens``: other lengths than the stored ones, e.g. a change's tail leaving rows out as
    empty; ``ds`` is only read for the cut column; ``files``: the rows are groups, cut at their
    files' edges and at their files' cut points)."""
    column = recipe.cut_column
    reader = None
    if column is not None:
        reader = lambda at: take_cut_points(ds, inputs, column, at)  # noqa: E731
    if files is not None:
        layout, rows = files
        own = None
        if column is not None:
            own = lambda at: take_cut_points(ds, rows, column, at)  # noqa: E731
        reader = lambda at: group_cuts(layout, at, own)  # noqa: E731
    return window_table(
        inputs.row_ids,
        inputs.n_tokens if n_tokens is None else n_tokens,
        window=recipe.window or seq_len,
        overlap=recipe.overlap,
        cut_points=reader,
        units=recipe.long_docs == "units",
    )
