"""``ImageTextLoader``: a torch DataLoader over an :class:`~tokenloom.vision.ImageTextDataset`
on tokenloom's own workers, which split each step.

The workers are :class:`~tokenloom.loader.pipeline.workers.WorkerPool` processes (spawned, or
``forkserver``; ``fork`` refused: Lance is not fork-safe; no ``__main__`` guard needed; they
import no torch), each sending its parts' arrays through a shared-memory ring
(:mod:`~tokenloom.loader.pipeline.transit`). Worker ``k`` of ``K`` builds the ``k``-th
contiguous part of every step's blocks (decoding its images in its own thread pool); the pool hands
the workers' parts out round-robin, in order, so the loader joins ``K`` consecutive parts into the
step, identical to what one process builds. ``state_dict()`` is the exact cursor of batches
delivered to the consumer, with the workers' ledgers added up in the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tokenloom.loader.pipeline.transit import Rings
from tokenloom.loader.pipeline.workers import WorkerPool, multiprocessing_context
from tokenloom.vision.dataset import ImageTextError, join_parts
from tokenloom.vision.iterable import ImageTextDataset

__all__ = ["ImageTextLoader", "to_torch"]

_TENSORS = ("input_ids", "labels", "image_mask", "doc_ids", "position_ids", "patches")


def to_torch(batch: dict) -> dict:
    """A batch's arrays as tensors (``row_ids`` and the counts stay as they are)."""
    out = dict(batch)
    for key in _TENSORS:
        out[key] = torch.from_numpy(batch[key])
    return out


class ImageTextLoader(torch.utils.data.DataLoader):
    """A DataLoader over an :class:`ImageTextDataset` (see the module docstring)."""

    def __init__(self, dataset: ImageTextDataset, num_workers: int = 0, **kwargs: Any) -> None:
        for bad in ("shuffle", "sampler", "batch_size"):
            if kwargs.get(bad):
                raise ImageTextError(
                    f"ImageTextLoader({bad}=...) does not apply: the dataset shuffles every "
                    "epoch from its seed and yields whole steps of global_batch / world_size "
                    "blocks"
                )
            kwargs.pop(bad, None)
        if kwargs.get("persistent_workers"):
            raise ImageTextError(
                "ImageTextLoader(persistent_workers=True) is not supported: each pass starts "
                "its workers from the dataset's cursor (drop persistent_workers)"
            )
        if num_workers > 0:
            kwargs["multiprocessing_context"] = multiprocessing_context(
                kwargs.get("multiprocessing_context")
            )
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self.worker_pool: WorkerPool | None = None
        """The workers of the current (or last) pass."""

    def __len__(self) -> int:
        """Steps of the current epoch."""
        return self.dataset.steps()  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[dict]:  # type: ignore[override]
        ds: ImageTextDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            yield from ds.batches()
            return
        total = ds.steps()
        pool = WorkerPool.of_loader(self, ds.detached())
        self.worker_pool = pool
        it = iter(pool)
        rings = Rings()  # each worker's shared-memory ring
        parts: list[dict] = []
        try:
            for message in it:
                part = dict(rings.settle(message).batch)
                part.update(message.extra)
                parts.append(part)
                if len(parts) < self.num_workers:
                    continue
                batch = join_parts(parts)
                parts = []
                ds._account(batch)
                ds.delivered(message.epoch, message.first, total)
                pool.check()  # a dead worker is noticed here, not when its pipe runs dry
                yield batch
        finally:
            it.close()

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
