"""Where a loader is in its stream: the cursor ``(epoch, step)``, its resume state, and the cache
of the last epochs' plans.

The cursor is the next *global* step to deliver, counted in the global stream, so it means the
same on any world size and number of workers: a state saved on 4 ranks resumes on 2 exactly.
It moves only when a step reaches the consumer (:meth:`Cursor.delivered`), rolling over into
the next epoch's start after the last step. The resume state is the cursor plus the plan's
named inputs and their fingerprint (:class:`~tokenloom.loader.plan.state.LoaderState`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from tokenloom.loader.plan.state import LoaderState

__all__ = ["Cursor", "PlanCache", "StreamCursor"]

P = TypeVar("P")


class Cursor:
    """``(epoch, step)``: the next global step to deliver (``step`` steps of ``epoch`` done)."""

    __slots__ = ("epoch", "step")

    def __init__(self, epoch: int = 0, step: int = 0) -> None:
        self.epoch, self.step = int(epoch), int(step)

    def __repr__(self) -> str:
        return f"Cursor(epoch={self.epoch}, step={self.step})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Cursor):
            return (self.epoch, self.step) == (other.epoch, other.step)
        if isinstance(other, tuple):
            return (self.epoch, self.step) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.epoch, self.step))

    @property
    def at(self) -> tuple[int, int]:
        """``(epoch, step)``."""
        return self.epoch, self.step

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``'s start, unless the cursor is already in it (a resumed run calls
        ``set_epoch`` with the epoch it resumed in and must keep its step)."""
        if int(epoch) != self.epoch:
            self.epoch, self.step = int(epoch), 0

    def seek(self, epoch: int, step: int) -> None:
        """Put the cursor at global step ``step`` of ``epoch``."""
        self.epoch, self.step = int(epoch), int(step)

    def delivered(self, epoch: int, step: int, steps: int) -> None:
        """Global step ``step`` of ``epoch`` (which has ``steps`` steps) reached the consumer:
        the cursor moves past it, to the next epoch's start after the last one."""
        if step + 1 >= steps:
            self.epoch, self.step = int(epoch) + 1, 0
        else:
            self.epoch, self.step = int(epoch), int(step) + 1

    def state(self, inputs: Mapping[str, Any]) -> LoaderState:
        """The resume state at this cursor for a plan of ``inputs``."""
        return LoaderState.create(epoch=self.epoch, step=self.step, inputs=inputs)

    def restore(
        self, state: Mapping[str, Any], inputs: Mapping[str, Any], *, allow_data_change: bool
    ) -> LoaderState:
        """Move to the cursor of ``state`` once its inputs are checked against ``inputs``.

        Raises:
            LoaderStateError: A state of another layout, or edited.
            ResumeMismatchError: An input changed (named, with the override).
        """
        saved = LoaderState.from_dict(state)
        saved.check(inputs, allow_data_change=allow_data_change)
        self.seek(saved.epoch, saved.step)
        return saved


class PlanCache(Generic[P]):
    """The plans of the last ``keep`` epochs asked for (the current one and the one a reader
    looks ahead to); older ones are dropped. Not pickled: a worker builds (or maps) its own."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = int(keep)
        self._plans: OrderedDict[int, P] = OrderedDict()

    def __getstate__(self) -> dict:
        return {"keep": self.keep}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __contains__(self, epoch: int) -> bool:
        return int(epoch) in self._plans

    def __len__(self) -> int:
        """Plans held (0 in a fresh or unpickled copy)."""
        return len(self._plans)

    def get(self, epoch: int, build: Callable[[int], P]) -> P:
        """Epoch ``epoch``'s plan, built by ``build(epoch)`` the first time."""
        epoch = int(epoch)
        plan = self._plans.get(epoch)
        if plan is None:
            plan = build(epoch)
            self._plans[epoch] = plan
            while len(self._plans) > self.keep:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        self._plans.clear()


class StreamCursor:
    """What a dataset gets from its cursor (``self.at``, a :class:`Cursor`): ``epoch``,
    ``step``, ``cursor``, ``set_epoch``, ``seek``, ``delivered``, ``state_dict`` and
    ``load_state_dict``. The dataset defines ``plan_inputs()``, ``steps(epoch)`` and
    ``allow_data_change``; it may extend :meth:`state_dict`/:meth:`load_state_dict`."""

    # the dataset's own: ``plan_inputs() -> dict`` and ``steps(epoch) -> int`` (not declared
    # here: a mixin's stub would shadow a base class's method later in the MRO)
    at: Cursor
    allow_data_change: bool

    @property
    def epoch(self) -> int:
        """The epoch of the next step to deliver."""
        return self.at.epoch

    @property
    def step(self) -> int:
        """Global steps of this epoch delivered so far."""
        return self.at.step

    @property
    def cursor(self) -> tuple[int, int]:
        """``(epoch, step)`` of the next batch."""
        return self.at.at

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (from its start, unless the cursor is already in it)."""
        self.at.set_epoch(epoch)

    def seek(self, epoch: int, step: int) -> None:
        """Put the cursor at global step ``step`` of ``epoch`` (a persistent worker is told where
        each pass starts; the training process moves by :meth:`set_epoch` and
        :meth:`load_state_dict`)."""
        self.at.seek(epoch, step)

    def delivered(self, epoch: int, step: int, steps: int | None = None) -> None:
        """Step ``step`` of ``epoch`` reached the consumer (``steps``: the epoch's, if known)."""
        total = self.steps(epoch) if steps is None else steps  # type: ignore[attr-defined]
        self.at.delivered(epoch, step, total)

    def state_dict(self) -> dict:
        """The exact cursor of batches delivered so far, with the plan's fingerprint."""
        return self.at.state(self.plan_inputs()).to_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        """Continue the global stream a state was taken at (on any world size / workers).

        Raises:
            ResumeMismatchError: naming what changed and the override.
        """
        inputs = self.plan_inputs()  # type: ignore[attr-defined]
        self.at.restore(state, inputs, allow_data_change=self.allow_data_change)
