"""The read bound's takes in DataLoader workers (``read-bound`` with ``workers > 0``).

The same plain take as in-process (:func:`tokenloom.bench.loader_cases.read_bound_batches`):
the selected rows in a fresh random order each epoch, sorted rows per take through tokenloom's
reader, each take's token lists flattened into one int64 tensor. Worker ``w`` of ``n`` takes
every ``n``-th take of the epoch's order, epochs one after another without restarting, and
writes its flattened tokens straight into a shared-memory tensor (one pass: the cast to int64
is the copy torch would make anyway to hand a tensor across processes). The training process
receives one tensor per take and cuts the ``(B, L)`` batches from it, as in-process. Imported
only when such a case runs (torch at import).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["BoundTakes", "bound_order", "flat_take", "worker_takes"]


def bound_order(rowids: np.ndarray, epoch: int) -> np.ndarray:
    """The read bound's fresh random order of ``rowids`` for ``epoch`` (every process alike)."""
    return rowids[np.random.default_rng([epoch, 7]).permutation(len(rowids))]


def flat_take(reader, ids: np.ndarray) -> np.ndarray:  # noqa: ANN001 - a TokenReader
    """One plain take of ``ids`` (sorted first) through ``reader``: the rows' token lists
    flattened, as stored (a view of the taken values: no copy, no cast)."""
    from tokenloom.table.tokens import token_lists

    lists = token_lists(reader._take(np.sort(ids))[0], reader.field)  # (tokens, no mask)
    return lists.values[lists.offsets[0] : lists.offsets[-1]]


class BoundTakes(IterableDataset):
    """Flattened takes of ``rowids`` (``take_rows`` per take), epoch after epoch, forever."""

    def __init__(self, reader, rowids: np.ndarray, take_rows: int) -> None:
        self.reader = reader  # a TokenReader: its Lance handle is opened in each worker
        self.rowids = rowids
        self.take_rows = take_rows

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        me, every = (info.id, info.num_workers) if info is not None else (0, 1)
        k = self.take_rows
        epoch = 0
        while True:
            order = bound_order(self.rowids, epoch)
            for lo in range(me * k, len(order), every * k):
                ids = order[lo : lo + k]
                values = flat_take(self.reader, ids)
                flat = torch.empty(len(values), dtype=torch.int64).share_memory_()
                flat.numpy()[:] = values  # the cast, into the shared pages
                yield flat, len(ids)
            epoch += 1


def worker_takes(reader, rowids: np.ndarray, take_rows: int, workers: int) -> Iterator:
    """The flattened takes, ``(tensor, rows)`` each, from ``workers`` spawned DataLoader
    workers (Lance is not fork-safe)."""
    dl = DataLoader(
        BoundTakes(reader, rowids, take_rows),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="spawn",
        prefetch_factor=2,
    )
    it = iter(dl)
    try:
        yield from it
    finally:
        it._shutdown_workers()
