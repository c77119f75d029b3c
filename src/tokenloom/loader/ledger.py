"""The ledger: what a run's steps hold, per pool, from the plan alone (no token is read).

For each step the ledger builds the same spans the loader builds and packs them with placeholder
token ids — labels, padding and the loss mask depend only on the layout, never on the ids — so
its counts equal what the loader delivers (``DataLoader.stats``) for the same steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tokenloom.loader.pack import pack_blocks, token_ranges
from tokenloom.loader.plan import step_blocks
from tokenloom.loader.recipe import recipe_spans

__all__ = ["PoolLedger", "Ledger", "ledger"]


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
    """Context-only tokens repeated from the previous window (no loss on their targets)."""
    unique_documents: int = 0
    documents_seen_more_than_once: int = 0
    passes: int = 1
    _starts: list = field(default_factory=list, repr=False)


@dataclass(kw_only=True)
class Ledger:
    """The ledger of steps ``[0, steps)`` of one epoch."""

    epoch: int
    steps: int
    seq_len: int
    global_batch: int
    pools: list[PoolLedger]

    @property
    def total(self) -> dict[str, int]:
        keys = (
            "blocks",
            "body_tokens",
            "separator_tokens",
            "padding_positions",
            "loss_positions",
            "overlap_tokens",
        )
        return {k: sum(getattr(p, k) for p in self.pools) for k in keys}

    def to_json(self) -> dict[str, Any]:
        pools = []
        for p in self.pools:
            d = asdict(p)
            d.pop("_starts")
            pools.append(d)
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "pools": pools,
            "total": self.total,
        }


def ledger(ds: Any, *, steps: int | None = None, epoch: int | None = None) -> Ledger:
    """Count what the first ``steps`` global steps of ``epoch`` hold, per pool.

    Args:
        ds: A :class:`~tokenloom.loader.dataset.PackedDataset` (its options define the plan; its
            rank is ignored: the ledger covers the global batch).
        steps: Steps to count (default: the whole epoch).
        epoch: Default: the dataset's current epoch.
    """
    epoch = ds.epoch if epoch is None else epoch
    plan = ds.plan(epoch)
    total_steps = ds.epoch_info(epoch)["steps"]
    steps = total_steps if steps is None else min(int(steps), total_steps)
    mixture = bool(getattr(ds, "mixture", None))
    names = [m[0] for m in ds.mixture] if mixture else ["all"]
    pools = [PoolLedger(name=n) for n in names]
    G, L = ds.global_batch, ds.seq_len
    for s in range(steps):
        blocks = step_blocks(
            s,
            rank=0,
            world_size=1,
            batch_size=G,
            num_blocks=plan.num_blocks,
            drop_last=ds.drop_last,
            order=getattr(ds, "block_order", "sequential"),
        )
        spans = recipe_spans(plan, blocks)
        starts, stops = token_ranges(spans, lookahead=ds.lookahead)
        offsets = np.zeros(len(spans) + 1, dtype=np.int64)
        np.cumsum(stops - starts, out=offsets[1:])
        fake = np.zeros(int(offsets[-1]), dtype=np.int64)
        packed = pack_blocks(
            spans,
            fake,
            offsets,
            num_blocks_in_batch=G,
            seq_len=L,
            eos_id=ds.eos_id,
            pad_id=ds.pad_id,
            lookahead=ds.lookahead,
        )
        pool_of_block = np.zeros(G, dtype=np.int64)
        real = blocks >= 0
        if mixture and real.any():
            pool_of_block[real] = plan.source(blocks[real])[0]
        pool_of_block[~real] = -1
        doc_ids = packed.doc_ids
        lab = packed.labels != -100
        for b in range(G):
            p = pool_of_block[b] if pool_of_block[b] >= 0 else (0 if not mixture else -1)
            if p < 0:  # a whole padding block completing the last step: counted on pool 0
                pools[0].padding_positions += L
                continue
            led = pools[p]
            led.blocks += 1
            led.padding_positions += int((doc_ids[b] == -1).sum())
            led.loss_positions += int(lab[b].sum())
        sel_block = spans.block
        ctx = packed.context
        ctx_len = (ctx[:, 1] - ctx[:, 0]) if ctx is not None else np.zeros(len(spans), np.int64)
        for i in range(len(spans)):
            p = int(pool_of_block[sel_block[i]]) if mixture else 0
            led = pools[p]
            led.overlap_tokens += int(ctx_len[i])
            led.body_tokens += int(spans.tok_end[i] - spans.tok_start[i] - ctx_len[i])
            led.separator_tokens += int(spans.has_eos[i])
            if spans.tok_start[i] == 0:
                led._starts.append(int(spans.row_id[i]))
    for led in pools:
        if led._starts:
            _, counts = np.unique(np.asarray(led._starts), return_counts=True)
            led.unique_documents = int(len(counts))
            led.documents_seen_more_than_once = int((counts > 1).sum())
    if mixture:
        done = plan.passes_done(steps * G)
        taken = plan.taken(steps * G)
        for i, led in enumerate(pools):
            led.passes = int(done[i]) + int(taken[i] > plan.pass_ends[i][done[i]])
    return Ledger(epoch=epoch, steps=steps, seq_len=L, global_batch=G, pools=pools)
