"""``ImageTextDataset``: the image+text stream (:class:`~tokenloom.vision.dataset.ImageTextStream`)
as a torch ``IterableDataset``. Apart from the stream's module, so that a worker (sent the plain
stream) imports no torch."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import IterableDataset

from tokenloom.vision.dataset import ImageTextStream

__all__ = ["ImageTextDataset"]


class ImageTextDataset(ImageTextStream, IterableDataset):
    """:class:`ImageTextStream` as a torch ``IterableDataset`` (``DataLoader(ds,
    batch_size=None)`` in one process, or :class:`~tokenloom.vision.ImageTextLoader` with
    tokenloom's workers); ``ImageTextDataset(spec, rank=, world_size=, threads=)``."""

    def __iter__(self) -> Iterator[dict]:
        return self.batches()
