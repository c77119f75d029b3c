"""The random-access Parquet baseline: row groups in a seeded random order, packed with numpy.

Each DataLoader worker takes every ``W``-th row group of one random permutation, reads it with
pyarrow, joins its documents with EOS (:func:`~tokenloom.bench.loader_data.packed_stream`),
carries the tail shorter than a batch over to the next row group, and cuts ``(B, L)`` int64
tensors out of the stream with one reshape. There is no shuffling inside a row group, no
resume state and no per-document metadata: it is the floor of "read and pack" with plain tools.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["ParquetBlocks"]


class ParquetBlocks(IterableDataset):
    """``(B, L)`` int64 batches of a Parquet file of ``(id, input_ids)`` rows.

    Args:
        path: The Parquet file.
        seq_len: ``L``.
        batch_size: ``B``.
        eos_id: Separator appended to each document.
        seed: Seed of the row-group order.
        epoch: Epoch number (a fresh order per epoch).
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
        storage_options: dict | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eos_id = eos_id
        self.seed = seed
        self.epoch = epoch
        self.storage_options = storage_options or {}

    def __iter__(self) -> Iterator[torch.Tensor]:
        from tokenloom.bench.loader_data import packed_stream

        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pf = self._open()
        order = np.random.default_rng([self.seed, self.epoch]).permutation(pf.num_row_groups)
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

    def _open(self) -> pq.ParquetFile:
        from tokenloom.table.storage import filesystem, is_remote

        if not is_remote(self.path):
            return pq.ParquetFile(self.path, memory_map=True)
        fs, path = filesystem(self.path, self.storage_options)  # S3: endpoint_override
        return pq.ParquetFile(fs.open_input_file(path))
