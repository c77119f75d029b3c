"""``ImageTextDataset``: packed (image, prompt, response) blocks streamed from the table.

**Plan (from stored sizes only).** The constructor scans five small columns of the selected
rows — ``id``, the stored width and height, and the count columns ``tokenloom tokenize`` wrote
beside the prompt and response token columns — and keeps, per sample, the bit-packed selection
(about 2 bytes), the sample's length (``uint16`` while the budget is below 65,535) and its image
tokens (``uint8`` for grids up to 255 patches). No image, prompt or response is read. Each epoch
packs a fresh permutation of ``(seed, epoch)`` with :func:`~tokenloom.vision.packing.pack_compact`
into two flat arrays (``uint32`` members and block starts): about 10 bytes per sample in all
(:attr:`ImageTextDataset.nbytes`; 12 at most).

**Steps.** On the stream skeleton (:mod:`tokenloom.loader.plan.stream`: the spec's common part, the
topology, the cursor and its state, the plan cache, the take wrapper): global step ``s`` holds
blocks ``s*G .. s*G+G-1``; rank ``r`` of ``W`` takes the contiguous ``G / W`` of them, so the
global stream depends on ``G`` only, never on the world size or the workers: a state taken at
global step ``s`` on ``W`` ranks resumes on ``W'`` ranks with the same remaining blocks. The
epoch's incomplete last step is completed with blocks of padding only (every planned sample is
delivered), or left out with ``drop_last``.

**Materialiser.** A block's rows are read by stable row id (image bytes, prompt and response
ids), each image decoded (Pillow) and cut into patches in a thread pool, and the block laid out
by :func:`~tokenloom.vision.packing.pack_block` (the tokenizer's EOS closes each sample; padding
and image positions hold it too, masked out). With DataLoader workers
(:class:`~tokenloom.vision.ImageTextLoader`, tokenloom's own worker processes with
shared-memory rings) the workers split each rank's step — worker ``k`` of ``K`` builds the
``k``-th contiguous part of the step's blocks — and the loader joins the parts in order, so the
batches are the same for any number of workers.

**Bad images.** ``on_error="raise"`` stops naming the row; ``"skip"`` leaves the sample's
positions as padding and counts it by reason: the blocks (and so every rank's steps) do not
change, whatever decodes. A decoded image whose patch count differs from what its stored width
and height promise, or token lists whose length differs from their count column, count the same
way (reason ``SizeMismatch``): the plan was made from those numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.shuffle import epoch_order
from tokenloom.loader.plan.stream import Cursor, PlanCache, StreamCursor, Topology
from tokenloom.rows.read import RowSelection, compact_selection
from tokenloom.rows.transform import RowLoaderError, RowTransformError, reason_of
from tokenloom.vision.packing import CompactBlocks, pack_block, pack_compact
from tokenloom.vision.patches import decode_image, image_tokens, patchify
from tokenloom.vision.spec import ImageTextSpec

__all__ = [
    "ImageTextStream",
    "ImageTextError",
    "SampleSizes",
    "scan_sizes",
    "token_column_info",
    "LEDGER_KEYS",
    "join_parts",
]

LEDGER_KEYS = ("blocks", "samples", "images", "image_tokens", "text_tokens", "padding", "skipped")
"""What :meth:`ImageTextDataset.ledger` counts of the blocks delivered."""


class ImageTextError(RowLoaderError):
    """The image+text loader cannot be built or run as asked (a usage or data error)."""


class SizeMismatch(Exception):  # noqa: N818 - its class name is the counted reason
    """A sample's stored sizes do not match what was read (the plan was made from them)."""


def token_column_info(schema: Any, column: str, role: str, table: str) -> dict[str, Any]:
    """``{"tokenizer": identity, "count_column": name}`` of a token column ``tokenloom tokenize``
    made; refuses a missing column or a text column, naming the tokenize command.

    Raises:
        ImageTextError: ``column`` is missing or holds no tokenizer identity.
    """
    import json

    from tokenloom.loader.plan.spec import count_column_for
    from tokenloom.tokenize.column import TOKENIZER_META_KEY

    text = column[: -len("_ids")] if column.endswith("_ids") else column
    ids = column if column.endswith("_ids") else f"{column}_ids"
    fix = (
        f"`tokenloom tokenize --table {table} --tokenizer gpt2 --text-column {text} --column "
        f"{ids}` (any tokenizer), then pass --{role}-column {ids}"
    )
    if column not in schema.names:
        raise ImageTextError(
            f"the table has no {role} token column {column!r} (columns: "
            f"{', '.join(schema.names)}); make it with {fix}"
        )
    meta = schema.field(column).metadata or {}
    if TOKENIZER_META_KEY not in meta:
        raise ImageTextError(
            f"{role} column {column!r} holds no token ids of `tokenloom tokenize` (type "
            f"{schema.field(column).type}); the image+text loader reads token columns: make one "
            f"with {fix}"
        )
    count = (meta.get(b"tokenloom.count_column") or b"").decode() or count_column_for(column)
    if count not in schema.names:
        raise ImageTextError(
            f"token column {column!r} has no count column {count!r}; tokenize again: {fix}"
        )
    return {"tokenizer": json.loads(meta[TOKENIZER_META_KEY]), "count_column": count}


@dataclass(frozen=True, kw_only=True, eq=False)
class SampleSizes:
    """What the plan needs of every selected sample, compact (see the module docstring)."""

    selection: RowSelection
    """``id`` and stable row id of each sample (ascending ``id``), bit-packed."""
    lengths: np.ndarray
    """``(n,)`` image tokens + prompt + response + EOS, clipped at ``budget + 1`` (longer
    samples are never packed; the clip keeps the dtype narrow)."""
    image_tokens: np.ndarray
    """``(n,)`` patch tokens of each image (0: no image), from the stored width and height."""

    @property
    def nbytes(self) -> int:
        sel = self.selection
        return int(sel.row_ids.nbytes + sel.rowids.nbytes + self.lengths.nbytes
                   + self.image_tokens.nbytes)  # fmt: skip


def scan_sizes(ds: Any, spec: ImageTextSpec) -> tuple[SampleSizes, dict[str, Any]]:
    """Scan ``id``, the width and height and the two count columns of the rows under the
    filter (nothing else), batch by batch into narrow arrays; returns the sizes and the
    tokenizer identity of the token columns.

    Raises:
        ImageTextError: A column is missing, a token column is not one (naming the tokenize
            command), the two token columns come from different tokenizers, some rows are not
            tokenized, or the filter does not work.
    """
    from tokenloom.table.filters import validate_filter

    schema = ds.schema
    missing = [
        f"{role} {name!r}"
        for role, name in spec.columns().items()
        if role not in ("prompt_column", "response_column") and name not in schema.names
    ]
    if missing:
        raise ImageTextError(
            f"the table has no {', '.join(missing)} (columns: {', '.join(schema.names)}); an "
            "image+text table holds encoded images and their stored width and height "
            "(`tokenloom images build` + `tokenloom ingest ... --columns "
            "prompt,response,width,height`), or name yours with --image-column, --width-column, "
            "--height-column"
        )
    uri = spec.table
    prompt = token_column_info(schema, spec.prompt_column, "prompt", uri)
    response = token_column_info(schema, spec.response_column, "response", uri)
    tp, tr = prompt["tokenizer"], response["tokenizer"]
    if tp.get("vocab_hash") != tr.get("vocab_hash"):
        raise ImageTextError(
            f"the prompt column {spec.prompt_column!r} holds {tp.get('name')!r} ids but the "
            f"response column {spec.response_column!r} holds {tr.get('name')!r} ids; tokenize "
            "both with the same tokenizer"
        )
    if tp.get("eos_id") is None:
        raise ImageTextError(
            f"tokenizer {tp.get('name')!r} of {spec.prompt_column!r} has no EOS id to end each "
            "sample with; tokenize with a tokenizer that has one (gpt2 does)"
        )
    flt = validate_filter(ds, spec.filter)
    cols = ["id", spec.width_column, spec.height_column, prompt["count_column"],
            response["count_column"]]  # fmt: skip
    grid = spec.grid
    cap = spec.budget + 1
    len_dtype = np.uint16 if cap < 2**16 else np.uint32
    per_image = (grid.max_side // grid.patch) ** 2
    img_dtype = np.min_scalar_type(per_image)
    parts: dict[str, list[np.ndarray]] = {"id": [], "rowid": [], "len": [], "img": []}
    untokenized = 0
    try:
        scanner = ds.scanner(columns=cols, filter=flt, with_row_id=True, batch_size=65536)
        for batch in scanner.to_batches():

            def num(name: str, batch=batch) -> np.ndarray:  # noqa: ANN001
                col = batch.column(name)
                return np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False))

            pn, rn = batch.column(cols[3]), batch.column(cols[4])
            untokenized += pn.null_count + rn.null_count
            img = image_tokens(num(cols[1]), num(cols[2]), grid)
            total = img + num(cols[3]).astype(np.int64) + num(cols[4]).astype(np.int64) + 1
            parts["len"].append(np.minimum(total, cap).astype(len_dtype))
            parts["img"].append(img.astype(img_dtype))
            parts["id"].append(num("id").astype(np.int64))
            parts["rowid"].append(num("_rowid").astype(np.uint64))
    except (ValueError, OSError, RuntimeError) as exc:
        raise ImageTextError(f"scanning the sizes of {uri} failed: {exc}") from exc
    if untokenized:
        raise ImageTextError(
            f"{untokenized:,} prompt/response values of the selected rows have no tokens (rows "
            f"added after `tokenloom tokenize` ran); tokenize again: `tokenloom tokenize --table "
            f"{uri} --tokenizer {tp.get('name')} --text-column ... --column "
            f"{spec.prompt_column}` (and the same for {spec.response_column!r})"
        )

    def cat(key: str, dtype: Any) -> np.ndarray:
        got = parts.pop(key)
        return np.concatenate(got) if got else np.zeros(0, dtype)

    ids, rowids = cat("id", np.int64), cat("rowid", np.uint64)
    lengths, img = cat("len", len_dtype), cat("img", img_dtype)
    if ids.size > 1 and bool((ids[1:] < ids[:-1]).any()):  # a scan in id order needs no sort
        order = np.argsort(ids, kind="stable")
        ids, rowids, lengths, img = ids[order], rowids[order], lengths[order], img[order]
    selection = compact_selection(ds.version, ids, rowids)
    return SampleSizes(selection=selection, lengths=lengths, image_tokens=img), tp


class ImageTextStream(StreamCursor):
    """Packed image+text blocks of an :class:`~tokenloom.vision.ImageTextSpec` (see the module
    docstring): the plan plus its materialiser, without torch (what a worker is sent);
    :class:`~tokenloom.vision.ImageTextDataset` is its torch face.

    Args:
        spec: What to deliver.
        rank, world_size: This rank and the number of ranks (default ``$RANK``/``$WORLD_SIZE``).
        threads: Decode threads per process (``0``: decode in the calling thread).
        epoch: The epoch to start in.
        storage_options: Object-store options for Lance.
        allow_data_change: Accept a checkpoint whose table version or filter differ.
    """

    def __init__(
        self,
        spec: ImageTextSpec,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        threads: int = 2,
        epoch: int = 0,
        storage_options: dict | None = None,
        allow_data_change: bool = False,
    ) -> None:
        from tokenloom.table import Table

        if not isinstance(spec, ImageTextSpec):
            raise ImageTextError(
                f"ImageTextDataset takes an ImageTextSpec, got {type(spec).__name__}; build one "
                "with ImageTextSpec(table=..., prompt_column=..., response_column=...)"
            )
        self.topology = Topology.of(rank, world_size)
        self.rank, self.world_size = self.topology.rank, self.topology.world_size
        self.per_rank = spec.per_rank(self.world_size)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ImageTextError(f"threads must be an integer >= 0, got {threads!r}")
        table = Table.open(spec.table, version=spec.version, storage_options=storage_options)
        self.sizes, self.tokenizer = scan_sizes(table.dataset, spec)
        self.spec = spec.replace(version=table.version)
        """The spec with the table version pinned."""
        self.eos_id = int(self.tokenizer["eos_id"])
        self.vocab_size = int(self.tokenizer.get("vocab_size") or 0)
        self.threads = threads
        self.storage_options = storage_options
        self.allow_data_change = allow_data_change
        self._reader: Any = None
        self.at = Cursor(epoch)
        # one epoch's plan kept (~5 bytes per sample): two would pass 12 bytes per sample
        self._plans: PlanCache[CompactBlocks] = PlanCache(keep=1)
        self.counts: Counter = Counter()
        """What this process delivered so far (:data:`LEDGER_KEYS`)."""
        self.skipped: Counter = Counter()
        """Samples whose image (or sizes) failed, by reason (this process)."""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_reader"] = None  # Lance handles do not cross processes
        return state

    @property
    def version(self) -> int:
        return int(self.spec.version)  # type: ignore[arg-type]

    @property
    def reader(self) -> Any:
        if self._reader is None:
            from tokenloom.rows.read import RowReader

            s = self.spec
            self._reader = RowReader(
                s.table,
                self.version,
                [s.image_column, s.prompt_column, s.response_column],
                storage_options=self.storage_options,
            )
        return self._reader

    # -- the plan -----------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> CompactBlocks:
        """The epoch's blocks, as selection positions (the last one planned is kept).

        Raises:
            ImageTextError: The epoch has fewer blocks than one global step.
        """
        e = self.epoch if epoch is None else int(epoch)
        return self._plans.get(e, self._build_plan)

    def _build_plan(self, e: int) -> CompactBlocks:
        s, sizes = self.spec, self.sizes
        n = len(sizes.lengths)
        order = epoch_order(n, seed=s.seed, epoch=e)
        packed = pack_compact(
            sizes.lengths[order],
            (sizes.image_tokens[order] > 0).astype(np.uint8),
            budget=s.budget,
            image_cap=s.image_cap,
            policy=s.policy,
            window=s.window,
        )
        members = order[packed.members]  # positions in the order -> selection positions
        del order
        blocks = CompactBlocks(
            members=members.astype(packed.members.dtype, copy=False),
            starts=packed.starts,
            dropped=packed.dropped,
        )
        if not len(blocks) or (s.drop_last and len(blocks) < s.global_batch):
            why = (
                f", fewer than one global batch of {s.global_batch} with drop_last"
                if len(blocks)
                else ""
            )
            raise ImageTextError(
                f"epoch {e} has no step: {n:,} samples ({blocks.dropped:,} longer than the "
                f"budget of {s.budget}) pack into {len(blocks)} blocks{why}; widen the filter, "
                "raise the budget (--seq-len), or lower --global-batch-size / drop --drop-last"
            )
        return blocks

    @property
    def nbytes(self) -> int:
        """Bytes held per the whole selection: the sizes plus the current epoch's plan."""
        e = self.epoch
        plan = self.plan(e).nbytes if e in self._plans else 0
        return self.sizes.nbytes + plan

    def steps(self, epoch: int | None = None) -> int:
        """Global steps of an epoch (the same on every rank): ``blocks // G`` with
        ``drop_last``, else ``ceil(blocks / G)``."""
        n, g = len(self.plan(epoch)), self.spec.global_batch
        return n // g if self.spec.drop_last else -(-n // g)

    def __len__(self) -> int:
        return self.steps()

    def blocks_of(self, step: int, *, epoch: int | None = None, rank: int | None = None) -> range:
        """Block numbers rank ``rank`` (default this one) takes at global ``step`` (numbers past
        the epoch's blocks are blocks of padding only, completing the last step)."""
        r = self.rank if rank is None else rank
        first = Topology(r, self.world_size).first(step, self.spec.global_batch)
        return range(first, first + self.per_rank)

    def plan_ledger(self, epoch: int | None = None) -> dict[str, float]:
        """The epoch's planned blocks: samples, image tokens, text tokens, padding (all ranks,
        whole steps only), and the samples too long to pack."""
        blocks = self.plan(epoch)
        s = self.spec
        n_blocks = self.steps(epoch) * s.global_batch
        used = blocks.members[: int(blocks.starts[min(n_blocks, len(blocks))])].astype(np.int64)
        lengths = self.sizes.lengths[used].astype(np.int64)
        img = self.sizes.image_tokens[used].astype(np.int64)
        positions = n_blocks * s.budget
        return {
            "blocks": n_blocks,
            "samples": len(used),
            "images": int((img > 0).sum()),
            "image_tokens": int(img.sum()),
            "text_tokens": int(lengths.sum() - img.sum()),
            "padding": int(positions - lengths.sum()),
            "padding_share": float(positions - lengths.sum()) / max(positions, 1),
            "dropped_samples": blocks.dropped,
            "left_over_blocks": max(len(blocks) - n_blocks, 0),
            "padding_blocks": max(n_blocks - len(blocks), 0),
        }

    def padding_by_policy(self, epoch: int | None = None) -> dict[str, dict[str, float]]:
        """The ledger of every policy (pad-to-longest, greedy, knapsack) on the epoch's shuffled
        samples (:func:`~tokenloom.vision.packing.plan_padding`): what packing saves."""
        from tokenloom.vision.packing import plan_padding

        s = self.spec
        e = self.epoch if epoch is None else int(epoch)
        order = epoch_order(len(self.sizes.lengths), seed=s.seed, epoch=e)
        return plan_padding(
            self.sizes.lengths[order].astype(np.int64),
            self.sizes.image_tokens[order].astype(np.int64),
            budget=s.budget,
            image_cap=s.image_cap,
            window=s.window,
        )

    def ledger(self) -> dict[str, Any]:
        """What this process delivered so far: blocks, samples, images, image and text tokens,
        padding, skipped samples (and the skips by reason)."""
        out: dict[str, Any] = {k: int(self.counts.get(k, 0)) for k in LEDGER_KEYS}
        out["skipped_by_reason"] = dict(self.skipped)
        return out

    def trace(self, step: int, epoch: int | None = None) -> list[dict[str, Any]]:
        """Which rows global ``step`` held: per rank and block, the table ids of its samples
        in block order (every rank's, from the plan alone)."""
        blocks = self.plan(epoch)
        e = self.epoch if epoch is None else int(epoch)
        if not 0 <= step < self.steps(e):
            raise ImageTextError(
                f"step {step} is outside epoch {e}: it has {self.steps(e)} global steps"
            )
        out = []
        for r in range(self.world_size):
            for b in self.blocks_of(step, epoch=e, rank=r):
                ids = self.sizes.selection.row_ids[self._members(blocks, b)]
                out.append({"epoch": e, "step": step, "rank": r, "block": b,
                            "row_ids": [int(i) for i in ids]})  # fmt: skip
        return out

    # -- state --------------------------------------------------------------------------------

    def plan_inputs(self) -> dict[str, Any]:
        """The named inputs the stream depends on (world size and workers are not among them)."""
        return {
            "table_version": self.version,
            "tokenizer": self.tokenizer.get("vocab_hash"),
            **self.spec.fingerprint_inputs(),
        }

    def state_dict(self) -> dict:
        """The cursor of batches delivered so far, the fingerprint, and the ledger."""
        out = StreamCursor.state_dict(self)
        out["ledger"] = dict(self.counts)
        out["skipped"] = dict(self.skipped)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        StreamCursor.load_state_dict(self, state)
        self.counts = Counter(state.get("ledger", {}))
        self.skipped = Counter(state.get("skipped", {}))

    # -- the materialiser ---------------------------------------------------------------------

    def _sample(self, pos: int, image: bytes | None, prompt: np.ndarray, response: np.ndarray):
        """``(patches, prompt, response)`` of one sample, or the reason it is left out."""
        sizes, grid = self.sizes, self.spec.grid
        want_img = int(sizes.image_tokens[pos])
        want_len = int(sizes.lengths[pos])
        row_id = int(self.sizes.selection.row_ids[[pos]][0])
        try:
            if want_img:
                if image is None:
                    raise SizeMismatch(f"stored sizes promise {want_img} patches but no image")
                patches = patchify(decode_image(image, grid), grid.patch)
                if len(patches) != want_img:
                    raise SizeMismatch(
                        f"the image decodes to {len(patches)} patches, its stored width and "
                        f"height to {want_img}"
                    )
            elif image:  # bytes the plan did not count: not silently dropped
                raise SizeMismatch(
                    "an image is stored but its stored width and height give it no patch"
                )
            else:
                patches = np.zeros((0, grid.patch_dim), np.float32)
            if want_img + len(prompt) + len(response) + 1 != want_len:
                raise SizeMismatch(
                    f"{len(prompt)} prompt + {len(response)} response ids read, but the count "
                    "columns say otherwise"
                )
        except Exception as exc:  # noqa: BLE001 - a bad sample: the policy decides
            if self.spec.on_error == "raise":
                raise RowTransformError(
                    f"sample of row id {row_id} cannot be used: {type(exc).__name__}: {exc}; "
                    "pass on_error='skip' (--on-error skip) to leave such samples out, counted"
                ) from exc
            return None, reason_of(exc)
        return (patches, prompt, response), None

    def build_blocks(self, blocks: list[int], epoch: int, pool: ThreadPoolExecutor | None = None):
        """Blocks ``blocks`` of ``epoch`` materialised: a dict of stacked arrays (``input_ids``,
        ``labels``, ``image_mask``, ``doc_ids``, ``position_ids``: ``(B, budget)``; ``patches``:
        ``(image positions, patch_dim)``), ``row_ids`` per block, and the block's counts."""
        from tokenloom.table.tokens import token_lists

        plan = self.plan(epoch)
        s = self.spec
        members = [self._members(plan, b) for b in blocks]
        flat = np.concatenate(members) if members else np.zeros(0, np.int64)
        sel = self.sizes.selection
        ids = sel.row_ids[flat]
        batch = self.reader.read(sel.rowids[flat], ids) if len(flat) else None
        prompts: list[np.ndarray] = []
        responses: list[np.ndarray] = []
        images: list[Any] = []
        if batch is not None:
            for col, out in ((1, prompts), (2, responses)):
                tl = token_lists(batch.column(col), batch.schema.field(col))
                vals, offs = tl.values.astype(np.int64), tl.offsets
                out.extend(vals[offs[i] : offs[i + 1]] for i in range(len(flat)))
            images = batch.column(0).to_pylist()
        args = list(zip(flat.tolist(), images, prompts, responses, strict=True))
        mapper = pool.map if pool is not None else map
        samples = list(mapper(lambda a: self._sample(*a), args))
        packed, row_ids = [], []
        counts: Counter = Counter()
        skipped: Counter = Counter()
        at = 0
        for blk in members:
            kept = []
            for j in range(len(blk)):
                sample, reason = samples[at + j]
                if sample is None:
                    skipped[reason] += 1  # its positions stay padding: the blocks do not change
                    continue
                kept.append(sample)
            row_ids.append(ids[at : at + len(blk)])
            at += len(blk)
            block = pack_block(
                kept,
                budget=s.budget,
                eos_id=self.eos_id,
                pad_id=self.eos_id,
                image_id=self.eos_id,
                patch_dim=s.grid.patch_dim,
            )
            packed.append(block)
            n_img = int(block.image_mask.sum())
            used = int((block.doc_ids >= 0).sum())
            counts.update(
                blocks=1,
                samples=len(kept),
                images=sum(1 for pt, _, _ in kept if len(pt)),
                image_tokens=n_img,
                text_tokens=used - n_img,
                padding=s.budget - used,
            )
        counts["skipped"] = sum(skipped.values())
        T, D = s.budget, s.grid.patch_dim

        def stack(key: str, dtype: Any) -> np.ndarray:
            if not packed:
                return np.zeros((0, T), dtype)
            return np.stack([getattr(p, key) for p in packed])

        return {
            "input_ids": stack("input_ids", np.int64),
            "labels": stack("labels", np.int64),
            "image_mask": stack("image_mask", bool),
            "doc_ids": stack("doc_ids", np.int64),
            "position_ids": stack("position_ids", np.int64),
            "patches": (
                np.concatenate([p.patches for p in packed])
                if packed
                else np.zeros((0, D), np.float32)
            ),
            "row_ids": row_ids,
            "counts": dict(counts),
            "skipped": dict(skipped),
        }

    def build_step(
        self, step: int, epoch: int | None = None, *, part: tuple[int, int] = (0, 1),
        pool: ThreadPoolExecutor | None = None,
    ) -> dict:  # fmt: skip
        """This rank's blocks of global ``step`` (``part=(k, K)``: the ``k``-th of ``K``
        contiguous parts of them, what DataLoader worker ``k`` of ``K`` builds)."""
        e = self.epoch if epoch is None else int(epoch)
        mine = self.blocks_of(step, epoch=e)
        k, parts = part
        lo, hi = k * len(mine) // parts, (k + 1) * len(mine) // parts
        return self.build_blocks(list(mine[lo:hi]), e, pool)

    @staticmethod
    def _members(plan: CompactBlocks, b: int) -> np.ndarray:
        """Selection positions of block ``b`` (none for a block past the plan: padding)."""
        return plan.block(b) if b < len(plan) else np.zeros(0, np.int64)

    def _account(self, batch: dict) -> None:
        self.counts.update(batch["counts"])
        self.skipped.update(batch["skipped"])

    # -- iteration ----------------------------------------------------------------------------

    def _built(self, part: tuple[int, int]) -> Iterator[tuple[int, int, dict]]:
        """``(epoch, step, batch)`` of the rest of the current epoch, part ``part`` of each
        step, images decoded in a pool of :attr:`threads` threads."""
        epoch, first = self.cursor
        n = self.steps(epoch)
        pool = (
            ThreadPoolExecutor(self.threads, thread_name_prefix="tokenloom-img")
            if self.threads
            else None
        )
        try:
            for s in range(first, n):
                yield epoch, s, self.build_step(s, epoch, part=part, pool=pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def batches(self) -> Iterator[dict]:
        """The rest of the current epoch in this process (the cursor moves as each batch is
        handed out)."""
        epoch = self.epoch
        n = self.steps(epoch)
        for e, s, batch in self._built((0, 1)):
            self._account(batch)
            self.delivered(e, s, n)
            yield batch

    def __iter__(self) -> Iterator[dict]:
        return self.batches()

    def groups(self, worker: int, workers: int, *, keep: bool = False) -> Iterator[Any]:
        """Worker ``worker`` of ``workers``
        (:class:`~tokenloom.loader.pipeline.workers.WorkerPool`): its part of every step of the rest
        of the current epoch (the ``worker``-th contiguous part of the rank's blocks), arrays in a
        shared-memory ring; the loader takes the workers' parts round-robin and joins each step's.
        ``keep`` changes nothing here: each pass is told its cursor."""
        from tokenloom.loader.pipeline.transit import StepMessage, WorkerRing

        del keep
        ring = WorkerRing()
        for epoch, s, batch in self._built((worker, workers)):
            extra = {"counts": batch.pop("counts"), "skipped": batch.pop("skipped")}
            message = StepMessage(epoch=epoch, first=s, batch=batch, extra=extra, worker=worker)
            yield ring.put(message)

    def detached(self) -> ImageTextStream:
        """This stream as a plain :class:`ImageTextStream` (what a worker is sent: unpickling
        it imports no torch). Shares this object's state."""
        out = ImageTextStream.__new__(ImageTextStream)
        out.__dict__.update(self.__dict__)
        return out


def join_parts(parts: list[dict]) -> dict:
    """The workers' parts of one step (in worker order) as one batch (its arrays copied out of
    the workers' shared memory, so a kept batch holds no slot)."""
    out: dict[str, Any] = {}
    for key in ("input_ids", "labels", "image_mask", "doc_ids", "position_ids", "patches"):
        out[key] = np.concatenate([p[key] for p in parts])
    out["row_ids"] = [r for p in parts for r in p["row_ids"]]
    counts: Counter = Counter()
    skipped: Counter = Counter()
    for p in parts:
        counts.update(p["counts"])
        skipped.update(p["skipped"])
    out["counts"], out["skipped"] = dict(counts), dict(skipped)
    return out
