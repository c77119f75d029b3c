"""Synthetic token corpora for the loader benchmark, and the baselines' copies of them.

Everything is a deterministic function of ``(docs, seed)``: the document lengths are lognormal
(median 450, mean 800 tokens, clipped to ``[1, 50_000]``) and the token ids uniform below the EOS
id. The same documents are written as

* a tokenloom table (base columns + ``input_ids`` list<uint16> + ``n_tokens``), which LanceDB's
  ``StreamingDataset`` reads too,
* Parquet files with row groups of ~1k rows: documents in id order (the random-access and
  in-order baselines) and in a seeded random order (the pre-shuffled baseline),
* pre-packed MosaicML MDS copies (blocks of ``seq_len`` tokens): pre-shuffled, and in id order
  for MDS's own shuffle,
* pre-packed, pre-shuffled WebDataset tar shards (the same blocks as the shuffled MDS copy),

and a second table of a few multi-million-token documents tests the long-document path. Builds
are cached under the work dir; a ``.done.json`` marker written last makes a killed build rerun.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

__all__ = [
    "CorpusSpec",
    "Built",
    "EOS_ID",
    "VOCAB_SIZE",
    "doc_lengths",
    "corpus_chunks",
    "packed_stream",
    "build_table",
    "build_parquet",
    "build_mds",
    "build_webdataset",
    "packed_blocks",
    "shuffled_order",
]

VOCAB_SIZE = 50257
"""GPT-2's vocabulary size; ids ``0 .. VOCAB_SIZE - 2`` are text, the last one is EOS."""
EOS_ID = 50256
"""EOS and padding id (as GPT-2); never drawn as a text token, so a stream can be checked."""
DATA_RECIPE = "v2"
"""Bumped when the generation recipe changes, so stale caches are not reused (v2: the table's
own metadata moved out of the schema level, where LanceDB's reader panicked on it)."""

_CHUNK_DOCS = 16384  # documents generated per RNG chunk (~13M tokens, ~26 MB as uint16)
_ROWS_PER_FRAGMENT = 131072  # as ingest: modest fragments
_PARQUET_ROW_GROUP = 1024


@dataclass(frozen=True, kw_only=True)
class CorpusSpec:
    """Which synthetic corpus to build."""

    docs: int
    """Number of documents."""
    seed: int = 0
    """Seed of lengths and token ids."""
    median: float = 450.0
    """Median document length (tokens) of the lognormal; ignored when ``fixed_len`` is set."""
    mean: float = 800.0
    """Mean document length (tokens) of the lognormal, before clipping."""
    max_len: int = 50_000
    """Lengths are clipped to ``[1, max_len]``."""
    fixed_len: int | None = None
    """Give every document exactly this many tokens (the long-document table)."""
    layout: str = "list"
    """How the table stores the ids (:mod:`tokenloom.table.tokens`; the table copy only)."""

    def __post_init__(self) -> None:
        if self.docs < 1:
            raise ValueError(f"docs must be >= 1, got {self.docs}")
        if self.fixed_len is None and not 0 < self.median <= self.mean:
            raise ValueError(f"need 0 < median <= mean, got {self.median}, {self.mean}")

    @property
    def name(self) -> str:
        """A file-name stem that changes with every input of the recipe."""
        if self.fixed_len is not None:
            return f"long-{DATA_RECIPE}-d{self.docs}-n{self.fixed_len}-s{self.seed}"
        return (
            f"corpus-{DATA_RECIPE}-d{self.docs}-m{self.median:g}-a{self.mean:g}"
            f"-x{self.max_len}-s{self.seed}" + (f"-{self.layout}" if self.layout != "list" else "")
        )


@dataclass(frozen=True, kw_only=True)
class Built:
    """A built (or reused) artefact and what it cost."""

    path: str
    seconds: float
    """Build time of the artefact (as recorded when it was built)."""
    cached: bool
    """True when this run reused an earlier build."""
    docs: int
    tokens: int
    """Real tokens (EOS excluded); for the pre-packed copies, positions stored (EOS included)."""
    mbytes: float
    """Size on disk (MB)."""


def doc_lengths(spec: CorpusSpec) -> np.ndarray:
    """Token count of every document.

    Returns:
        ``(docs,)`` int64 in ``[1, max_len]``: lognormal with ``mu = ln(median)`` and
        ``sigma = sqrt(2 ln(mean / median))`` (so the unclipped mean is ``mean``).
    """
    if spec.fixed_len is not None:
        return np.full(spec.docs, int(spec.fixed_len), dtype=np.int64)
    mu = math.log(spec.median)
    sigma = math.sqrt(2.0 * math.log(spec.mean / spec.median))
    rng = np.random.default_rng([spec.seed, 0])
    lens = np.rint(rng.lognormal(mu, sigma, spec.docs))
    return np.clip(lens, 1, spec.max_len).astype(np.int64)


def corpus_chunks(
    spec: CorpusSpec, *, chunk_docs: int = _CHUNK_DOCS
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The corpus in chunks of documents, identical on every call.

    Yields:
        ``(first_id, lengths, values)``: ``lengths`` ``(n,)`` int64 of documents
        ``first_id .. first_id + n - 1``, and ``values`` ``(lengths.sum(),)`` uint16 token ids
        ``< EOS_ID``, concatenated.
    """
    lens = doc_lengths(spec)
    for k, lo in enumerate(range(0, spec.docs, chunk_docs)):
        part = lens[lo : lo + chunk_docs]
        rng = np.random.default_rng([spec.seed, 1, k])
        yield lo, part, rng.integers(0, EOS_ID, int(part.sum()), dtype=np.uint16)


def packed_stream(values: np.ndarray, lengths: np.ndarray, *, eos_id: int) -> np.ndarray:
    """Documents joined with one EOS after each (vectorised, no per-document loop).

    Args:
        values: ``(T,)`` token ids of the documents, concatenated.
        lengths: ``(n,)`` tokens of each document (``lengths.sum() == T``).
        eos_id: The separator.

    Returns:
        ``(T + n,)`` array of ``values.dtype``: doc 0, EOS, doc 1, EOS, ...
    """
    n = lengths.shape[0]
    eos_at = np.cumsum(lengths) + np.arange(n)  # (n,) where each EOS lands
    out = np.empty(values.shape[0] + n, dtype=values.dtype)
    is_tok = np.ones(out.shape[0], dtype=bool)
    is_tok[eos_at] = False
    out[is_tok] = values
    out[eos_at] = eos_id
    return out


def _dir_mbytes(path: str) -> float:
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e6


def _cached(
    path: str, spec: CorpusSpec, build: Callable[[str], tuple[int, int]], *, rebuild: bool
) -> Built:
    """Reuse ``path`` when its marker is there, else (re)build it and write the marker last."""
    marker = path + ".done.json"
    if os.path.exists(marker) and os.path.exists(path) and not rebuild:
        with open(marker) as f:
            meta = json.load(f)
        meta.pop("spec", None)
        return Built(path=path, cached=True, **meta)
    for stale in (marker, path):
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.remove(stale)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    started = time.perf_counter()
    docs, tokens = build(path)
    meta = {
        "seconds": round(time.perf_counter() - started, 3),
        "docs": docs,
        "tokens": tokens,
        "mbytes": round(_dir_mbytes(path), 1),
    }
    with open(marker + ".tmp", "w") as f:
        json.dump({**meta, "spec": asdict(spec)}, f)
    os.replace(marker + ".tmp", marker)
    return Built(path=path, cached=False, **meta)


def _table_schema(layout: str = "list") -> pa.Schema:
    from tokenloom.table import BASE_SCHEMA
    from tokenloom.table.tokens import layout_field

    tokenizer = {
        "name": "synthetic",
        "vocab_size": VOCAB_SIZE,
        "eos_id": EOS_ID,
        "pad_id": EOS_ID,
        "bos_id": None,
        "vocab_hash": "synthetic",
    }
    meta = {b"tokenloom.tokenizer": json.dumps(tokenizer).encode()}
    return pa.schema(
        [
            *BASE_SCHEMA,
            layout_field("input_ids", pa.uint16(), layout, meta),
            pa.field("n_tokens", pa.int64()),
        ],
    )


def _record_batches(spec: CorpusSpec, schema: pa.Schema, rows: int) -> Iterator[pa.RecordBatch]:
    from tokenloom.table.tokens import to_layout

    for first, lens, values in corpus_chunks(spec, chunk_docs=rows):
        n = lens.shape[0]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        texts = [f"doc {first + i}" for i in range(n)]  # placeholders: loaders read tokens only
        yield pa.record_batch(
            [
                pa.array(np.arange(first, first + n, dtype=np.int64)),
                pa.array(texts, type=pa.large_string()),
                pa.array(["synthetic"] * n, type=pa.string()),
                pa.array([len(t) for t in texts], type=pa.int64()),
                pa.array(["{}"] * n, type=pa.string()),
                to_layout(
                    pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)), spec.layout
                ),
                pa.array(lens),
            ],
            schema=schema,
        )


def build_table(path: str, spec: CorpusSpec, *, rebuild: bool = False) -> Built:
    """The corpus as a tokenloom table (one ``bench`` commit after ``Table.create``).

    The token columns are written in the same fragments as the base columns, so the commit is
    an ``Overwrite`` carrying the full schema (an ``Append`` must match the table's schema).
    """

    def build(uri: str) -> tuple[int, int]:
        import lance
        from lance.fragment import write_fragments

        from tokenloom.table import NEXT_ID_KEY, Table

        table = Table.create(uri)
        schema = _table_schema(spec.layout)
        # Long documents are 4 MB rows: keep batches small so memory stays bounded.
        rows = 4 if spec.fixed_len and spec.fixed_len > 100_000 else 8192
        reader = pa.RecordBatchReader.from_batches(schema, _record_batches(spec, schema, rows))
        frags = write_fragments(
            reader, uri, schema=schema, mode="overwrite", max_rows_per_file=_ROWS_PER_FRAGMENT
        )
        tokens = int(doc_lengths(spec).sum())
        table.commit(
            lance.LanceOperation.Overwrite(schema, frags),
            op="bench",
            message=f"synthetic loader-bench corpus: {spec.docs} docs, {tokens} tokens",
            properties={NEXT_ID_KEY: str(spec.docs), "tokenloom.bench_corpus": asdict(spec)},
        )
        return spec.docs, tokens

    return _cached(path, spec, build, rebuild=rebuild)


def _corpus_in_memory(spec: CorpusSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths (docs,), values (T,) uint16, starts (docs + 1,))`` of the whole corpus
    (2 bytes per token)."""
    lens_all, parts = [], []
    for _first, lens, values in corpus_chunks(spec):
        lens_all.append(lens)
        parts.append(values)
    lens = np.concatenate(lens_all)
    starts = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    return lens, np.concatenate(parts), starts


def shuffled_order(spec: CorpusSpec) -> np.ndarray:
    """The seeded document order of the pre-shuffled copies, shape ``(docs,)``."""
    return np.random.default_rng([spec.seed, 2]).permutation(spec.docs)


def _documents(
    spec: CorpusSpec, *, shuffled: bool
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Chunks ``(ids (n,), lengths (n,), values (lengths.sum(),) uint16)`` in id order, or in
    :func:`shuffled_order` (then the whole corpus is held in memory)."""
    if not shuffled:
        for first, lens, values in corpus_chunks(spec):
            yield np.arange(first, first + lens.shape[0], dtype=np.int64), lens, values
        return
    lens, values, starts = _corpus_in_memory(spec)
    order = shuffled_order(spec)
    for lo in range(0, order.shape[0], _CHUNK_DOCS):
        docs = order[lo : lo + _CHUNK_DOCS]
        # (m,) gather of the chosen documents' tokens, in visiting order
        seg = lens[docs]
        out_start = np.repeat(np.cumsum(seg) - seg, seg)
        src = np.arange(int(seg.sum())) - out_start + np.repeat(starts[docs], seg)
        yield docs.astype(np.int64), seg, values[src]


def packed_blocks(spec: CorpusSpec, *, seq_len: int, shuffled: bool) -> Iterator[np.ndarray]:
    """The documents (in id order or :func:`shuffled_order`) joined with EOS and cut into
    blocks; the tail shorter than a block is left out.

    Yields:
        ``(n, seq_len)`` uint16 arrays, consecutive blocks of the one stream.
    """
    carry = np.empty(0, dtype=np.uint16)
    for _ids, lens, values in _documents(spec, shuffled=shuffled):
        stream = np.concatenate([carry, packed_stream(values, lens, eos_id=EOS_ID)])
        n = stream.shape[0] // seq_len
        yield stream[: n * seq_len].reshape(n, seq_len)
        carry = stream[n * seq_len :]


def build_parquet(
    path: str, spec: CorpusSpec, *, shuffled: bool = False, rebuild: bool = False
) -> Built:
    """The same documents as ``(id, input_ids)`` in Parquet, row groups of ~1k rows, in id
    order or (``shuffled``) in :func:`shuffled_order`."""

    def build(out: str) -> tuple[int, int]:
        import pyarrow.parquet as pq

        schema = pa.schema([("id", pa.int64()), ("input_ids", pa.list_(pa.uint16()))])
        tokens = 0
        with pq.ParquetWriter(out + ".tmp", schema, compression="none") as writer:
            for ids, lens, values in _documents(spec, shuffled=shuffled):
                offsets = np.zeros(lens.shape[0] + 1, dtype=np.int32)
                np.cumsum(lens, out=offsets[1:])
                lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
                table = pa.table([pa.array(ids), lists], schema=schema)
                writer.write_table(table, row_group_size=_PARQUET_ROW_GROUP)
                tokens += int(lens.sum())
        os.replace(out + ".tmp", out)
        return spec.docs, tokens

    return _cached(path, spec, build, rebuild=rebuild)


def build_mds(
    path: str, spec: CorpusSpec, *, seq_len: int, shuffled: bool = True, rebuild: bool = False
) -> Built:
    """A pre-packed MDS copy: :func:`packed_blocks` (pre-shuffled by default; in id order for
    MDS's own shuffle), one sample per block. Holds the corpus in memory when ``shuffled``."""

    def build(out: str) -> tuple[int, int]:
        from tokenloom.bench.loader_mds import mds_writer

        blocks = 0
        with mds_writer(out, seq_len=seq_len) as writer:
            for chunk in packed_blocks(spec, seq_len=seq_len, shuffled=shuffled):
                for block in chunk:
                    writer.write({"input_ids": block})
                blocks += chunk.shape[0]
        return spec.docs, blocks * seq_len  # positions stored, EOS included

    return _cached(path, spec, build, rebuild=rebuild)


def build_webdataset(path: str, spec: CorpusSpec, *, seq_len: int, rebuild: bool = False) -> Built:
    """Pre-packed, pre-shuffled WebDataset tar shards: the blocks of the shuffled MDS copy, one
    sample each (see :mod:`~tokenloom.bench.loader_webdataset`)."""

    def build(out: str) -> tuple[int, int]:
        from tokenloom.bench.loader_webdataset import write_shards

        blocks = write_shards(out, packed_blocks(spec, seq_len=seq_len, shuffled=True))
        return spec.docs, blocks * seq_len  # positions stored, EOS included

    return _cached(path, spec, build, rebuild=rebuild)
