"""``PackedDataset`` and ``DataLoader``: the epoch plan materialised as torch batches.

The pure plan (:mod:`~tokenloom.loader.plan`) says which token of which row lands where; this
module reads those tokens (:mod:`~tokenloom.loader.read`), packs them
(:mod:`~tokenloom.loader.pack`) and hands out tensors. DataLoader worker ``w`` of ``W`` builds the
steps ``w, w+W, ...`` of this rank, and torch's DataLoader delivers workers' batches round-robin,
so the stream is the same for any number of workers. The state is ``(epoch, step)`` plus a
fingerprint of the plan's inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.loader.mixture import MIXTURE_ALGORITHM, Pool, plan_mixture
from tokenloom.loader.pack import pack_blocks, token_ranges
from tokenloom.loader.plan import EpochPlan, check_block_order, step_blocks
from tokenloom.loader.pools import parse_mixture, union_inputs
from tokenloom.loader.read import (
    LoaderError,
    TokenReader,
    count_column_for,
    read_cut_points,
    scan_plan_inputs,
)
from tokenloom.loader.recipe import Recipe, plan_recipe_epoch, recipe_epoch_steps, recipe_spans
from tokenloom.loader.shuffle import PERMUTATION_ALGORITHM
from tokenloom.loader.state import LoaderState
from tokenloom.loader.stats import LoaderStats
from tokenloom.table.filters import and_filters

__all__ = ["PackedDataset", "as_tensors"]

_READ_GROUP = 8  # steps whose rows are fetched in one take: one call per 8 steps, not per step
_META = "_loader"  # per-batch worker metadata, removed by DataLoader
_POOL_COUNTS = ("blocks", "tokens", "eos", "padding", "loss_positions")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class PackedDataset(IterableDataset):
    """Packed blocks of a token column, streamed from the table under a SQL filter.

    Args:
        table: Table URI/path, or a :class:`tokenloom.table.Table`.
        token_column: The list column of token ids.
        filter: SQL filter selecting the rows (``None``: all rows).
        seq_len: Block length ``L``.
        batch_size: Blocks per rank per step ``B``.
        seed: Shuffle seed; the epoch's order is a fresh permutation per (seed, epoch).
        epoch: The epoch to start in.
        rank: This rank (default: ``$RANK`` or 0).
        world_size: Number of ranks (default: ``$WORLD_SIZE`` or 1).
        version: Table version to pin (default: the latest at construction).
        eos_id: Separator appended to each document (default: the token column's tokenizer).
        pad_id: Padding id (default: the tokenizer's pad, else ``eos_id``; padding is masked).
        drop_last: Leave out the epoch's final, partial global step (counted in ``epoch_info``).
        lookahead: Read one token past a block ending mid-document so its last label is real.
        count_column: The stored token counts (default: ``n_tokens`` for ``input_ids``).
        allow_data_change: Accept a checkpoint whose table version/filter/tokenizer differ.
        packing: ``"concat"`` (documents joined by EOS, cut into blocks) or ``"best_fit"``
            (whole documents per block by best-fit-decreasing within ``fit_window`` documents of
            the epoch order; the rest of a block is padding, masked and counted).
        fit_window: Look-ahead of best-fit packing, in documents.
        long_docs: ``"split"`` (continue across blocks) or ``"window"``: documents longer than
            ``window`` tokens are cut into windows, each after the first starting with the
            previous window's last ``overlap`` tokens as context only (no loss on them).
        window: Window length for ``long_docs="window"`` (at most ``seq_len``).
        overlap: Context tokens carried into each following window.
        mixture: Token-quota pools ``{name: (sql_filter, share[, max_passes])}`` (each pool is
            its filter AND ``filter``): each is shuffled on its own, blocks are interleaved
            deterministically so every prefix of the stream stays close to the shares, and a
            pool whose quota exceeds its inventory repeats with a new order per pass (up to
            ``max_passes``).
        budget_tokens: Positions (tokens + EOS + padding) in a mixture epoch; default: until
            the first capped pool runs out.
        cut_column: With ``long_docs="window"``: a column of token offsets where a window may
            end (``cut_points``, from ``tokenloom tokenize --boundaries``); windows then end at
            the latest line break within their last eighth.
        block_order: ``"sequential"`` or ``"interleave"`` (each batch takes one block from each
            of ``G`` far-apart stretches; :func:`~tokenloom.loader.plan.step_blocks`).
    """

    def __init__(
        self,
        table: Any,
        token_column: str = "input_ids",
        *,
        filter: str | None = None,
        seq_len: int = 1024,
        batch_size: int = 8,
        seed: int = 0,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        version: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        drop_last: bool = False,
        lookahead: bool = True,
        count_column: str | None = None,
        allow_data_change: bool = False,
        storage_options: dict | None = None,
        packing: str = "concat",
        fit_window: int = 1024,
        long_docs: str = "split",
        window: int | None = None,
        overlap: int = 0,
        mixture: Mapping[str, Sequence[Any]] | None = None,
        budget_tokens: int | None = None,
        cut_column: str | None = None,
        block_order: str = "sequential",
    ) -> None:
        from tokenloom.table import Table

        super().__init__()
        handle = (
            table
            if isinstance(table, Table)
            else Table.open(table, version=version, storage_options=storage_options)
        )
        if version is not None and handle.version != version:
            handle = handle.checkout(version)
        self.uri = handle.uri
        self.version = handle.version
        self.token_column = token_column
        self.count_column = count_column or count_column_for(token_column)
        self.filter = filter
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        self.drop_last = bool(drop_last)
        self.lookahead = bool(lookahead)
        self.block_order = check_block_order(block_order)
        self.allow_data_change = allow_data_change
        self.recipe = Recipe(
            packing={"best_fit": "bestfit"}.get(packing, packing),
            fit_window=fit_window,
            long_docs=long_docs,
            window=window,
            overlap=overlap,
        )
        if self.seq_len < 1 or self.batch_size < 1:
            raise LoaderError(f"seq_len and batch_size must be >= 1 ({seq_len}, {batch_size})")
        if not 0 <= self.rank < self.world_size:
            raise LoaderError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.mixture = parse_mixture(mixture)
        self.budget_tokens = budget_tokens
        if self.mixture:
            self.pool_inputs = [
                scan_plan_inputs(
                    handle.dataset,
                    token_column=token_column,
                    count_column=self.count_column,
                    filter=and_filters(handle.dataset, pf, filter),
                )
                for _name, pf, _share, _cap in self.mixture
            ]
            self.inputs = union_inputs(self.pool_inputs)
        else:
            self.pool_inputs = []
            self.inputs = scan_plan_inputs(
                handle.dataset,
                token_column=token_column,
                count_column=self.count_column,
                filter=filter,
            )
        self.cut_column = cut_column if self.recipe.long_docs == "window" else None
        self._cuts = read_cut_points(
            handle.dataset,
            self.inputs,
            self.cut_column,
            self.recipe.window or self.seq_len,
            bool(self.mixture),
        )
        tok = self.inputs.tokenizer
        self.eos_id = eos_id if eos_id is not None else tok.get("eos_id")
        if self.eos_id is None:
            raise LoaderError(
                f"no EOS id: the column {token_column!r} records no tokenizer; pass eos_id="
            )
        self.pad_id = (
            pad_id
            if pad_id is not None
            else (tok.get("pad_id") if tok.get("pad_id") is not None else self.eos_id)
        )
        self.reader = TokenReader(
            self.uri, self.version, token_column, storage_options=storage_options
        )
        self.stats = LoaderStats(rows_planned=len(self.inputs.row_ids))
        self._epoch = int(epoch)
        self._step = 0
        self._plan: EpochPlan | None = None

    # -- the plan -----------------------------------------------------------------------------

    @property
    def global_batch(self) -> int:
        """Blocks per global step (``batch_size * world_size``)."""
        return self.batch_size * self.world_size

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Global steps of this epoch delivered so far."""
        return self._step

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The epoch's plan (cached for the current epoch)."""
        epoch = self._epoch if epoch is None else epoch
        if self._plan is None or self._plan.epoch != epoch:
            if self.mixture:
                pools = [
                    Pool(
                        name=name,
                        row_ids=inp.row_ids,
                        n_tokens=inp.n_tokens,
                        share=share,
                        max_passes=cap,
                    )
                    for (name, _f, share, cap), inp in zip(
                        self.mixture, self.pool_inputs, strict=True
                    )
                ]
                plan = plan_mixture(
                    pools,
                    seed=self.seed,
                    epoch=epoch,
                    seq_len=self.seq_len,
                    recipe=self.recipe,
                    budget_tokens=self.budget_tokens,
                )
            else:
                plan = plan_recipe_epoch(
                    self.inputs.row_ids,
                    self.inputs.n_tokens,
                    seed=self.seed,
                    epoch=epoch,
                    seq_len=self.seq_len,
                    recipe=self.recipe,
                    cut_points=self._cuts,
                )
            if epoch != self._epoch:
                return plan
            self._plan = plan
        return self._plan

    def epoch_info(self, epoch: int | None = None) -> dict:
        """Exact sizes of an epoch from stored counts: steps, blocks, tokens, padding, dropped."""
        plan = self.plan(epoch)
        steps = recipe_epoch_steps(
            plan, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last
        )
        info = {
            "epoch": plan.epoch,
            "rows": len(self.inputs.row_ids),
            "empty_rows": int((self.inputs.n_tokens == 0).sum()),
            "null_rows": self.inputs.null_rows,
            "tokens": plan.num_tokens,
            "blocks": plan.num_blocks,
            "steps": steps.steps,
            "padding_positions": steps.padding_positions,
            "padding_blocks": steps.padding_blocks,
            "dropped_tokens": steps.dropped_tokens,
        }
        if self.mixture:
            info["limited_by"] = plan.limited_by
            info["pools"] = [dataclasses.asdict(r) for r in plan.reports]
        return info

    def __len__(self) -> int:
        """Steps in the current epoch (the same on every rank)."""
        plan = self.plan()
        return recipe_epoch_steps(
            plan, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last
        ).steps

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (from its start, unless the cursor is already in it)."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._step = 0

    # -- state --------------------------------------------------------------------------------

    def plan_inputs(self) -> dict:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return {
            "table_version": self.version,
            "filter": self.filter,
            "token_column": self.token_column,
            "tokenizer": self.inputs.tokenizer,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "global_batch": self.global_batch,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "lookahead": self.lookahead,
            "drop_last": self.drop_last,
            "permutation": PERMUTATION_ALGORITHM,
            **self.recipe.fingerprint_inputs(),
            **self._mixture_inputs(),
            **({"cut_column": self.cut_column} if self.cut_column else {}),
            **({"block_order": self.block_order} if self.block_order != "sequential" else {}),
        }

    def _mixture_inputs(self) -> dict:
        if not self.mixture:
            return {}
        pools = []
        for (name, flt, share, cap), inp in zip(self.mixture, self.pool_inputs, strict=True):
            digest = hashlib.sha256(inp.row_ids.tobytes() + inp.n_tokens.tobytes()).hexdigest()
            pools.append(
                {
                    "name": name,
                    "filter": flt,
                    "share": share,
                    "max_passes": cap,
                    "rows": digest[:16],
                }
            )
        return {
            "mixture": {
                "pools": pools,
                "budget_tokens": self.budget_tokens,
                "algorithm": MIXTURE_ALGORITHM,
            }
        }

    def state_dict(self) -> dict:
        """The exact cursor of batches delivered so far, with the plan's fingerprint."""
        return LoaderState.create(
            epoch=self._epoch, step=self._step, inputs=self.plan_inputs()
        ).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        saved = LoaderState.from_dict(state)
        saved.check(self.plan_inputs(), allow_data_change=self.allow_data_change)
        self._epoch, self._step = saved.epoch, saved.step
        self._plan = None

    # -- iteration ----------------------------------------------------------------------------

    def _layout(self, plan: EpochPlan, step: int) -> tuple:
        """A step's spans, token ranges and the stable row ids to read (no I/O)."""
        blocks = step_blocks(
            step,
            rank=self.rank,
            world_size=self.world_size,
            batch_size=self.batch_size,
            num_blocks=plan.num_blocks,
            drop_last=self.drop_last,
            order=self.block_order,
        )
        spans = recipe_spans(plan, blocks)
        starts, stops = token_ranges(spans, lookahead=self.lookahead)
        rowids = self.inputs.rowids[np.searchsorted(self.inputs.row_ids, spans.row_id)]
        pools = None
        if self.mixture:
            pools = np.full(len(blocks), -1, dtype=np.int64)
            real = blocks >= 0
            if real.any():
                pools[real] = plan.source(blocks[real])[0]
        return spans, starts, stops, rowids, pools

    def _build_group(self, plan: EpochPlan, steps: list[int]) -> list[tuple]:
        """Several steps' batches with ONE read of all their rows (small reads are slow)."""
        layouts = [self._layout(plan, s) for s in steps]
        wanted = [lay for lay in layouts if len(lay[0])]
        docs = None
        if wanted:
            rowids = np.concatenate([lay[3] for lay in wanted])
            lens = np.concatenate([lay[0].doc_len for lay in wanted])
            docs = self.reader.read(rowids, lens, self.seq_len)
        out = []
        for spans, starts, stops, rowids, pools in layouts:
            tokens, offsets = self.reader.gather(spans, starts, stops, rowids, self.seq_len, docs)
            out.append((spans, tokens, offsets, pools))
        return out

    def _pack(self, spans, tokens, offsets, pools=None) -> dict[str, Any]:  # noqa: ANN001
        started = time.perf_counter()
        packed = pack_blocks(
            spans,
            tokens,
            offsets,
            num_blocks_in_batch=self.batch_size,
            seq_len=self.seq_len,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            lookahead=self.lookahead,
        )
        batch: dict[str, Any] = {
            "input_ids": packed.input_ids,
            "labels": packed.labels,
            "position_ids": packed.position_ids,
            "doc_ids": packed.doc_ids,
            "cu_seqlens": packed.cu_seqlens,
            "max_seqlen": int(packed.max_seqlen),
            "continues": packed.continues,
            "spans": packed.spans,
        }
        if packed.context is not None:
            batch["context"] = packed.context  # (n, 2) context-only token range of each stretch
        if pools is not None:
            batch["block_pool"] = pools  # (B,) mixture pool of each block
        s = self.stats
        if pools is not None:
            self._count_pools(spans, packed, pools)
        s.pack_seconds += time.perf_counter() - started
        s.rows_packed += len(spans)
        s.tokens += int(packed.real_tokens)
        s.eos += int(packed.eos_positions)
        s.padding += int(packed.padding_positions)
        s.loss_positions += int(packed.loss_positions)
        return batch

    def _count_pools(self, spans, packed, pools: np.ndarray) -> None:  # noqa: ANN001
        """Per-pool counts of a mixture batch (a whole padding block counts on pool 0)."""
        B = len(pools)
        owner = np.where(pools >= 0, pools, 0)
        eos = np.bincount(spans.block, weights=spans.has_eos, minlength=B)
        real = (packed.doc_ids >= 0).sum(axis=1)
        loss = (packed.labels != -100).sum(axis=1)
        pad = (packed.doc_ids == -1).sum(axis=1)
        for p, (name, *_rest) in enumerate(self.mixture):
            sel = owner == p
            if not sel.any():
                continue
            c = self.stats.pools.setdefault(name, dict.fromkeys(_POOL_COUNTS, 0))
            c["blocks"] += int((pools == p).sum())
            c["eos"] += int(eos[sel].sum())
            c["tokens"] += int(real[sel].sum() - eos[sel].sum())
            c["padding"] += int(pad[sel].sum())
            c["loss_positions"] += int(loss[sel].sum())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, first = self._epoch, self._step
        plan = self.plan(epoch)
        total = len(self)
        steps = list(range(first + wid, total, workers))
        snapshot = self.stats.copy()
        groups = [steps[i : i + _READ_GROUP] for i in range(0, len(steps), _READ_GROUP)]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenloom-read") as pool:
            ahead = deque(pool.submit(self._build_group, plan, g) for g in groups[:2])
            built: deque = deque()
            next_group = 2
            for step in steps:
                if not built:
                    built.extend(ahead.popleft().result())
                    if next_group < len(groups):
                        ahead.append(pool.submit(self._build_group, plan, groups[next_group]))
                        next_group += 1
                spans, tokens, offsets, pools = built.popleft()
                batch = self._pack(spans, tokens, offsets, pools)
                r = self.reader
                self.stats.rows_read, self.stats.bytes_read = r.rows_read, r.bytes_read
                self.stats.read_seconds = r.read_seconds
                self.stats.steps += 1
                if info is not None:
                    delta = self.stats.delta(snapshot)
                    batch[_META] = {"epoch": epoch, "step": step, "stats": delta}
                    snapshot = self.stats.copy()
                    yield batch  # numpy: one pickle to the main process, not one fd per tensor
                    continue
                self._step = step + 1
                if self._step >= total:
                    self._epoch, self._step = epoch + 1, 0
                yield as_tensors(batch)


def as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's numpy arrays as torch tensors (zero-copy)."""
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
