"""``ImageTextLoader``: a torch DataLoader over an :class:`~tokenloom.vision.ImageTextDataset`
whose workers split each step.

Worker ``k`` of ``K`` builds the ``k``-th contiguous part of every step's blocks (decoding its
images in its own thread pool); torch hands the workers' items out round-robin, in order, so the
loader joins ``K`` consecutive items into the step, identical to what one process builds.
Spawned (or ``forkserver``) workers, ``fork`` refused (Lance is not fork-safe), as for the row
and token loaders. ``state_dict()`` is the exact cursor of batches delivered to the consumer,
with the workers' ledgers added up in the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tokenloom.loader.workers import multiprocessing_context
from tokenloom.process import main_not_rerun
from tokenloom.vision.dataset import _META, ImageTextDataset, ImageTextError, join_parts

__all__ = ["ImageTextLoader", "to_torch"]

_TENSORS = ("input_ids", "labels", "image_mask", "doc_ids", "position_ids", "patches")


def _keep(batch: Any) -> Any:
    """collate_fn of the workers: the part as built."""
    return batch


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
        if num_workers > 0:
            kwargs["multiprocessing_context"] = multiprocessing_context(
                kwargs.get("multiprocessing_context")
            )
            kwargs["collate_fn"] = _keep
            kwargs.setdefault("persistent_workers", False)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)

    def __len__(self) -> int:
        """Steps of the current epoch (torch's own count would be steps x workers: the
        workers' parts)."""
        return self.dataset.steps()  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[dict]:  # type: ignore[override]
        ds: ImageTextDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            yield from iter(ds)
            return
        total = ds.steps()
        with main_not_rerun(True):
            items = super().__iter__()
        parts: list[dict] = []
        for item in items:
            meta = item.pop(_META)
            parts.append(item)
            if len(parts) < self.num_workers:
                continue
            batch = join_parts(parts)
            parts = []
            ds._account(batch)
            ds.delivered(meta["epoch"], meta["step"], total)
            yield batch

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
