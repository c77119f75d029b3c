"""Per-document loss as a column: each row's mean token loss under a trained run's model.

``tokenloom doc-loss --table T --checkpoint RUN --column NAME`` adds a ``float32`` column through
the backfill engine (:func:`~tokenloom.backfill.add_column`): parallel (local processes or Ray),
checkpointed per unit (a killed run resumes without recomputing finished units), one new table
version; rows outside ``--filter`` get null, and so do empty documents (no target to predict).
The column is then an ordinary one: ``stats --filter "NAME > 6"``, ``search --filter ...``.

What is computed for a document of ``n`` tokens is what training predicts for it: inputs are its
tokens, targets the next token of the same document, its last token predicting the EOS (``n``
targets), with attention inside the document only and positions from 0. A document longer than
the model's context (``block_size`` positions) is cut into consecutive windows of at most that
many inputs, each attending within itself with positions from 0; every target is predicted
exactly once and the value is the mean over all ``n`` of them.

The UDF's identity holds a digest of the model's weights, not the run's path: a unit computed by
other weights (the run trained further, or replaced) is never reused, and a worker that loads
weights other than the driver saw refuses to compute.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = [
    "DocLossError",
    "DocLossResult",
    "DOC_LOSS_META_KEY",
    "document_losses",
    "doc_loss_udf",
    "doc_loss_table",
    "weights_digest",
]

DOC_LOSS_META_KEY = b"tokenloom.doc_loss"
"""Field metadata of the column: the run, its step and weights digest, the window length."""
_UDF_VERSION = "mean-next-token-1"


class DocLossError(TokenloomError):
    """The run or the table cannot give per-document losses (missing run, other tokenizer)."""


def weights_digest(model: Any) -> str:
    """A short sha256 of the model's parameters and buffers (names, shapes, bytes)."""
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:24]


def document_losses(
    model: Any,
    docs: Sequence[np.ndarray],
    *,
    eos_id: int,
    batch_size: int = 16,
    window: int | None = None,
) -> np.ndarray:
    """``(len(docs),)`` float64: each document's mean next-token loss (``nan``: empty).

    Args:
        model: A :class:`~tokenloom.train.model.GPT` (eval mode; its device is used).
        docs: Token ids of each document (EOS not included).
        eos_id: The id the document's last token predicts.
        batch_size: Windows per forward pass.
        window: Inputs per window (default: the model's ``block_size``).
    """
    import torch

    W = int(window or model.cfg.block_size)
    device = next(model.parameters()).device
    # (doc, start, length) of every window; windows of similar length share a forward pass
    spans = [(d, s, min(W, len(x) - s)) for d, x in enumerate(docs) for s in range(0, len(x), W)]
    spans.sort(key=lambda w: w[2])
    sums = np.zeros(len(docs), dtype=np.float64)
    counts = np.zeros(len(docs), dtype=np.int64)
    with torch.no_grad():
        for a in range(0, len(spans), batch_size):
            part = spans[a : a + batch_size]
            T = max(n for _, _, n in part)
            ids = np.full((len(part), T), eos_id, dtype=np.int64)  # (b, T)
            labels = np.full((len(part), T), -100, dtype=np.int64)
            doc_ids = np.full((len(part), T), -1, dtype=np.int64)
            for i, (d, s, n) in enumerate(part):
                seq = np.asarray(docs[d], dtype=np.int64)
                ids[i, :n] = seq[s : s + n]
                labels[i, :n] = np.append(seq[s + 1 : s + n + 1], eos_id)[:n]
                doc_ids[i, :n] = 0
            positions = np.broadcast_to(np.arange(T), (len(part), T))
            _, loss = model(
                torch.from_numpy(ids).to(device),
                position_ids=torch.from_numpy(np.ascontiguousarray(positions)).to(device),
                doc_ids=torch.from_numpy(doc_ids).to(device),
                labels=torch.from_numpy(labels).to(device),
                attention="document",
                kernel="sdpa",
                reduction="none",
            )
            per_window = loss.view(len(part), T).double().sum(dim=1).cpu().numpy()  # (b,)
            which = np.array([d for d, _, _ in part])
            np.add.at(sums, which, per_window)
            np.add.at(counts, which, np.array([n for _, _, n in part]))
    out = np.full(len(docs), np.nan)
    has = counts > 0
    out[has] = sums[has] / counts[has]
    return out


class _DocLoss:
    """The UDF body (a plain module-level class: workers import it by name).

    ``run`` and ``digest`` are the identity (the digest: weights may change under one path);
    ``_batch_size``, ``_device`` and ``_threads`` are run-time plumbing.
    """

    def __init__(
        self,
        run: str,
        digest: str,
        column: str,
        eos_id: int,
        _batch_size: int = 16,
        _device: str = "cpu",
        _threads: int = 0,
    ) -> None:
        import torch

        from tokenloom.train.checkpoint import load_run_model

        if _threads:
            torch.set_num_threads(_threads)
        self.model, _ = load_run_model(run, device=_device)
        got = weights_digest(self.model)
        if got != digest:
            raise DocLossError(
                f"the weights in {run} changed while the backfill ran (digest {got}, the "
                f"backfill started with {digest}); run `tokenloom doc-loss` again"
            )
        self.column, self.eos_id, self.batch_size = column, int(eos_id), int(_batch_size)

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        col = batch.column(self.column)
        offsets = np.asarray(col.offsets)
        values = np.asarray(col.values, dtype=np.int64)
        docs = [values[offsets[i] : offsets[i + 1]] for i in range(len(col))]
        losses = document_losses(self.model, docs, eos_id=self.eos_id, batch_size=self.batch_size)
        return pa.array(losses.astype(np.float32), mask=np.isnan(losses), type=pa.float32())


def doc_loss_udf(
    run: str,
    output: str,
    *,
    digest: str,
    column: str,
    eos_id: int,
    meta: dict[str, Any],
    batch_size: int = 16,
    device: str = "cpu",
    threads: int = 0,
) -> Any:
    """The backfill UDF reading token ``column`` and writing ``output`` (``float32``)."""
    from tokenloom.backfill.udf import UDF

    return UDF(
        _DocLoss,
        inputs=[column],
        output=pa.field(
            output,
            pa.float32(),
            metadata={DOC_LOSS_META_KEY: json.dumps(meta, sort_keys=True).encode()},
        ),
        version=_UDF_VERSION,
        name="DocLoss",
        batch_size=max(64, batch_size),
        kwargs={
            "run": run,
            "digest": digest,
            "column": column,
            "eos_id": int(eos_id),
            "_batch_size": int(batch_size),
            "_device": device,
            "_threads": int(threads),
        },
    )


@dataclass(kw_only=True)
class DocLossResult:
    """What :func:`doc_loss_table` added."""

    column: str
    run: str
    step: int
    digest: str
    window: int
    version: int | None
    """The new table version (``None``: every row already had the column)."""
    rows: int = 0
    units: int = 0
    units_reused: int = 0
    bytes_added: int = 0
    seconds: float = 0.0
    fragments: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def doc_loss_table(
    table: str,
    run: str,
    output: str,
    *,
    where: str | None = None,
    batch_size: int = 16,
    workers: int | None = None,
    executor: str = "local",
    device: str = "cpu",
    unit_rows: int = 1024,
    storage_options: dict | None = None,
    progress: bool | None = None,
) -> DocLossResult:
    """Add (or complete) the column ``output``: each row's mean token loss under ``run``.

    Raises:
        DocLossError: ``run`` has no loadable checkpoint, or the table's token column is missing
            or holds another tokenizer's ids.
        BackfillError, FilterError: as :func:`~tokenloom.backfill.add_column`.
    """
    from tokenloom.backfill import add_column
    from tokenloom.loader.pipeline.inputs import tokenizer_identity
    from tokenloom.table import Table
    from tokenloom.table.names import validate_column_name
    from tokenloom.train.checkpoint import load_run_model

    validate_column_name(output, what="--column")
    started = time.perf_counter()
    run = os.path.abspath(run)
    try:
        model, record = load_run_model(run)
    except TokenloomError as exc:
        raise DocLossError(f"--checkpoint {run}: {exc}") from None
    column = record.loader.token_column
    handle = Table.open(table, storage_options=storage_options)
    ds = handle.dataset
    if column not in ds.schema.names:
        raise DocLossError(
            f"the table {handle.uri} has no token column {column!r} (the run trained on it); "
            f"tokenize it as the run's table was: `tokenloom tokenize --table {handle.uri} "
            f"--tokenizer {record.tokenizer.get('name') or '...'} --column {column}`"
        )
    have = tokenizer_identity(ds, column)
    if have and record.tokenizer and have != record.tokenizer:
        raise DocLossError(
            f"the column {column!r} of {handle.uri} holds tokenizer {have.get('name')!r} "
            f"({have.get('vocab_size')} ids) but the run was trained on "
            f"{record.tokenizer.get('name')!r} ({record.tokenizer.get('vocab_size')} ids)"
        )
    eos = record.loader.eos_id
    if eos is None:
        eos = record.tokenizer.get("eos_id")
    if eos is None:
        raise DocLossError(f"the run {run} records no EOS id (its tokenizer has none)")
    digest = weights_digest(model)
    window = int(model.cfg.block_size)
    del model
    cpus = os.cpu_count() or 1
    n = (min(8, cpus) if workers is None else workers) or 1
    meta = {"run": run, "step": record.step, "weights": digest, "window": window}
    udf = doc_loss_udf(
        run,
        output,
        digest=digest,
        column=column,
        eos_id=int(eos),
        meta=meta,
        batch_size=batch_size,
        device=device,
        threads=max(1, cpus // n),
    )
    res = add_column(
        handle,
        output,
        udf,
        workers=workers,
        executor=executor,
        where=where,
        unit_rows=unit_rows,
        progress=progress,
    )
    return DocLossResult(
        column=output,
        run=run,
        step=record.step,
        digest=digest,
        window=window,
        version=res.version,
        rows=res.rows,
        units=res.units,
        units_reused=res.units_reused,
        bytes_added=res.bytes_added,
        seconds=time.perf_counter() - started,
        fragments=res.fragments,
    )
