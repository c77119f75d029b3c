"""``RowLoader``: a torch DataLoader over a :class:`~tokenloom.rows.RowDataset`.

Spawned (or ``forkserver``) workers, ``fork`` refused (Lance is not fork-safe), that do not
run the script again (no ``__main__`` guard needed, as for the packed loader:
:func:`tokenloom.process.main_not_rerun`),
``batch_size=None`` (the dataset yields whole batches), a ``state_dict()`` that is the exact
cursor of batches *delivered to the consumer*, and the workers' skip counts added up in the
dataset. With ``persistent_workers=True`` the workers are kept between epochs: a worker whose
pass ran to its end moves its own copy of the cursor to the next epoch's start, which is where
the training process's cursor is after a whole pass; a pass left before its end, ``set_epoch``
or ``load_state_dict`` elsewhere start new workers from the training process's cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tokenloom.loader.workers import multiprocessing_context
from tokenloom.process import defined_in_main, main_not_rerun
from tokenloom.rows.dataset import _META, RowDataset
from tokenloom.rows.transform import RowLoaderError, to_format

__all__ = ["RowLoader"]


def _keep(batch: Any) -> Any:
    """collate_fn of the workers: the batch as built."""
    return batch


class RowLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`RowDataset` whose state is the consumer's exact cursor."""

    def __init__(self, dataset: RowDataset, num_workers: int = 0, **kwargs: Any) -> None:
        for bad in ("shuffle", "sampler", "batch_size"):
            if kwargs.get(bad):
                raise RowLoaderError(
                    f"RowLoader({bad}=...) does not apply: a RowDataset shuffles every epoch "
                    "from its seed and yields whole batches of global_batch / world_size rows"
                )
            kwargs.pop(bad, None)
        if num_workers > 0:  # spawn by default, forkserver too; fork refused (Lance)
            kwargs["multiprocessing_context"] = multiprocessing_context(
                kwargs.get("multiprocessing_context")
            )
            kwargs.setdefault("collate_fn", _keep)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self._workers_at: tuple[int, int] | None = None
        """With persistent workers: the cursor their copies hold (after a whole pass)."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds: RowDataset = self.dataset  # type: ignore[assignment]
        if self.num_workers == 0:
            yield from iter(ds)
            return
        total = len(ds)
        kept = getattr(self, "_iterator", None)
        if self.persistent_workers and kept is not None and self._workers_at != ds.cursor:
            # the kept workers would start where their last pass ended: start new ones
            kept._shutdown_workers()
            self._iterator = None
        self._workers_at = None
        # torch starts the workers when the iterator is made; a transform (or init/collate
        # function) defined in the script can only reach them by running the script again.
        uses_main = defined_in_main(ds.transform, self.worker_init_fn, self.collate_fn)
        with main_not_rerun(not uses_main):
            items = super().__iter__()
        for item in items:
            meta = item[_META]
            ds.skipped.update(meta["skipped"])
            ds.refills += meta["refills"]
            ds.delivered(meta["epoch"], meta["step"], total)
            batch = item["batch"]
            if ds.format == "torch":
                batch = to_format(batch, batch["row_id"], "torch")
            yield batch
        self._workers_at = ds.cursor  # every worker ran its pass to the end, as the cursor

    def close(self) -> None:
        """Stop the workers kept between passes (``persistent_workers``)."""
        kept = getattr(self, "_iterator", None)
        if kept is not None:
            kept._shutdown_workers()
            self._iterator = None

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
