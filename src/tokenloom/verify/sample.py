"""What ``verify`` reads: real batches of the loader under test, and the rows they hold.

The sample is the first ``k`` global steps of epoch 0, ``k`` steps at an offset drawn from the
seed, and every step holding one of two *fixed documents* (the shortest and the longest selected
rows), so those two can be followed across every block of the epoch. Batches come from the real
:class:`~tokenloom.loader.DataLoader`, positioned with a loader state (the public resume path);
next to each batch the sample keeps the plan's own spans of that step, which carry what the
batch's provenance does not (whether a stretch holds its EOS, context ranges, window ends). The
rows are read back from the table and tokenized again from their text.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan import EpochPlan, step_blocks
from tokenloom.loader.read import count_column_for
from tokenloom.loader.recipe import recipe_spans
from tokenloom.loader.spans import Spans
from tokenloom.loader.state import LoaderState
from tokenloom.tokenize.base import Tokenizer
from tokenloom.verify.report import VerifyError

__all__ = [
    "LoaderOptions",
    "StepBatch",
    "Row",
    "Sample",
    "sample_steps",
    "fixed_rows",
    "steps_holding",
    "read_sample",
]

_SCAN_BLOCKS = 1 << 16  # blocks per chunk when a plan has no stream offsets to search


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """The loader under test. It runs on one rank: the global stream is the same on any (★3)."""

    column: str = "input_ids"
    """The token column."""
    filter: str | None = None
    """SQL filter selecting the rows."""
    seq_len: int = 1024
    """Block length."""
    batch_size: int = 8
    """Blocks per step."""
    seed: int = 0
    """Shuffle seed; it also draws the offset of the second sample."""
    packing: str = "concat"
    """``"concat"`` or ``"best_fit"``."""
    fit_window: int = 1024
    """Best-fit look-ahead, in documents."""
    long_docs: str = "split"
    """``"split"`` or ``"window"``."""
    window: int | None = None
    """Window length for ``long_docs="window"``."""
    overlap: int = 0
    """Context tokens repeated at the start of each later window."""
    cut_column: str | None = None
    """Window boundaries column (``cut_points``) for ``long_docs="window"``."""
    mixture: Any = None
    """Token-quota pools ``{name: (sql_filter, share[, max_passes])}``."""
    budget_tokens: int | None = None
    """Positions of a mixture epoch."""

    def dataset(self, table: Any, *, version: int | None = None) -> Any:
        """A fresh :class:`~tokenloom.loader.PackedDataset` with these options (rank 0 of 1)."""
        from tokenloom.loader import PackedDataset

        return PackedDataset(
            table,
            self.column,
            filter=self.filter,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            seed=self.seed,
            rank=0,
            world_size=1,
            version=version,
            packing=self.packing,
            fit_window=self.fit_window,
            long_docs=self.long_docs,
            window=self.window,
            overlap=self.overlap,
            cut_column=self.cut_column,
            mixture=self.mixture,
            budget_tokens=self.budget_tokens,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, eq=False)
class StepBatch:
    """One global step as the loader delivered it, with the plan's spans of that step."""

    step: int
    arrays: dict[str, np.ndarray]
    """The batch's tensors as numpy arrays (``input_ids``, ``labels``, ``spans``, ...)."""
    max_seqlen: int
    plan: Spans
    """The plan's stretches of the step's blocks (what the batch is meant to materialise)."""
    loss_positions: int
    """What the loader's ``stats.loss_positions`` counted for this batch."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Row:
    """A row held by the sample: its text, stored ids and a fresh tokenization of the text."""

    id: int
    text: str
    stored: np.ndarray
    """``(n,)`` int64: the token column's ids."""
    n_tokens: int
    """The stored count column (the plan's input)."""
    fresh: np.ndarray
    """``(m,)`` int64: the tokenizer's ids of ``text``, computed now."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Sample:
    """Everything the checks look at."""

    uri: str
    version: int
    options: LoaderOptions
    identity: dict
    """The token column's tokenizer identity (field metadata ``tokenloom.tokenizer``)."""
    tokenizer: Tokenizer
    """``load_tokenizer(identity["name"])``."""
    eos_id: int
    total_steps: int
    """Global steps of epoch 0."""
    sampled_steps: list[int]
    fixed_rows: list[int]
    batches: list[StepBatch]
    """Ascending by step: the sampled steps and every step holding a fixed row."""
    rows: dict[int, Row]
    """Every row any of the batches holds."""


def sample_steps(total: int, k: int, seed: int) -> list[int]:
    """The sampled steps: ``[0, k)`` and ``[o, o + k)`` with ``o`` drawn from ``seed``.

    Args:
        total: Steps in the epoch.
        k: Steps per sample (``>= 1``).
        seed: The loader's seed.

    Returns:
        Ascending distinct steps; all of them when ``total <= 2 * k``.
    """
    if total <= 2 * k:
        return list(range(total))
    offset = int(np.random.default_rng([seed, 0x5E1F]).integers(k, total - k + 1))
    return list(range(k)) + list(range(offset, offset + k))


def fixed_rows(row_ids: np.ndarray, n_tokens: np.ndarray) -> list[int]:
    """Ids of the shortest and the longest non-empty rows (the lowest id on ties; deduplicated)."""
    keep = np.flatnonzero(n_tokens > 0)
    if keep.size == 0:
        return []
    short = int(row_ids[keep[np.argmin(n_tokens[keep])]])
    long = int(row_ids[keep[np.argmax(n_tokens[keep])]])
    return [short] if short == long else [short, long]


def steps_holding(plan: Any, rows: list[int], batch_size: int) -> list[int]:
    """The global steps (world size 1) whose blocks hold any token or EOS of ``rows``.

    Stream plans are searched through their offsets; other plans (best-fit) are scanned block by
    block in chunks, O(stretches of the epoch).
    """
    want = np.asarray(rows, dtype=np.int64)
    L = plan.seq_len
    if isinstance(plan, EpochPlan) or hasattr(plan, "starts"):
        ids = plan.row_ids if isinstance(plan, EpochPlan) else plan.docs.row_id
        pieces = np.flatnonzero(np.isin(ids, want))
        lo = plan.starts[pieces] // L
        hi = (plan.starts[pieces + 1] - 1) // L
        blocks = np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi, strict=True)] or [[]])
    else:
        found = []
        for lo in range(0, plan.num_blocks, _SCAN_BLOCKS):
            spans = recipe_spans(plan, np.arange(lo, min(lo + _SCAN_BLOCKS, plan.num_blocks)))
            found.append(spans.blocks[spans.block[np.isin(spans.row_id, want)]])
        blocks = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    return sorted({int(b) // batch_size for b in np.asarray(blocks, dtype=np.int64)})


def _runs(steps: list[int]) -> list[list[int]]:
    """Consecutive runs of ascending steps."""
    groups = itertools.groupby(enumerate(steps), key=lambda p: p[1] - p[0])
    return [[s for _, s in group] for _, group in groups]


def read_steps(ds: Any, steps: list[int]) -> list[StepBatch]:
    """Read global steps of epoch 0 through a :class:`~tokenloom.loader.DataLoader`.

    Each run of consecutive steps starts from a loader state at its first step, exactly as a
    resumed training job would.
    """
    from tokenloom.loader import DataLoader

    plan = ds.plan(0)
    out = []
    for run in _runs(steps):
        state = LoaderState.create(epoch=0, step=run[0], inputs=ds.plan_inputs())
        ds.load_state_dict(state.to_dict())
        dl = DataLoader(ds, num_workers=0)
        it = iter(dl)
        counted = dl.stats.loss_positions
        for step in run:
            batch = next(it)
            blocks = step_blocks(
                step,
                rank=0,
                world_size=1,
                batch_size=ds.batch_size,
                num_blocks=plan.num_blocks,
                drop_last=False,
                order=ds.block_order,
            )
            arrays = {k: v.numpy() for k, v in batch.items() if hasattr(v, "numpy")}
            out.append(
                StepBatch(
                    step=step,
                    arrays=arrays,
                    max_seqlen=int(batch["max_seqlen"]),
                    plan=recipe_spans(plan, blocks),
                    loss_positions=dl.stats.loss_positions - counted,
                )
            )
            counted = dl.stats.loss_positions
        it.close()
    return out


def read_rows(ds: Any, ids: np.ndarray, tokenizer: Tokenizer) -> dict[int, Row]:
    """Text, stored ids and count of rows (by table id), and a fresh tokenization of each text."""
    from tokenloom.table import Table

    ids = np.unique(np.asarray(ids, dtype=np.int64))
    if ids.size == 0:
        return {}
    pos = np.searchsorted(ds.inputs.row_ids, ids)
    rowids = ds.inputs.rowids[pos]
    count = count_column_for(ds.token_column)
    table = Table.open(ds.uri, version=ds.version).dataset._take_rows(
        rowids.tolist(), columns=["id", "text", ds.token_column, count]
    )
    texts = table.column("text").to_pylist()
    stored = table.column(ds.token_column).to_pylist()
    counts = table.column(count).to_pylist()
    fresh = tokenizer.encode_batch([t if t is not None else "" for t in texts]).to_pylist()
    return {
        int(i): Row(
            id=int(i),
            text=t or "",
            stored=np.asarray(s or [], dtype=np.int64),
            n_tokens=int(c or 0),
            fresh=np.asarray(f or [], dtype=np.int64),
        )
        for i, t, s, c, f in zip(
            table.column("id").to_pylist(), texts, stored, counts, fresh, strict=True
        )
    }


def read_sample(table: Any, options: LoaderOptions, *, steps: int) -> Sample:
    """Build the loader, draw the sample, read its batches and rows.

    Raises:
        VerifyError: The token column records no tokenizer, or the filter selects no tokens.
        TokenizerError: The recorded tokenizer cannot be loaded here.
    """
    from tokenloom.tokenize.registry import load_tokenizer

    ds = options.dataset(table)
    identity = dict(ds.inputs.tokenizer)
    if not identity.get("name"):
        raise VerifyError(
            f"the column {options.column!r} records no tokenizer identity (field metadata "
            "'tokenloom.tokenizer'), so its ids cannot be checked against the text; tokenize "
            f"with `tokenloom tokenize --table {ds.uri} --tokenizer gpt2`"
        )
    tokenizer = load_tokenizer(identity["name"])
    total = len(ds)
    if total == 0:
        raise VerifyError(
            f"the filter {options.filter!r} selects no tokens in {ds.uri} (version "
            f"{ds.version}); nothing to verify"
        )
    sampled = sample_steps(total, steps, options.seed)
    fixed = fixed_rows(ds.inputs.row_ids, ds.inputs.n_tokens)
    wanted = sorted(set(sampled) | set(steps_holding(ds.plan(0), fixed, ds.batch_size)))
    batches = read_steps(ds, wanted)
    ids = np.concatenate([b.arrays["spans"][:, 2] for b in batches])
    return Sample(
        uri=ds.uri,
        version=ds.version,
        options=options,
        identity=identity,
        tokenizer=tokenizer,
        eos_id=int(ds.eos_id),
        total_steps=total,
        sampled_steps=sampled,
        fixed_rows=fixed,
        batches=batches,
        rows=read_rows(ds, ids, tokenizer),
    )
