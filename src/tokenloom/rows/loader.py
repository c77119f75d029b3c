"""``RowLoader``: a torch DataLoader over a :class:`~tokenloom.rows.RowDataset`.

Its workers are tokenloom's own (:class:`~tokenloom.loader.pipeline.workers.WorkerPool`, as the
packed loader's): spawned (or ``forkserver``) processes, ``fork`` refused (Lance is not fork-safe),
that do not run the script again unless the transform (or ``worker_init_fn``) is defined in it (no
``__main__`` guard needed: :func:`tokenloom.process.main_not_rerun`) and import no torch; each
builds its steps and sends their arrays through a shared-memory ring
(:mod:`~tokenloom.loader.pipeline.transit`). A dead worker is reported within a step with its
exit code and signal; a training process killed outright takes its workers along.
``batch_size=None`` (the dataset yields whole batches), a ``state_dict()`` that is the exact cursor
of batches *delivered to the consumer*, and the workers' skip counts added up in the dataset. With
``persistent_workers=True`` the processes are kept between passes; each pass tells them the
training process's cursor (``set_epoch`` and ``load_state_dict`` reach them); a pass left
before its end stops them and the next one starts new ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from tokenloom.loader.pipeline.transit import Rings
from tokenloom.loader.pipeline.workers import KeptPool, WorkerPool, multiprocessing_context
from tokenloom.rows.iterable import RowDataset
from tokenloom.rows.transform import RowLoaderError, to_format

__all__ = ["RowLoader"]


def _pinned(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's tensors in pinned memory (``pin_memory=True`` with CUDA)."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


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
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self._kept = KeptPool()
        """With ``persistent_workers``: the workers kept between passes, and what they were
        started for."""
        self._iterator = None
        """The kept workers (``persistent_workers``), as torch names its kept iterator."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds: RowDataset = self.dataset  # type: ignore[assignment]
        pin = bool(self.pin_memory) and ds.format == "torch" and torch.cuda.is_available()
        if self.num_workers == 0:
            for batch in ds.batches():
                yield _pinned(batch) if pin else batch
            return
        total = len(ds)
        pool = self._workers(ds)
        self.worker_pool = pool
        """The workers of the current (or last) pass."""
        it = pool.run(ds.cursor) if pool.persistent else iter(pool)
        rings = Rings()  # each worker's shared-memory ring
        try:
            for message in it:
                batch = rings.settle(message).batch
                ds.skipped.update(message.extra["skipped"])
                ds.refills += message.extra["refills"]
                ds.delivered(message.epoch, message.first, total)
                if ds.format == "torch":
                    batch = to_format(batch, batch["row_id"], "torch")
                    batch = _pinned(batch) if pin else batch
                pool.check()  # a dead worker is noticed here, not when its queue runs dry
                yield batch
        finally:
            it.close()  # a pass left before its end stops a persistent pool too
            self._iterator = self._kept.pool

    def _workers(self, ds: RowDataset) -> WorkerPool:
        """This pass's workers: new ones, or with ``persistent_workers`` the ones kept from the
        last pass when it ran to its end (each pass tells them its cursor)."""
        key = (ds.spec, ds.transform, ds.on_error, ds.format, ds.rank, ds.world_size,
               ds.read_batch_size, ds.transform_threads, ds.prefetch)  # fmt: skip
        pool = self._kept.get(
            key,
            lambda persistent: WorkerPool.of_loader(
                self, ds.detached(), main_objects=(ds.transform,), persistent=persistent
            ),
            persistent=bool(self.persistent_workers),
        )
        self._iterator = self._kept.pool
        return pool

    def close(self) -> None:
        """Stop the workers kept between passes (``persistent_workers``)."""
        self._kept.close()
        self._iterator = None

    def state_dict(self) -> dict:
        """The cursor of batches delivered to the consumer."""
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
