"""Which rows did the model see at step N, and at which steps did it see row R.

Recomputed from the run's checkpoint record (``last.json``: the loader's cursor and plan inputs,
the options and the topology of every invocation) — no log of samples. The loader's plan is a
pure function of its inputs (contract 3), so the global batch of optimizer step ``N`` is the
plan's global step ``N - 1`` (counted across epochs), and rank ``r`` of a topology with ``b``
blocks per rank held its blocks ``[r b, (r+1) b)``. Provenance is computed exactly as the loader
emits it (the same packing code on placeholder tokens), without reading a token.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from tokenloom.errors import TokenloomError

__all__ = ["TraceError", "Seen", "RunTrace", "open_run"]

_CHUNK_STEPS = 256  # steps whose provenance is computed in one vectorised pass


class TraceError(TokenloomError):
    """The checkpoint cannot be traced (missing record, step outside the run)."""


@dataclass(frozen=True)
class Seen:
    """One stretch of a row in one block: what the model saw, and where."""

    step: int
    """Optimizer step (1-based, as the training log counts)."""
    epoch: int
    rank: int
    block: int
    """Block within that rank's batch (the loader's provenance column 0)."""
    position: int
    """First position of the stretch in the block."""
    row_id: int
    token_start: int
    token_end: int
    """Tokens ``[token_start, token_end)`` of the row (the EOS is not counted)."""

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        """The loader's provenance row ``(block, position, row id, token start, token end)``."""
        return (self.block, self.position, self.row_id, self.token_start, self.token_end)


@dataclass
class RunTrace:
    """A training run's data stream, recomputable step by step."""

    record: dict
    ds: object = field(repr=False)
    """A world-size-1 :class:`~tokenloom.loader.PackedDataset` whose batch is the global batch."""

    @property
    def steps_done(self) -> int:
        return int(self.record["step"])

    @property
    def table_version(self) -> int:
        return int(self.ds.version)

    def _topology(self, step: int) -> dict:
        segments = sorted(self.record["topology"], key=lambda t: t["from_step"])
        current = segments[0]
        for seg in segments:
            if seg["from_step"] <= step:
                current = seg
        return current

    def _locate(self, step: int) -> tuple[int, int]:
        """Optimizer step (1-based) → (epoch, global step within the epoch)."""
        if not 1 <= step <= self.steps_done:
            raise TraceError(f"step {step} is outside the run: it has steps 1..{self.steps_done}")
        g, epoch = step - 1, 0
        while True:
            n = self.ds.epoch_info(epoch)["steps"]
            if g < n:
                return epoch, g
            g, epoch = g - n, epoch + 1

    def _provenance(self, epoch: int, first: int, count: int) -> np.ndarray:
        """``(S, 6)``: (global step in epoch, block in global batch, position, row id, start,
        end) for ``count`` global steps from ``first``, as the loader's packing emits them."""
        from tokenloom.loader.pack import pack_blocks, token_ranges
        from tokenloom.loader.plan import step_blocks
        from tokenloom.loader.recipe import recipe_spans

        ds = self.ds
        plan = ds.plan(epoch)
        G = ds.global_batch
        out = []
        for s in range(first, first + count):
            blocks = step_blocks(
                s, rank=0, world_size=1, batch_size=G, num_blocks=plan.num_blocks,
                drop_last=ds.drop_last, order=ds.block_order,
            )  # fmt: skip
            spans = recipe_spans(plan, blocks)
            starts, stops = token_ranges(spans, lookahead=ds.lookahead)
            offsets = np.zeros(len(spans) + 1, dtype=np.int64)
            np.cumsum(stops - starts, out=offsets[1:])
            packed = pack_blocks(
                spans,
                np.zeros(int(offsets[-1]), dtype=np.int64),  # placeholders: no token is read
                offsets,
                num_blocks_in_batch=G,
                seq_len=ds.seq_len,
                eos_id=ds.eos_id,
                pad_id=ds.pad_id,
                lookahead=ds.lookahead,
            )
            prov = packed.spans
            out.append(np.column_stack([np.full(len(prov), s, dtype=np.int64), prov]))
        return np.concatenate(out) if out else np.zeros((0, 6), dtype=np.int64)

    def _seen(self, rows: np.ndarray, epoch: int, step_base: int) -> list[Seen]:
        out = []
        for s, b, pos, row, start, end in rows.tolist():
            step = step_base + s + 1
            topo = self._topology(step)
            per_rank = topo["blocks_per_rank"]
            out.append(Seen(step, epoch, b // per_rank, b % per_rank, pos, row, start, end))
        return out

    def step(self, step: int, rank: int | None = None) -> list[Seen]:
        """The stretches in optimizer step ``step``'s batch (of one rank, or all ranks)."""
        epoch, g = self._locate(step)
        seen = self._seen(self._provenance(epoch, g, 1), epoch, step - 1 - g)
        if rank is not None:
            world = self._topology(step)["world_size"]
            if not 0 <= rank < world:
                raise TraceError(f"rank {rank} is outside world size {world} at step {step}")
            seen = [x for x in seen if x.rank == rank]
        return seen

    def row(self, row_id: int) -> list[Seen]:
        """Every step (rank, block, position, token range) where row ``row_id``'s tokens appeared
        in steps ``1..steps_done``, epochs and repeats included."""
        out: list[Seen] = []
        done, epoch = 0, 0
        while done < self.steps_done:
            n = min(self.ds.epoch_info(epoch)["steps"], self.steps_done - done)
            for first in range(0, n, _CHUNK_STEPS):
                prov = self._provenance(epoch, first, min(_CHUNK_STEPS, n - first))
                out.extend(self._seen(prov[prov[:, 3] == row_id], epoch, done))
            done, epoch = done + n, epoch + 1
        return out


def open_run(checkpoint: str | os.PathLike[str]) -> RunTrace:
    """The trace of the run whose checkpoint directory (or ``last.json``) is ``checkpoint``.

    Raises:
        TraceError: No ``last.json`` there, or one written before runs recorded their topology.
        ResumeMismatchError: The table no longer matches the run's plan (e.g. its version is gone).
    """
    checkpoint = os.fspath(checkpoint)
    path = checkpoint if checkpoint.endswith(".json") else os.path.join(checkpoint, "last.json")
    if not os.path.exists(path):
        raise TraceError(f"{path} not found: pass the --out directory of a `tokenloom train` run")
    with open(path) as fh:
        record = json.load(fh)
    for key in ("config", "loader", "topology"):
        if key not in record:
            raise TraceError(f"{path} has no {key!r}: it was written by an older tokenloom")
    from tokenloom.loader import PackedDataset

    cfg, inputs = record["config"], record["loader"]["inputs"]
    ds = PackedDataset(
        cfg["table"],
        cfg["token_column"],
        filter=cfg["filter"],
        seq_len=cfg["seq_len"],
        batch_size=int(inputs["global_batch"]),
        seed=cfg["seed"],
        version=inputs["table_version"],
        rank=0,
        world_size=1,
        block_order=inputs.get("block_order", "sequential"),
    )
    ds.load_state_dict(record["loader"])  # the same plan, or a named mismatch
    return RunTrace(record=record, ds=ds)
