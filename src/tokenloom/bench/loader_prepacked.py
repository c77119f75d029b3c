"""The pre-packed Lance blocks baseline: the corpus shuffled, joined with EOS and cut into blocks
once, written as a Lance table of one block per row, then read sequentially.

This is what "pack offline, read the packed copy" costs with the same storage layer tokenloom
reads: no plan, no per-document metadata, no labels or segment fields, no reshuffle without a
rebuild. The build follows the MDS copy's (:func:`~tokenloom.bench.loader_data.build_mds`): a
seeded permutation of the documents, joined with one EOS after each, the tail shorter than a block
left out. Each of ``W`` DataLoader workers scans its contiguous share of the rows, 256 rows per
read, and yields ``(B, L)`` int64 tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from tokenloom.bench.loader_data import (
    EOS_ID,
    Built,
    CorpusSpec,
    _cached,
    corpus_chunks,
    packed_stream,
)

__all__ = ["build_prepacked", "PrepackedBlocks", "prepacked_batches"]

_READ_ROWS = 256  # rows per scan batch (as tokenloom's take groups)
_CHUNK_DOCS = 16384


def _blocks(spec: CorpusSpec, seq_len: int) -> Iterator[np.ndarray]:
    """``(n, L)`` uint16 blocks of the shuffled stream, chunk by chunk (the corpus in memory)."""
    lens_all, parts = [], []
    for _first, lens, values in corpus_chunks(spec):
        lens_all.append(lens)
        parts.append(values)
    lens = np.concatenate(lens_all)
    values = np.concatenate(parts)
    del parts
    starts = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    order = np.random.default_rng([spec.seed, 2]).permutation(lens.shape[0])
    carry = np.empty(0, dtype=np.uint16)
    for lo in range(0, order.shape[0], _CHUNK_DOCS):
        docs = order[lo : lo + _CHUNK_DOCS]
        seg = lens[docs]
        out_start = np.repeat(np.cumsum(seg) - seg, seg)
        src = np.arange(int(seg.sum())) - out_start + np.repeat(starts[docs], seg)
        stream = np.concatenate([carry, packed_stream(values[src], seg, eos_id=EOS_ID)])
        n = stream.shape[0] // seq_len
        yield stream[: n * seq_len].reshape(n, seq_len)
        carry = stream[n * seq_len :]


def build_prepacked(path: str, spec: CorpusSpec, *, seq_len: int, rebuild: bool = False) -> Built:
    """The pre-packed copy as a Lance table ``input_ids: fixed_size_list<uint16>[seq_len]``."""

    def build(out: str) -> tuple[int, int]:
        import lance

        schema = pa.schema([("input_ids", pa.list_(pa.uint16(), seq_len))])
        count = [0]

        def batches() -> Iterator[pa.RecordBatch]:
            for blocks in _blocks(spec, seq_len):
                count[0] += blocks.shape[0]
                flat = pa.array(blocks.reshape(-1))
                yield pa.record_batch([pa.FixedSizeListArray.from_arrays(flat, seq_len)], schema)

        reader = pa.RecordBatchReader.from_batches(schema, batches())
        lance.write_dataset(reader, out, schema=schema, max_rows_per_file=1 << 20)
        return spec.docs, count[0] * seq_len  # positions stored, EOS included

    return _cached(path, spec, build, rebuild=rebuild)


class PrepackedBlocks(IterableDataset):
    """``(B, L)`` int64 batches of a pre-packed blocks table; worker ``w`` of ``W`` scans rows
    ``[w * n / W, (w + 1) * n / W)`` in order (the copy is already shuffled)."""

    def __init__(self, path: str, *, batch_size: int) -> None:
        super().__init__()
        self.path = path
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Any]:
        import lance

        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        ds = lance.dataset(self.path)
        n = ds.count_rows()
        lo, hi = n * wid // workers, n * (wid + 1) // workers
        B = self.batch_size
        for batch in ds.to_batches(
            columns=["input_ids"], batch_size=_READ_ROWS, offset=lo, limit=hi - lo
        ):
            col = batch.column(0)
            L = col.type.list_size
            blocks = col.values.to_numpy().reshape(-1, L)  # (rows, L) uint16, zero-copy
            for i in range(0, blocks.shape[0] - B + 1, B):
                yield torch.from_numpy(blocks[i : i + B].astype(np.int64))  # (B, L)


def prepacked_batches(spec: Any, notes: Any) -> Iterator[Any]:
    """The bench source: :class:`PrepackedBlocks` through one torch DataLoader, its workers
    spawned and kept from one epoch to the next (the copy's order is the same every epoch)."""
    from torch.utils.data import DataLoader

    from tokenloom.bench.loader_cases import worker_args

    ds = PrepackedBlocks(spec.path, batch_size=spec.batch_size)
    args = worker_args(spec.workers, kept=True)
    dl = DataLoader(ds, batch_size=None, num_workers=spec.workers, **args)
    while True:
        yield from dl
