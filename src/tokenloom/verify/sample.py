"""What ``verify`` reads: real batches of the loader under test, and the rows they hold.

The sample is the first ``k`` global steps of epoch 0, ``k`` steps at an offset drawn from the
seed, and every step holding one of two *fixed documents* (the shortest and the longest selected
rows; with a mixture, of the rows its epoch delivers whole, :func:`fixed_candidates`), so those
two can be followed across every block of the epoch. Batches come from the real
:class:`~tokenloom.loader.DataLoader`, positioned with a loader state (the public resume path);
next to each batch the sample keeps the plan's own spans of that step, which carry what the
batch's provenance does not (whether a stretch holds its EOS, context ranges, window ends). The
rows are read back from the table and tokenized again from their text.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenloom.loader.plan.spans import Spans
from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.loader.plan.state import LoaderState
from tokenloom.tokenize.base import Tokenizer
from tokenloom.verify.report import VerifyError

__all__ = [
    "dataset",
    "StepBatch",
    "Row",
    "Sample",
    "sample_steps",
    "fixed_rows",
    "pass_keys",
    "cut_passes",
    "fixed_candidates",
    "read_sample",
]


def dataset(spec: LoaderSpec, storage_options: Mapping[str, str] | None = None) -> Any:
    """A fresh :class:`~tokenloom.loader.PackedDataset` of ``spec`` on one rank (the global
    stream is the same on any number, ★3); ``storage_options`` reach an object store."""
    from tokenloom.loader import PackedDataset

    so = dict(storage_options) if storage_options else None
    return PackedDataset(spec, rank=0, world_size=1, storage_options=so)


@dataclass(frozen=True, kw_only=True, eq=False)
class StepBatch:
    """One global step as the loader delivered it, with the plan's spans of that step."""

    step: int
    arrays: dict[str, np.ndarray]
    """The batch's tensors as numpy arrays (``input_ids``, ``labels``, ``spans``, ...)."""
    max_seqlen: int
    plan: Spans
    """The plan's stretches of the step's blocks (what the batch is meant to materialise)."""
    order: np.ndarray
    """``(B,)`` each batch row's place in the stream (the plan's ``stream_position`` where it
    has one, as a mixture does; else its block index), ``-1`` for a padding block."""
    visit: np.ndarray
    """``(B,)`` the pass each batch row belongs to (:func:`pass_keys`), ``-1`` for a padding
    block: a document's stretches of one pass are one visit, in whatever blocks the packing put
    them."""
    loss_positions: int
    """What the loader's ``stats.loss_positions`` counted for this batch."""
    masked_tokens: int = 0
    """What the loader's ``stats.masked_tokens`` counted for this batch."""


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
    mask: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 2), np.int64))
    """``(K, 2)`` int64 ``[start, end)`` token spans of the loss-mask column (none without one),
    read from the column apart from the loader."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Sample:
    """Everything the checks look at."""

    uri: str
    version: int
    spec: LoaderSpec
    """The loader under test, its table version pinned."""
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
    """Every row any of the batches holds that the filter selects (the text check fails a
    batch holding any other)."""
    cut_passes: frozenset[int] = frozenset()
    """Passes (:attr:`StepBatch.visit`) the epoch stops inside (a mixture pool's partial last
    pass): a visit in one may deliver only some of the document's tokens. Empty otherwise."""
    left_out: str | None = None
    """How many rows the filter left out because a column it reads is null (one line)."""
    files: Any = None
    """With a grouped spec, the :class:`~tokenloom.loader.plan.files.Files` layout: the
    sample's rows are its groups (documents)."""


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
    row_ids, n_tokens = np.asarray(row_ids), np.asarray(n_tokens)  # plain copies if compact
    keep = np.flatnonzero(n_tokens > 0)
    if keep.size == 0:
        return []
    short = int(row_ids[keep[np.argmin(n_tokens[keep])]])
    long = int(row_ids[keep[np.argmax(n_tokens[keep])]])
    return [short] if short == long else [short, long]


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

    view = ds.view(0)
    out = []
    for run in _runs(steps):
        state = LoaderState.create(epoch=0, step=run[0], inputs=ds.plan_inputs())
        ds.load_state_dict(state.to_dict())
        dl = DataLoader(ds, num_workers=0)
        it = iter(dl)
        counted, masked = dl.stats.loss_positions, dl.stats.masked_tokens
        for step in run:
            batch = next(it)
            arrays = {k: v.numpy() for k, v in batch.items() if hasattr(v, "numpy")}
            spans = view.layout(step).spans
            out.append(
                StepBatch(
                    step=step,
                    arrays=arrays,
                    max_seqlen=int(batch["max_seqlen"]),
                    plan=spans,
                    order=_stream_order(view.plan, spans.blocks),
                    visit=pass_keys(view.plan, spans.blocks),
                    loss_positions=dl.stats.loss_positions - counted,
                    masked_tokens=dl.stats.masked_tokens - masked,
                )
            )
            counted, masked = dl.stats.loss_positions, dl.stats.masked_tokens
        it.close()
    return out


def _stream_order(plan: Any, blocks: np.ndarray) -> np.ndarray:
    """Each block's place in the stream (``-1`` for padding): see :attr:`StepBatch.order`."""
    blocks = np.asarray(blocks, dtype=np.int64)
    position = getattr(plan, "stream_position", None)
    if position is None:
        return blocks
    out = np.full(blocks.shape, -1, dtype=np.int64)
    real = blocks >= 0
    out[real] = position(blocks[real])
    return out


def pass_keys(plan: Any, blocks: np.ndarray) -> np.ndarray:
    """``(m,)`` a key of the pass each block (``>= 0``; ``-1`` stays ``-1``) belongs to.

    A plan delivers each selected row once per pass, but not in token order: best-fit places a
    long document's windows (and split pieces) in any blocks of its fit window, so a visit is
    told by the pass it belongs to, never by where token 0 lies. A mixture has a pass per pool
    and pass number (a row in two pools has a visit in each); any other plan one pass, key 0.
    """
    blocks = np.asarray(blocks, dtype=np.int64)
    out = np.full(blocks.shape, -1, dtype=np.int64)
    real = blocks >= 0
    source = getattr(plan, "source", None)
    if source is None:
        out[real] = 0
        return out
    pool, _, pass_, _ = source(blocks[real])
    out[real] = pass_ * len(plan.pools) + pool
    return out


def cut_passes(plan: Any) -> frozenset[int]:
    """The :func:`pass_keys` of the passes the epoch stops inside (a mixture pool's partial last
    pass); empty for a plan whose one pass is whole."""
    reports = getattr(plan, "reports", ())
    return frozenset(  # a pool's partial pass is the one after its full passes
        r.full_passes * len(reports) + p for p, r in enumerate(reports) if r.passes > r.full_passes
    )


def fixed_candidates(ds: Any, plan: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(row_ids, n_tokens)`` of the rows the epoch certainly delivers whole at least once.

    Without a mixture: every selected row. A mixture delivers a pool's rows only on the passes
    its quota reaches, so a row of the union may never be delivered: the candidates are the rows
    of the pools that complete a pass, else the rows of each pool's first block.
    """
    inputs = ds.inputs
    if not hasattr(plan, "pass_ends"):
        return np.asarray(inputs.row_ids), np.asarray(inputs.n_tokens)
    pools = ds.planner.pool_inputs
    full = [i for i, r in enumerate(plan.reports) if r.full_passes >= 1]
    if full:
        ids = np.unique(np.concatenate([np.asarray(pools[i].row_ids) for i in full]))
    else:
        firsts = [
            plan.pool_plan(p, 0).spans(np.zeros(1, dtype=np.int64)).row_id
            for p, r in enumerate(plan.reports)
            if r.blocks > 0
        ]
        ids = np.unique(np.concatenate(firsts)) if firsts else np.zeros(0, dtype=np.int64)
    union = np.asarray(inputs.row_ids)
    return ids, np.asarray(inputs.n_tokens)[np.searchsorted(union, ids)]


def read_rows(ds: Any, ids: np.ndarray, tokenizer: Tokenizer) -> dict[int, Row]:
    """Text, stored ids and count of rows (by table id), and a fresh tokenization of each text.

    With a grouped spec the plan's rows are groups (``ids``: group ids): each is read as the
    document the spec makes of it, from its files' rows, apart from the loader's reader: ids
    (stored and fresh) and text are its files' in order, each after its prefix (file marker,
    the document's BOS), the prefix's text decoded with ``tokenizer``."""
    files = getattr(ds.planner, "files", None)
    if files is None:
        return _read_rows(ds, ds.inputs, ids, tokenizer)
    from tokenloom.loader.plan.files import ragged

    g = np.unique(np.asarray(ids, dtype=np.int64))
    g = g[(g >= 0) & (g < files.groups)]
    count = files.gptr[g + 1] - files.gptr[g]
    members = ragged(files.gptr[g], count)
    rows = _read_rows(ds, ds.planner.row_inputs, files.rows[members], tokenizer)
    out: dict[int, Row] = {}
    for k, gid in enumerate(g.tolist()):
        parts = members[int(count[:k].sum()) : int(count[: k + 1].sum())].tolist()
        stored, fresh, text, n = [], [], [], 0
        for m in parts:
            pre = files.prefix_of(m)
            row = rows[int(files.rows[m])]
            stored += [pre, row.stored]
            fresh += [pre, row.fresh]
            text += [tokenizer.decode(pre.tolist()) if len(pre) else "", row.text]
            n += len(pre) + row.n_tokens
        out[gid] = Row(
            id=gid,
            text="".join(text),
            stored=np.concatenate(stored).astype(np.int64),
            n_tokens=n,
            fresh=np.concatenate(fresh).astype(np.int64),
        )
    return out


def _read_rows(ds: Any, inputs: Any, ids: np.ndarray, tokenizer: Tokenizer) -> dict[int, Row]:
    """:func:`read_rows` of table rows (``inputs``: the plan inputs of the rows)."""
    from tokenloom.loader.pipeline.take import take
    from tokenloom.table import Table
    from tokenloom.table.tokens import as_token_lists

    ids = np.unique(np.asarray(ids, dtype=np.int64))
    union = np.asarray(inputs.row_ids)
    pos = np.minimum(np.searchsorted(union, ids), max(union.size - 1, 0))
    ids = ids[union[pos] == ids] if union.size else ids[:0]  # the rest: not selected (check_text)
    if ids.size == 0:
        return {}
    rowids = inputs.rowids[np.searchsorted(union, ids)]
    column, count, mask = ds.spec.token_column, ds.spec.count_column, ds.spec.loss_mask_column
    opened = Table.open(ds.uri, version=ds.version, storage_options=ds.planner.storage_options)
    columns = ["id", "text", column, count, *([mask] if mask else [])]
    table = take(opened.dataset, rowids.tolist(), columns)
    spans = [np.zeros((0, 2), dtype=np.int64)] * table.num_rows
    if mask:
        from tokenloom.loader.pipeline.lossmask import mask_pairs

        ids_ = table.column("id").to_numpy()
        pairs, ptr = mask_pairs(table.column(mask), column=mask, rowids=ids_)
        spans = [pairs[ptr[r] : ptr[r + 1]] for r in range(table.num_rows)]
    texts = table.column("text").to_pylist()
    stored = as_token_lists(table.column(column), table.schema.field(column)).to_pylist()
    counts = table.column(count).to_pylist()
    fresh = tokenizer.encode_batch([t if t is not None else "" for t in texts]).to_pylist()
    return {
        int(i): Row(
            id=int(i),
            text=t or "",
            stored=np.asarray(s or [], dtype=np.int64),
            n_tokens=int(c or 0),
            fresh=np.asarray(f or [], dtype=np.int64),
            mask=m,
        )
        for i, t, s, c, f, m in zip(
            table.column("id").to_pylist(), texts, stored, counts, fresh, spans, strict=True
        )
    }


def read_sample(
    spec: LoaderSpec, *, steps: int, storage_options: Mapping[str, str] | None = None
) -> Sample:
    """Build the loader, draw the sample, read its batches and rows (``storage_options`` reach
    an object store, with the ``AWS_*`` environment).

    Raises:
        VerifyError: The token column records no tokenizer.
        EmptyEpochError: The filter selects no tokens, or ``drop_last`` leaves no step.
        TokenizerError: The recorded tokenizer cannot be loaded here.
    """
    from tokenloom.tokenize.registry import load_tokenizer

    ds = dataset(spec, storage_options)
    identity = dict(ds.inputs.tokenizer)
    if not identity.get("name"):
        raise VerifyError(
            f"the column {spec.token_column!r} records no tokenizer identity (field metadata "
            "'tokenloom.tokenizer'), so its ids cannot be checked against the text; tokenize "
            f"with `tokenloom tokenize --table {ds.uri} --tokenizer gpt2`"
        )
    tokenizer = load_tokenizer(identity["name"])
    total = len(ds)  # never 0: the planner refuses an epoch without a step
    sampled = sample_steps(total, steps, spec.seed)
    plan = ds.view(0).plan
    fixed = fixed_rows(*fixed_candidates(ds, plan))
    wanted = sorted(set(sampled) | set(ds.view(0).steps_holding(np.asarray(fixed))))
    batches = read_steps(ds, wanted)
    ids = np.concatenate([b.arrays["spans"][:, 2] for b in batches])
    return Sample(
        uri=ds.uri,
        version=ds.version,
        spec=ds.spec,
        identity=identity,
        tokenizer=tokenizer,
        eos_id=int(ds.eos_id),
        total_steps=total,
        sampled_steps=sampled,
        fixed_rows=fixed,
        batches=batches,
        rows=read_rows(ds, ids, tokenizer),
        cut_passes=cut_passes(plan),
        left_out=ds.inputs.left_out(),
        files=getattr(ds.planner, "files", None),
    )
