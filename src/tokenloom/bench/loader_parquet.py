"""The Parquet baselines: whole row groups (in a seeded random order, or in file order) or
single rows in a global random order, packed with numpy.

:class:`ParquetBlocks`: each DataLoader worker takes every ``W``-th row group of one random
permutation (``order="random"``) or of the file order (``order="sequential"``: the file in
document order, or the pre-shuffled file), reads it with pyarrow, joins its documents with EOS
(:func:`~tokenloom.bench.loader_data.packed_stream`), carries the tail shorter than a batch over
to the next row group, and cuts ``(B, L)`` int64 tensors out of the stream with one reshape.
There is no shuffling inside a row group, no resume state and no per-document metadata: it is
the floor of "read and pack" with plain tools.

:class:`ParquetRows`: every document fetched by itself in one global random order — the access
pattern of a row-level shuffle. Parquet has no cheaper way to one row than decoding the column
chunk of its row group (``read_row_group`` + ``slice``; ``pyarrow.dataset.take`` of one row
measured ~20x slower here), so each document costs a row group's decode (on an object store, a
ranged GET of that column chunk). With ``threads > 1`` that many documents are fetched at once
(each thread with its own file handle), and handed out in the same order.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["ParquetBlocks", "ParquetRows", "ORDERS", "open_parquet"]

ORDERS = ("random", "sequential")
"""Row-group orders of :class:`ParquetBlocks`."""


def open_parquet(path: str, storage_options: dict) -> pq.ParquetFile:
    """A local file memory-mapped, an object-store one through ``pyarrow.fs`` (S3:
    ``endpoint_override`` from the storage options)."""
    from tokenloom.table.storage import filesystem, is_remote

    if not is_remote(path):
        return pq.ParquetFile(path, memory_map=True)
    fs, inner = filesystem(path, storage_options)
    return pq.ParquetFile(fs.open_input_file(inner))


class ParquetBlocks(IterableDataset):
    """``(B, L)`` int64 batches of a Parquet file of ``(id, input_ids)`` rows.

    Args:
        path: The Parquet file.
        seq_len: ``L``.
        batch_size: ``B``.
        eos_id: Separator appended to each document.
        seed: Seed of the row-group order.
        epoch: Epoch number (a fresh order per epoch).
        order: ``"random"`` (a seeded permutation of the row groups) or ``"sequential"``.
        storage_options: Options of an object-store ``path`` (read through ``pyarrow.fs``).
    """

    def __init__(
        self,
        path: str,
        *,
        seq_len: int,
        batch_size: int,
        eos_id: int,
        seed: int = 0,
        epoch: int = 0,
        order: str = "random",
        storage_options: dict | None = None,
    ) -> None:
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.path = path
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eos_id = eos_id
        self.seed = seed
        self.epoch = epoch
        self.order = order
        self.storage_options = storage_options or {}

    def __iter__(self) -> Iterator[torch.Tensor]:
        from tokenloom.bench.loader_data import packed_stream

        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pf = open_parquet(self.path, self.storage_options)
        if self.order == "random":
            order = np.random.default_rng([self.seed, self.epoch]).permutation(pf.num_row_groups)
        else:
            order = np.arange(pf.num_row_groups)
        per_batch = self.batch_size * self.seq_len
        carry = np.empty(0, dtype=np.uint16)
        for rg in order[wid::workers]:
            col = pf.read_row_group(int(rg), columns=["input_ids"]).column(0)
            values = pc.list_flatten(col).to_numpy()  # (T,) uint16
            lengths = pc.list_value_length(col).to_numpy()  # (n,)
            stream = np.concatenate([carry, packed_stream(values, lengths, eos_id=self.eos_id)])
            n = stream.shape[0] // per_batch
            batches = stream[: n * per_batch].reshape(n, self.batch_size, self.seq_len)
            for batch in batches:
                yield torch.from_numpy(batch.astype(np.int64))  # (B, L)
            carry = stream[n * per_batch :]


class ParquetRows(ParquetBlocks):
    """``(B, L)`` int64 batches of a Parquet file, each document read alone, in one seeded
    global random order of the rows (worker ``w`` of ``W`` takes every ``W``-th of it).

    Args: as :class:`ParquetBlocks` (``order`` is not used: the rows are always shuffled), and
        ``threads``: documents fetched at once (1: one after another).
    """

    def __init__(self, path: str, *, threads: int = 1, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pf = open_parquet(self.path, self.storage_options)
        meta = pf.metadata
        first_row = np.zeros(meta.num_row_groups + 1, dtype=np.int64)  # (G + 1,)
        np.cumsum(
            [meta.row_group(g).num_rows for g in range(meta.num_row_groups)], out=first_row[1:]
        )
        rows = np.random.default_rng([self.seed, self.epoch]).permutation(int(first_row[-1]))
        per_batch = self.batch_size * self.seq_len
        eos = np.array([self.eos_id], dtype=np.uint16)
        parts: list[np.ndarray] = []
        held = 0
        handles = threading.local()

        def read(row: int) -> np.ndarray:
            f = pf if self.threads == 1 else getattr(handles, "pf", None)
            if f is None:  # a file handle per thread: one is not safe to share
                f = handles.pf = open_parquet(self.path, self.storage_options)
            group = int(np.searchsorted(first_row, row, side="right")) - 1
            col = f.read_row_group(group, columns=["input_ids"]).column(0)
            return pc.list_flatten(col.slice(int(row - first_row[group]), 1)).to_numpy()

        for doc in _in_order(read, rows[wid::workers].tolist(), self.threads):
            parts += [doc, eos]
            held += doc.shape[0] + 1
            if held >= per_batch:
                stream = np.concatenate(parts)
                n = stream.shape[0] // per_batch
                for batch in stream[: n * per_batch].reshape(n, self.batch_size, self.seq_len):
                    yield torch.from_numpy(batch.astype(np.int64))  # (B, L)
                parts, held = [stream[n * per_batch :]], stream.shape[0] - n * per_batch


def _in_order(fn: Any, items: list[int], threads: int) -> Iterator[Any]:
    """``fn(item)`` of every item, in order, computed ``threads`` at a time (at most
    ``2 * threads`` ahead of the consumer)."""
    if threads == 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="parquet-rows") as pool:
        ahead: deque[Future] = deque()
        it = iter(items)
        for item in it:
            ahead.append(pool.submit(fn, item))
            if len(ahead) >= 2 * threads:
                break
        while ahead:
            out = ahead.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                ahead.append(pool.submit(fn, nxt))
            yield out
