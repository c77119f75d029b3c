"""``RowDataset``: the row stream as a torch ``IterableDataset`` (a plain iterable without
torch).

:class:`~tokenloom.rows.dataset.RowStream` is the plan plus its materialiser and imports no
torch, so a :class:`~tokenloom.rows.RowLoader` worker unpickles it without torch; this module is
its face for torch and for users (``RowDataset(spec, rank=r, world_size=w, transform=f)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tokenloom.rows.dataset import RowStream
from tokenloom.rows.transform import RowLoaderError

__all__ = ["RowDataset"]


def _torch_base() -> type:
    try:
        from torch.utils.data import IterableDataset

        return IterableDataset
    except ImportError:  # pragma: no cover - the rows loader works without torch too
        return object


class RowDataset(RowStream, _torch_base()):  # type: ignore[misc]
    __doc__ = RowStream.__doc__

    def __iter__(self) -> Iterator[Any]:
        """Batches of the rest of the current epoch, in this process."""
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
        except ImportError:  # pragma: no cover
            info = None
        if info is not None:
            raise RowLoaderError(
                "a RowDataset inside a torch DataLoader worker would deliver its steps out of "
                "order and lose its cursor; use tokenloom.rows.RowLoader(dataset, num_workers=N) "
                "(or tokenloom.loader.DataLoader), whose workers keep the stream exact"
            )
        return self.batches()
