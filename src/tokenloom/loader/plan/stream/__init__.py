"""The stream skeleton every tokenloom loader is built on: a loader is its plan plus its
materialiser.

A loader delivers a *global stream*: epoch ``e`` is a pure function of the spec and the table
version, cut into global steps of ``global_batch`` items; rank ``r`` of ``W`` takes its
contiguous ``global_batch / W`` of each step, and worker ``w`` of ``N`` builds groups
``w, w + N, ...`` of the rank's steps. What every loader shares lives here, defined once:

* :class:`~tokenloom.loader.plan.stream.spec.StreamSpec` — the spec's common part (``table``,
  ``version``, ``filter``, ``global_batch``, ``seed``, ``drop_last``), validated once. A loader's
  spec subclasses it (``LoaderSpec``, ``RowSpec``) and adds its own fields.
* :class:`~tokenloom.loader.plan.stream.topology.Topology` — rank x world size, the rule that the
  global batch divides over the ranks (one error naming the fix), and how a rank's steps are
  dealt to workers (:func:`~tokenloom.loader.plan.stream.topology.worker_groups`).
* :class:`~tokenloom.loader.plan.stream.cursor.Cursor` — ``(epoch, step)`` of the next global step
  to deliver, ``set_epoch``, rollover into the next epoch, and the resume state
  (:class:`~tokenloom.loader.plan.state.LoaderState`: the cursor plus a fingerprint of the plan's
  inputs, independent of the world size and workers, so resuming is exact elastically);
  :class:`~tokenloom.loader.plan.stream.cursor.PlanCache` keeps the last epochs' plans.
* :func:`~tokenloom.loader.pipeline.take.take` — rows by stable row id (Lance's take: thread-safe,
  GIL released), the one place that calls it.
* :class:`~tokenloom.loader.pipeline.workers.WorkerPool` with the shared-memory transit of
  :mod:`~tokenloom.loader.pipeline.transit` — tokenloom's own worker processes; a step of arrays of
  any shapes crosses as a :class:`~tokenloom.loader.pipeline.transit.StepMessage` (its arrays in a
  ring slot, lent to the batch).

How a new loader plugs in (see ``RowDataset`` for a small one):

1. Its spec: ``@dataclass(frozen=True, kw_only=True, slots=True) class MySpec(StreamSpec)``
   with its own fields; ``__post_init__`` calls ``StreamSpec.__post_init__(self)`` first, and
   ``fingerprint_inputs()`` extends ``self.stream_inputs()``.
2. Its plan: a pure function of ``(spec, selection, epoch)`` with a ``steps`` count, cached
   with a :class:`PlanCache`.
3. The dataset mixes in :class:`~tokenloom.loader.plan.stream.cursor.StreamCursor` and sets
   ``self.topology = Topology.of(rank, world_size)`` and ``self.at = Cursor(epoch)``; it defines
   ``plan_inputs()`` (the fingerprint's named inputs) and ``steps(epoch)``. It gets ``epoch``,
   ``step``, ``set_epoch``, ``seek``, ``state_dict``, ``load_state_dict`` and
   ``delivered(epoch, step)`` (the consumer got step ``step``: move the cursor past it, rolling
   over at the epoch's end).
4. Its materialiser reads rows with :func:`take` and builds one step (or a group of steps) of
   this rank; a worker-side ``groups(worker, workers, keep=...)`` iterator (the steps of
   :func:`worker_groups`, each yielded as ``ring.put(StepMessage(...))`` with one
   ``WorkerRing()`` a pass), ``seek`` and a torch-free ``detached()`` copy make it runnable by
   :class:`~tokenloom.loader.pipeline.workers.WorkerPool`; its loader settles each message with
   one ``Rings()`` a pass (``rings.settle(message).batch``) and calls
   ``dataset.delivered(message.epoch, message.first)``.
   ``RowStream`` + ``RowLoader`` (:mod:`tokenloom.rows`) are the worked example.
"""

from __future__ import annotations

from tokenloom.loader.plan.stream.cursor import Cursor, PlanCache, StreamCursor
from tokenloom.loader.plan.stream.spec import StreamSpec, absolute_uri, check_int
from tokenloom.loader.plan.stream.topology import (
    Topology,
    check_rank,
    split_global_batch,
    worker_groups,
)

__all__ = [
    "Cursor",
    "PlanCache",
    "StreamCursor",
    "StreamSpec",
    "Topology",
    "absolute_uri",
    "check_int",
    "check_rank",
    "split_global_batch",
    "worker_groups",
]
