"""Tokenize a table: token ids and their count as added columns, the tokenizer pinned on them.

The ids column (``list<uint16>`` when the vocabulary fits, else ``list<int32>``; or, with
``layout="bytes"``, raw ids in one ``large_binary`` value per row:
:mod:`tokenloom.table.tokens`) carries the tokenizer identity in its field metadata
(``tokenloom.tokenizer``), which the loader and the checkpoints read. Several token columns
can live side by side (``input_ids``, ``input_ids_bpe16k``); each has its own count column
(``n_tokens``, ``n_tokens_bpe16k``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill import add_column, udf
from tokenloom.table.tokens import (
    LAYOUTS,
    TokenLayoutError,
    as_token_lists,
    layout_field,
    layout_name,
    to_layout,
)
from tokenloom.tokenize.base import EncodeError, TokenizerError
from tokenloom.tokenize.registry import load_tokenizer
from tokenloom.tokenize.roundtrip import roundtrip_failures

__all__ = ["Encode", "LossyTokenizerError", "TokenizeResult", "count_column_for", "tokenize_table"]

TOKENIZER_META_KEY = b"tokenloom.tokenizer"
TEXT_COLUMN_META_KEY = b"tokenloom.text_column"
"""Field metadata of a token column: the text column it encodes."""
_EXAMPLES_KEPT = 20
"""Failures kept as examples in the result (every failure is counted)."""


class LossyTokenizerError(TokenizerError):
    """The tokenizer does not give back the text of sampled rows; nothing was committed."""


def count_column_for(token_column: str) -> str:
    """The count column beside a token column (``input_ids`` -> ``n_tokens``)."""
    from tokenloom.loader.plan.spec import count_column_for as rule

    return rule(token_column)


@udf(
    inputs=["text"],
    output={"input_ids": pa.list_(pa.uint16()), "n_tokens": pa.int64()},
    version="1",
    batch_size=512,
)
class Encode:
    """Token ids of the input text column (``text``, or the one :func:`encode_udf` names; no
    special tokens) and their count.

    ``spec``, ``vocab_hash`` and ``layout`` (given only when not ``"list"``) are the identity;
    ``_threads`` is run-time (threads per worker).
    """

    def __init__(self, spec: str, vocab_hash: str, _threads: int = 1, layout: str = "list") -> None:
        self.layout = layout
        self.tokenizer = load_tokenizer(spec, num_threads=_threads)
        if self.tokenizer.vocab_hash != vocab_hash:
            raise RuntimeError(
                f"tokenizer {spec!r} changed on disk (vocabulary hash "
                f"{self.tokenizer.vocab_hash[:12]} != {vocab_hash[:12]}) while tokenizing"
            )

    def __call__(self, batch: pa.RecordBatch) -> list:
        ids = self.tokenizer.encode_batch(batch.column(0))  # the one input: the text column
        counts = pc.list_value_length(ids).cast(pa.int64())
        return [to_layout(ids, self.layout), counts]


@dataclass(kw_only=True)
class TokenizeResult:
    """What ``tokenize_table`` added."""

    column: str
    count_column: str
    tokenizer: dict
    version: int | None
    rows: int = 0
    tokens: int = 0
    bytes_added: int = 0
    seconds: float = 0.0
    roundtrip_checked: int = 0
    roundtrip_failed: int = 0
    """Sampled rows whose stored ids do not decode back to their text (all of them counted)."""
    roundtrip_failures: list[dict] = field(default_factory=list)
    """The first few failures, as examples."""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["tokens_per_second"] = round(self.tokens_per_second)
        return out


def encode_udf(  # noqa: ANN201
    spec: str,
    column: str = "input_ids",
    *,
    threads: int = 1,
    layout: str = "list",
    text_column: str = "text",
):
    """The :class:`Encode` UDF for a tokenizer spec, encoding ``text_column`` into ``column``
    (in ``layout``) and its count column."""
    tok = load_tokenizer(spec)
    identity = tok.identity()
    meta = {
        TOKENIZER_META_KEY: json.dumps(identity, sort_keys=True).encode(),
        b"tokenloom.count_column": count_column_for(column).encode(),
        TEXT_COLUMN_META_KEY: text_column.encode(),
    }
    schema = pa.schema(
        [
            layout_field(column, tok.id_type, layout, meta),
            pa.field(count_column_for(column), pa.int64()),
        ]
    )
    extra = {"layout": layout} if layout != "list" else {}  # a list column keeps its identity
    enc = Encode.bind(spec=tok.name, vocab_hash=tok.vocab_hash, _threads=threads, **extra)
    if text_column != "text":  # the text column keeps the UDF's identity as it always was
        enc = enc.with_inputs([text_column])
    return enc.with_output(schema), tok


def tokenize_table(
    uri: str,
    spec: str,
    *,
    column: str = "input_ids",
    workers: int | None = None,
    threads: int = 1,
    roundtrip_sample: int = 256,
    allow_lossy: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, str] | None = None,
    layout: str | None = None,
    text_column: str = "text",
) -> TokenizeResult:
    """Add ``column`` (token ids) and its count column, then check a round-trip sample.

    Args:
        uri: The table.
        spec: Tokenizer spec (see :func:`tokenloom.tokenize.load_tokenizer`).
        column: Name of the ids column.
        workers: Backfill workers.
        threads: Encoding threads inside each worker.
        roundtrip_sample: Rows checked for ``decode(encode(text)) == text``: once before the
            column is computed (a lossy tokenizer is refused before anything is committed), and
            again on the stored ids after.
        storage_options: Object-store options (with the ``AWS_*`` environment).
        allow_lossy: Commit the column even when sampled rows do not round-trip.
        layout: ``"list"`` or ``"bytes"`` (:mod:`tokenloom.table.tokens`); ``None``: the
            existing column's layout, else ``"list"``.
        text_column: The text column encoded (e.g. ``prompt`` into ``prompt_ids`` for the
            image+text loader).

    Raises:
        TokenLayoutError: ``layout`` differs from the existing column's (nothing is changed).
        LossyTokenizerError: A sampled row does not round-trip and ``allow_lossy`` is not set.
        EncodeError: The tokenizer fails on a sampled row (named), before anything is computed.
        UDFError: The tokenizer fails on some row while the column is computed (named).
    """
    from tokenloom.table import Table
    from tokenloom.table.names import validate_column_name

    validate_column_name(column)  # before the tokenizer is loaded
    if layout is not None and layout not in LAYOUTS:
        raise TokenLayoutError(f"token layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    started = time.perf_counter()
    table = Table.open(uri, storage_options=storage_options)
    layout = _layout_for(table.schema(), column, layout)
    if text_column not in table.schema().names:
        raise TokenizerError(
            f"the table has no text column {text_column!r} to tokenize (columns: "
            f"{', '.join(table.schema().names)}); pass --text-column NAME"
        )
    enc, tok = encode_udf(spec, column, threads=threads, layout=layout, text_column=text_column)
    pick = _roundtrip_pick(Table.open(uri, storage_options=storage_options), roundtrip_sample)
    if len(pick) and not allow_lossy:
        sample = Table.open(uri, storage_options=storage_options).dataset.take(
            pick, columns=["id", text_column]
        )
        try:
            failures = roundtrip_failures(
                tok, sample.column(text_column), sample.column("id").to_pylist()
            )
        except EncodeError as exc:
            raise EncodeError(f"{exc} Nothing was committed.", exc.index) from None
        if failures:
            f = failures[0]
            raise LossyTokenizerError(
                f"tokenizer {tok.name!r} is lossy: {len(failures)} of {len(pick)} sampled rows do "
                f"not decode back to their text (row {f.id}, at char {f.position}: "
                f"{f.expected!r} -> {f.got!r}); nothing was committed. Use a lossless "
                "(byte-level) tokenizer, or pass --allow-lossy to store it anyway"
            )
    result = add_column(table, None, enc, workers=workers, progress=progress)
    count_col = count_column_for(column)
    table = table.checkout()
    res = TokenizeResult(
        column=column,
        count_column=count_col,
        tokenizer=tok.identity(),
        version=result.version,
        rows=result.rows,
        bytes_added=result.bytes_added,
    )
    counts = table.dataset.to_table(columns=[count_col]).column(count_col)
    res.tokens = int(pc.sum(counts).as_py() or 0)
    res.seconds = time.perf_counter() - started
    pick = _roundtrip_pick(table, roundtrip_sample)
    if len(pick):
        sample = table.dataset.take(pick, columns=["id", text_column, column])
        failures = roundtrip_failures(
            tok,
            sample.column(text_column),
            sample.column("id").to_pylist(),
            encoded=as_token_lists(sample.column(column), sample.schema.field(column)),
        )
        res.roundtrip_checked = len(pick)
        res.roundtrip_failed = len(failures)
        res.roundtrip_failures = [dataclasses.asdict(f) for f in failures[:_EXAMPLES_KEPT]]
    return res


def _layout_for(schema: pa.Schema, column: str, layout: str | None) -> str:
    """The layout ``column`` is written in: the existing column's (a different one asked for is
    refused: rows of one column are stored one way), else ``layout`` or ``"list"``."""
    if column not in schema.names:
        return layout or "list"
    have = layout_name(schema.field(column))
    if layout is not None and layout != have:
        raise TokenLayoutError(
            f"column {column!r} is stored in the {have!r} token layout, not {layout!r}; write the "
            f"other layout into a new column (`--column {column}_{layout} --layout {layout}`), "
            f"or keep --layout {have}"
        )
    return have


def _roundtrip_pick(table, sample: int) -> np.ndarray:  # noqa: ANN001 - a Table
    """Row positions of the round-trip sample (the same rows before and after the backfill)."""
    n = table.count_rows()
    if not sample or not n:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.random.default_rng(0).choice(n, size=min(n, sample), replace=False))
