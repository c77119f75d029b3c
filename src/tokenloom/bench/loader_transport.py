"""A bench-only prototype of a faster worker->consumer transport for tokenloom's loader.

With DataLoader workers, every torch tensor of a batch is moved into shared memory and its file
descriptor handed to the consumer through a fresh connection to the worker's resource-sharer
thread (an authenticated handshake per tensor: ``rebuild_storage_fd`` -> ``DupFd.detach`` ->
``Client``). tokenloom's batches carry seven tensors, so on a small machine that handshake, not
reading or packing, bounds the throughput. numpy arrays are pickled by value instead (one
``memcpy`` through the pipe). This module measures the difference without touching the loader:
workers return the same arrays as numpy, the consumer wraps them with ``torch.from_numpy``.
It is what ``--only transport`` runs; the fix belongs in :mod:`tokenloom.loader.dataset`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tokenloom.loader import DataLoader, PackedDataset

__all__ = ["NumpyTransportDataset", "NumpyTransportLoader"]


def _as_is(batch: Any) -> Any:
    """collate_fn that leaves numpy arrays alone (the default converts them to tensors)."""
    return batch


class NumpyTransportDataset(PackedDataset):
    """:class:`PackedDataset` whose batches leave a DataLoader worker as numpy arrays."""

    """(The shipped loader now sends numpy from its workers too; kept as the baseline's name.)"""


class NumpyTransportLoader(DataLoader):
    """:class:`DataLoader` that wraps the workers' numpy arrays as tensors (zero-copy)."""

    def __init__(self, dataset: PackedDataset, num_workers: int = 0, **kwargs: Any) -> None:
        if num_workers > 0:
            kwargs.setdefault("collate_fn", _as_is)
        super().__init__(dataset, num_workers=num_workers, **kwargs)

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        for batch in super().__iter__():
            yield {
                k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()
            }
