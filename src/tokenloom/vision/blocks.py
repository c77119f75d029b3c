"""``ImageTextBlocks``: packed image+text blocks streamed from the table, resumable exactly.

The plan is computed from stored columns only — ``width``, ``height`` (image tokens, see
:func:`~tokenloom.vision.patches.image_tokens`) and the UTF-8 length of ``prompt`` and
``response`` — so the whole epoch's blocks are known before an image is decoded: the selection
is shuffled per ``(seed, epoch)``, packed by :func:`~tokenloom.vision.packing.plan_blocks`, and
global step ``s`` holds blocks ``s*G .. s*G+G-1`` (rank ``r`` of ``W`` takes ``G / W`` of them).
Reading decodes the images of a step's samples in a thread pool; a sample whose image does not
decode (``on_error="skip"``) leaves its positions as padding and is counted by reason, so every
rank still runs the same steps. Text is UTF-8 bytes (ids 0..255) plus :data:`EOS`, :data:`PAD`
and :data:`IMAGE`.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tokenloom.loader.shuffle import PERMUTATION_ALGORITHM, epoch_permutation
from tokenloom.loader.stream.cursor import Cursor, PlanCache, StreamCursor
from tokenloom.loader.stream.take import take
from tokenloom.loader.stream.topology import Topology
from tokenloom.rows.read import RowReader, scan_selection
from tokenloom.rows.transform import RowLoaderError, RowTransformError, reason_of
from tokenloom.vision.packing import PACK_ALGORITHM, PackPlan, pack_block, plan_blocks
from tokenloom.vision.patches import PatchGrid, decode_image, image_tokens, patchify

__all__ = ["ImageTextBlocks", "EOS", "PAD", "IMAGE", "VOCAB", "encode_text"]

EOS, PAD, IMAGE = 256, 257, 258
VOCAB = 259
"""Byte vocabulary: 256 bytes, EOS, PAD and the image placeholder."""


def encode_text(text: str) -> np.ndarray:
    """UTF-8 bytes as int64 ids."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


class ImageTextBlocks(StreamCursor):
    """Packed (image, prompt, response) blocks of a table (see the module docstring).

    Args:
        table: Table URI with ``image`` (blob/binary), ``prompt``, ``response``, ``width``,
            ``height`` columns.
        budget: Positions per block.
        global_batch: Blocks per global step over all ranks.
        grid: How images become patches.
        image_cap: Most images per block.
        policy: ``knapsack``, ``greedy`` (``pad_to_longest`` is for comparison only).
        filter, version, seed, rank, world_size: As for the other loaders.
        on_error: ``raise`` or ``skip`` a sample whose image does not decode.
        threads: Decode threads.
        storage_options: Object-store options for Lance (with the ``AWS_*`` environment).
    """

    def __init__(
        self,
        table: str,
        *,
        budget: int = 256,
        global_batch: int = 4,
        grid: PatchGrid | None = None,
        image_cap: int = 4,
        policy: str = "knapsack",
        window: int = 32,
        filter: str | None = None,
        version: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        on_error: str = "raise",
        threads: int = 2,
        storage_options: dict | None = None,
    ) -> None:
        from tokenloom.table import Table

        if policy not in ("knapsack", "greedy"):
            raise RowLoaderError(f"policy must be 'knapsack' or 'greedy', got {policy!r}")
        if on_error not in ("raise", "skip"):
            raise RowLoaderError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.topology = Topology(rank, world_size)
        self.topology.per_rank(global_batch, unit="blocks")
        t = Table.open(table, version=version, storage_options=storage_options)
        cols = ["image", "prompt", "response", "width", "height"]
        self.selection = scan_selection(t.dataset, filter=filter, columns=cols)
        meta = take(
            t.dataset, self.selection.rowids.tolist(), ["prompt", "response", "width", "height"]
        )
        self.grid = grid or PatchGrid()
        self.prompts = [encode_text(p or "") for p in meta.column("prompt").to_pylist()]
        self.responses = [encode_text(r or "") for r in meta.column("response").to_pylist()]
        w = np.asarray(meta.column("width").fill_null(0).to_numpy(zero_copy_only=False))
        h = np.asarray(meta.column("height").fill_null(0).to_numpy(zero_copy_only=False))
        self.image_tokens = image_tokens(w, h, self.grid)
        self.lengths = self.image_tokens + np.array(
            [len(p) + len(r) + 1 for p, r in zip(self.prompts, self.responses, strict=True)],
            dtype=np.int64,
        )
        self.reader = RowReader(
            t.uri, t.version, ["image"], storage_options=t.storage_options or None
        )
        self.version = t.version
        self.budget, self.global_batch, self.image_cap = budget, global_batch, image_cap
        self.policy, self.window, self.seed, self.filter = policy, window, seed, filter
        self.rank, self.world_size = rank, world_size
        self.on_error, self.threads = on_error, threads
        self.at = Cursor()
        self.allow_data_change = False
        self.skipped: Counter = Counter()
        """Samples left out because their image did not decode, by reason."""
        self._plans: PlanCache[tuple[np.ndarray, PackPlan]] = PlanCache(keep=1)

    # -- the plan -----------------------------------------------------------------------------

    def plan(self, epoch: int) -> tuple[np.ndarray, PackPlan]:
        """``(order, plan)``: the epoch's sample order and its blocks (indices into order)."""
        return self._plans.get(epoch, self._build_plan)

    def _build_plan(self, epoch: int) -> tuple[np.ndarray, PackPlan]:
        order = epoch_permutation(len(self.lengths), seed=self.seed, epoch=epoch)
        plan = plan_blocks(
            self.lengths[order],
            (self.image_tokens[order] > 0).astype(np.int64),
            budget=self.budget,
            image_cap=self.image_cap,
            policy=self.policy,
            window=self.window,
        )
        return order, plan

    def steps(self, epoch: int | None = None) -> int:
        """Global steps of an epoch (incomplete last step dropped: blocks are never padding)."""
        _, plan = self.plan(self.epoch if epoch is None else epoch)
        return len(plan.blocks) // self.global_batch

    def ledger(self, epoch: int = 0) -> dict[str, float]:
        """Image tokens, text tokens and padding of the epoch's plan."""
        order, plan = self.plan(epoch)
        return PackPlan(
            blocks=plan.blocks,
            width=plan.width,
            dropped=plan.dropped,
            lengths=plan.lengths,
            image_tokens=self.image_tokens[order],
        ).ledger()

    def plan_inputs(self) -> dict[str, Any]:
        return {
            "kind": "image_text_blocks",
            "table_version": self.version,
            "filter": self.filter,
            "budget": self.budget,
            "global_batch": self.global_batch,
            "image_cap": self.image_cap,
            "policy": self.policy,
            "window": self.window,
            "seed": self.seed,
            "patch": self.grid.patch,
            "max_side": self.grid.max_side,
            "on_error": self.on_error,
            "permutation": PERMUTATION_ALGORITHM,
            "packing": PACK_ALGORITHM,
        }

    # -- reading ------------------------------------------------------------------------------

    def _patches(self, sel: int) -> tuple[np.ndarray | None, str | None]:
        ids = self.selection.row_ids[[sel]]
        data = self.reader.read(self.selection.rowids[[sel]], ids).column(0)[0].as_py()
        try:
            return patchify(decode_image(data, self.grid), self.grid.patch), None
        except Exception as exc:  # noqa: BLE001 - a bad image: policy decides
            if self.on_error == "raise":
                raise RowTransformError(
                    f"image of row id {int(ids[0])} does not decode: {type(exc).__name__}: "
                    f"{exc}; pass on_error='skip' to leave such samples out, counted"
                ) from exc
            return None, reason_of(exc)

    def build(self, epoch: int, step: int, pool: ThreadPoolExecutor | None = None) -> dict:
        """This rank's blocks of ``step``: stacked ``(B, T)`` arrays, patches, counts."""
        order, plan = self.plan(epoch)
        b = self.topology.per_rank(self.global_batch, unit="blocks")
        first = self.topology.first(step, self.global_batch)
        blocks = [order[plan.blocks[i]] for i in range(first, first + b)]
        sels = sorted({int(s) for blk in blocks for s in blk})
        mapper = pool.map if pool is not None else map
        decoded = dict(zip(sels, mapper(self._patches, sels), strict=True))
        skipped: Counter = Counter()
        packed = []
        for blk in blocks:
            samples = []
            for s in blk.tolist():
                pt, reason = decoded[s]
                if pt is None:
                    skipped[reason] += 1  # its positions stay padding: the step still exists
                    continue
                samples.append((pt, self.prompts[s], self.responses[s]))
            packed.append(
                pack_block(
                    samples,
                    budget=self.budget,
                    eos_id=EOS,
                    pad_id=PAD,
                    image_id=IMAGE,
                    patch_dim=self.grid.patch_dim,
                )
            )
        self.skipped.update(skipped)
        return {
            "input_ids": np.stack([p.input_ids for p in packed]),
            "labels": np.stack([p.labels for p in packed]),
            "image_mask": np.stack([p.image_mask for p in packed]),
            "doc_ids": np.stack([p.doc_ids for p in packed]),
            "position_ids": np.stack([p.position_ids for p in packed]),
            "patches": np.concatenate([p.patches for p in packed]),
            "row_ids": [self.selection.row_ids[blk] for blk in blocks],
            "skipped": dict(skipped),
        }

    def __iter__(self):  # noqa: ANN204
        epoch, start = self.epoch, self.step
        n = self.steps(epoch)
        with ThreadPoolExecutor(self.threads or 1, thread_name_prefix="tokenloom-img") as pool:
            for s in range(start, n):
                batch = self.build(epoch, s, pool)
                self.at.delivered(epoch, s, n)
                yield batch
