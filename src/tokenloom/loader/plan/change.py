"""Changing a run's data mid-stream, exactly: a run's stream is its spec plus an ordered tuple of
:class:`StreamChange` records.

A change takes effect at global step ``step`` of epoch ``epoch``. That epoch is then *spliced*
(:class:`SplicedView`): its steps before ``step`` are laid out exactly as the previous phase laid
them out (the previous table version and spec, read from that version: the run's Lance tag keeps
it), and its steps from ``step`` on are laid out by a *tail* plan that the change's kind computes
(:class:`ChangeKind`). Epochs after ``epoch`` are planned fresh from the new phase; epochs before
it are the previous phase's. The splice is at the step level, not the block level: with
``block_order="interleave"`` the layout of a step depends on the epoch's step count, so the head
keeps the old epoch's layout of its steps and the tail numbers its own.

Kinds (:data:`CHANGE_KINDS`, extended with :func:`register_kind`):

``continue``
    The table changed (rows appended, deleted, re-flagged, recomputed). The tail plans the rows
    the new version selects that were not delivered before ``step`` in this epoch (a row any of
    whose tokens were fed counts as delivered; the rest of a partly fed row is counted as
    ``dropped_by_change``), in a fresh order seeded from the run seed, the epoch and the change's
    index, packed with the same recipe; a mixture keeps its shares and plans the epoch's
    remaining budget.

The changes are plan inputs (:meth:`~tokenloom.loader.pipeline.planner.Planner.plan_inputs` lists
them), so a resume after a change is exact, and ``trace``, ``ledger``, ``verify`` and ``stats``
rebuild the same steps from the run record. Pure numpy past the planners: no per-document Python.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tokenloom.loader.plan.epoch import EpochSteps, PlanError
from tokenloom.loader.plan.view import BlockPlan, EpochView, GroupLayout

if TYPE_CHECKING:
    from tokenloom.loader.plan.spec import LoaderSpec

__all__ = [
    "DATA_CHANGES",
    "CHANGE_KINDS",
    "ChangeError",
    "StreamChange",
    "Delivered",
    "delivered_rows",
    "SplicedView",
    "ChangeKind",
    "register_kind",
    "change_kind",
    "changes_from",
    "changes_inputs",
    "selection_blind",
]

DATA_CHANGES = ("refuse", "continue")
"""``tokenloom train --resume --data-change`` choices: refuse a changed table (the default), or
continue onto it (a ``continue`` change)."""

_SCAN_STEPS = 256  # head steps laid out at once when collecting the rows they delivered


class ChangeError(PlanError):
    """A stream change is malformed or cannot apply (unknown kind, step outside the epoch)."""


@dataclass(frozen=True, kw_only=True)
class StreamChange:
    """One change of a run's data, effective from global step ``step`` of epoch ``epoch``."""

    kind: str
    """What changed: a key of :data:`CHANGE_KINDS` (``"continue"``)."""
    epoch: int
    """The epoch the change splices."""
    step: int
    """Global step within ``epoch`` from which the tail plan is read (``0``: the whole epoch is
    the new phase's tail; the steps before it were delivered by the previous phase)."""
    global_step: int
    """Global steps of the run delivered before the change (what the run record shows)."""
    version_before: int
    """Table version of the previous phase (kept by the run's Lance tag)."""
    version_after: int
    """Table version of the new phase."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific parameters, JSON values only (``continue`` has none)."""

    def __post_init__(self) -> None:
        for name in ("epoch", "step", "global_step", "version_before", "version_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ChangeError(f"stream change {name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.kind, str):
            raise ChangeError(f"stream change kind must be a string, got {self.kind!r}")
        try:
            json.dumps(dict(self.params), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ChangeError(f"stream change params must be JSON values: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the run record's and the loader state's form)."""
        return {
            "kind": self.kind,
            "epoch": int(self.epoch),
            "step": int(self.step),
            "global_step": int(self.global_step),
            "version_before": int(self.version_before),
            "version_after": int(self.version_after),
            "params": json.loads(json.dumps(dict(self.params), sort_keys=True)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamChange:
        """Read :meth:`to_dict`'s form back.

        Raises:
            ChangeError: A field is missing or mistyped.
        """
        try:
            return cls(
                kind=data["kind"],
                epoch=data["epoch"],
                step=data["step"],
                global_step=data["global_step"],
                version_before=data["version_before"],
                version_after=data["version_after"],
                params=dict(data.get("params") or {}),
            )
        except (KeyError, TypeError) as exc:
            raise ChangeError(f"malformed stream change {dict(data)!r}: {exc}") from exc

    def tail_seed(self, run_seed: int, index: int) -> int:
        """The seed of the tail's visiting order: derived from the run seed, the epoch and the
        change's index in the run (``index``), so two changes never share an order."""
        key = f"tokenloom-change-v1;{int(run_seed)};{self.epoch};{int(index)}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def changes_from(items: Sequence[Mapping[str, Any]] | None) -> tuple[StreamChange, ...]:
    """The changes of a run record or a loader state's inputs (``None``: no change)."""
    return tuple(StreamChange.from_dict(c) for c in items or ())


def changes_inputs(changes: Sequence[StreamChange]) -> dict[str, Any]:
    """Entries to merge into the plan's inputs: ``{}`` without a change (so the fingerprint of
    an unchanged run is what it always was), else ``{"changes": [...]}``."""
    return {"changes": [c.to_dict() for c in changes]} if changes else {}


def selection_blind(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Plan inputs without what only says which rows are selected (a mixture pool's digest of
    its rows): what must still match when the data changes under a run."""
    out = dict(inputs)
    mixture = out.get("mixture")
    if isinstance(mixture, Mapping) and isinstance(mixture.get("pools"), list):
        pools = [
            {k: v for k, v in p.items() if k != "rows"} if isinstance(p, Mapping) else p
            for p in mixture["pools"]
        ]
        out["mixture"] = {**mixture, "pools": pools}
    return out


# -- what the head delivered ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class Delivered:
    """The rows the first ``at`` steps of an epoch fed (any of their tokens or their EOS)."""

    row_ids: np.ndarray
    """``(D,)`` int64 ascending table ids of the rows delivered."""
    partial_ids: np.ndarray
    """``(Q,)`` int64 ascending: rows of which only a first part was fed (the head stops inside
    them); the rest is not delivered again."""
    dropped_tokens: int
    """Tokens of those rows never fed: ``dropped_by_change`` in the ledger."""


def delivered_rows(view: EpochView, at: int) -> Delivered:
    """The rows steps ``[0, at)`` of ``view`` feed, laid out a few hundred steps at a time (no
    token is read; one pass of vectorised numpy per chunk)."""
    at = min(int(at), view.steps)
    ids: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    for lo in range(0, at, _SCAN_STEPS):
        spans = view.group(np.arange(lo, min(lo + _SCAN_STEPS, at))).spans
        if not len(spans):
            continue
        # one entry per row and chunk: the furthest token fed (EOS-only stretches included)
        u, inv = np.unique(spans.row_id, return_inverse=True)
        fed = np.zeros(len(u), dtype=np.int64)
        np.maximum.at(fed, inv, spans.tok_end + spans.has_eos.astype(np.int64))
        doc = np.zeros(len(u), dtype=np.int64)
        doc[inv] = spans.doc_len
        ids.append(u)
        ends.append(fed)
        lens.append(doc)
    if not ids:
        empty = np.zeros(0, dtype=np.int64)
        return Delivered(row_ids=empty, partial_ids=empty, dropped_tokens=0)
    all_ids = np.concatenate(ids)
    u, inv = np.unique(all_ids, return_inverse=True)
    fed = np.zeros(len(u), dtype=np.int64)
    np.maximum.at(fed, inv, np.concatenate(ends))
    doc = np.zeros(len(u), dtype=np.int64)
    doc[inv] = np.concatenate(lens)
    # a row is whole once its tokens are (its EOS adds one position past them)
    short = fed < doc
    return Delivered(
        row_ids=u,
        partial_ids=u[short],
        dropped_tokens=int((doc[short] - fed[short]).sum()),
    )


def _not_in(ids: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: which of ``ids`` are not in the ascending array ``ascending``."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ascending):
        return np.ones(len(ids), dtype=bool)
    pos = np.minimum(np.searchsorted(ascending, ids), len(ascending) - 1)
    return ascending[pos] != ids


# -- the spliced epoch ------------------------------------------------------------------------


def _filled_positions(view: EpochView, at: int) -> int:
    """Real positions (tokens and EOS) of steps ``[0, at)`` of ``view``: ``counts`` over the
    block ranges those steps hold (one range, or one per slot when interleaved)."""
    plan, G = view.plan, view.global_batch
    if at <= 0:
        return 0
    if isinstance(view, SplicedView):
        return view.filled(at)
    if view.stream_order == "interleave":
        S = view.steps
        return sum(plan.counts(j * S, j * S + at).filled for j in range(G))
    return plan.counts(0, at * G).filled


class SplicedView(EpochView):
    """An epoch whose steps ``< at`` are ``head``'s and the rest ``tail``'s (see the module
    docstring). Offers :class:`~tokenloom.loader.plan.view.EpochView`'s interface, so the dataset,
    the ledger, ``trace``, ``verify`` and ``stats`` read it as any epoch.

    A :class:`GroupLayout` over steps of both phases concatenates the two phases' layouts;
    :attr:`GroupLayout.sources` says which stretches come from which phase (each reads from its
    own table version). :attr:`plan` is the tail's plan; block indices of a layout are those of
    its phase's plan.

    Args:
        head: The previous phase's view of the epoch (itself spliced after earlier changes).
        tail: The new phase's view of the tail plan.
        at: The step the change takes effect (``0 <= at <= head.steps``).
        head_source, tail_source: What reads each phase (the phases' planners).
        delivered: What the head delivered (counted in :meth:`epoch_info`).
    """

    def __init__(
        self,
        head: EpochView,
        tail: EpochView,
        *,
        at: int,
        head_source: Any,
        tail_source: Any,
        delivered: Delivered,
    ) -> None:
        if not 0 <= at <= head.steps:
            raise ChangeError(
                f"a change at step {at} is outside the epoch, which had {head.steps} steps"
            )
        if tail.global_batch != head.global_batch or tail.seq_len != head.seq_len:
            raise ChangeError("a change cannot alter the global batch or the sequence length")
        self.head, self.tail, self.at = head, tail, int(at)
        self.head_source, self.tail_source = head_source, tail_source
        self.delivered = delivered
        self.plan = tail.plan
        self.global_batch = tail.global_batch
        self.drop_last = tail.drop_last
        self.block_order = tail.block_order
        self.stream_order = tail.stream_order
        self.lookahead = tail.lookahead
        self.overlap_loss = tail.overlap_loss
        self.eos_id, self.pad_id = tail.eos_id, tail.pad_id
        t = tail.sizes
        L, G = tail.seq_len, tail.global_batch
        head_pad = self.at * G * L - _filled_positions(head, self.at)
        self.sizes = EpochSteps(
            steps=self.at + t.steps,
            global_batch=G,
            padding_blocks=t.padding_blocks,
            padding_positions=head_pad + t.padding_positions,
            dropped_blocks=t.dropped_blocks,
            dropped_tokens=t.dropped_tokens,
            dropped_eos=t.dropped_eos,
        )

    @property
    def seq_len(self) -> int:
        return self.tail.seq_len

    def filled(self, at: int) -> int:
        """Real positions of steps ``[0, at)``."""
        if at <= self.at:
            return _filled_positions(self.head, at)
        return _filled_positions(self.head, self.at) + _filled_positions(self.tail, at - self.at)

    def phase(self, step: int) -> tuple[EpochView, int, Any]:
        """``(view, step in it, source)`` of a step of this epoch."""
        if step < self.at:
            return self.head, step, self.head_source
        return self.tail, step - self.at, self.tail_source

    def blocks(self, step: int, *, rank: int = 0, world_size: int = 1) -> np.ndarray:
        view, s, _ = self.phase(int(step))
        return view.blocks(s, rank=rank, world_size=world_size)

    def group(self, steps: np.ndarray, *, rank: int = 0, world_size: int = 1) -> GroupLayout:
        steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        bad = (steps < 0) | (steps >= self.steps)
        if bad.any():
            raise PlanError(
                f"step {int(steps[bad][0])} is outside the epoch: it has {self.steps} global steps"
            )
        if len(steps) and np.any(np.diff(steps) < 0):
            raise PlanError("a group's steps must be ascending")
        cut = int(np.searchsorted(steps, self.at))
        parts = []
        if cut:
            parts.append(
                (self.head.group(steps[:cut], rank=rank, world_size=world_size), self.head_source)
            )
        if cut < len(steps):
            tail = self.tail.group(steps[cut:] - self.at, rank=rank, world_size=world_size)
            parts.append((tail, self.tail_source))
        return _concat_layouts(steps, parts)

    def steps_holding(self, row_ids: np.ndarray) -> list[int]:
        head = [s for s in self.head.steps_holding(row_ids) if s < self.at]
        return head + [s + self.at for s in self.tail.steps_holding(row_ids)]


def _concat_layouts(steps: np.ndarray, parts: list[tuple[GroupLayout, Any]]) -> GroupLayout:
    """One :class:`GroupLayout` of consecutive phases' layouts (``sources``: where each phase's
    stretches end, and what reads them)."""
    sources: list[tuple[int, Any]] = []
    end = 0
    for layout, source in parts:
        # a phase's own layout may already be spliced: keep its finer sources
        inner = layout.sources or ((len(layout.spans), source),)
        sources.extend((end + e, s) for e, s in inner)
        end += len(layout.spans)
    if len(parts) == 1:
        layout = parts[0][0]
        return _with(layout, steps=steps, sources=tuple(sources))
    from tokenloom.loader.plan.spans import Spans

    first = parts[0][0]
    nb = np.cumsum([0] + [len(p.blocks) for p, _ in parts])
    fields: dict[str, Any] = {"seq_len": first.spans.seq_len}
    arrays = ("block", "pos", "doc", "row_id", "doc_len", "tok_start", "tok_end", "has_eos")
    for name in arrays:
        vals = [getattr(p.spans, name) for p, _ in parts]
        if name == "block":
            vals = [v + nb[i] for i, v in enumerate(vals)]
        fields[name] = np.concatenate(vals)
    fields["blocks"] = np.concatenate([p.spans.blocks for p, _ in parts])
    if any(p.spans.ctx_end is not None for p, _ in parts):
        fields["ctx_end"] = np.concatenate(
            [
                p.spans.ctx_end if p.spans.ctx_end is not None else p.spans.tok_start
                for p, _ in parts
            ]
        )
    if any(p.spans.ends_window is not None for p, _ in parts):
        fields["ends_window"] = np.concatenate(
            [
                p.spans.ends_window
                if p.spans.ends_window is not None
                else np.zeros(len(p.spans), dtype=bool)
                for p, _ in parts
            ]
        )
    return GroupLayout(
        steps=steps,
        blocks_per_step=first.blocks_per_step,
        blocks=np.concatenate([p.blocks for p, _ in parts]),
        spans=Spans(**fields),
        starts=np.concatenate([p.starts for p, _ in parts]),
        stops=np.concatenate([p.stops for p, _ in parts]),
        pools=np.concatenate([p.pools for p, _ in parts]),
        sources=tuple(sources),
    )


def _with(layout: GroupLayout, **changes: Any) -> GroupLayout:
    from dataclasses import replace

    return replace(layout, **changes)


# -- kinds ------------------------------------------------------------------------------------


class ChangeKind(Protocol):
    """What a kind of change does to the plan (register one with :func:`register_kind`)."""

    def previous_spec(self, change: StreamChange, spec: LoaderSpec) -> LoaderSpec:
        """The previous phase's spec, from the new phase's ``spec`` (at least the version)."""
        ...

    def check_phases(self, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        """Refuse a new phase whose plan inputs (``current``, the run's changes so far merged
        in) differ from the checkpoint's (``saved``) in what this kind does not change
        (:class:`~tokenloom.loader.plan.state.ResumeMismatchError`, naming each input)."""
        ...

    def tail_plan(
        self,
        planner: Any,
        change: StreamChange,
        index: int,
        head: EpochView,
        delivered: Delivered,
    ) -> BlockPlan:
        """The plan of the steps from ``change.step`` of ``change.epoch`` on, made by the new
        phase's ``planner`` (a :class:`~tokenloom.loader.pipeline.planner.Planner`, which calls
        the kinds; ``index``: the change's position in the run's changes, for its seed;
        ``head``: the previous phase's view of the epoch)."""
        ...


CHANGE_KINDS: dict[str, ChangeKind] = {}
"""The kinds of change, by name."""


def register_kind(name: str, kind: ChangeKind) -> None:
    """Make ``name`` a kind of :class:`StreamChange`."""
    CHANGE_KINDS[name] = kind


def change_kind(name: str) -> ChangeKind:
    """The kind named ``name``.

    Raises:
        ChangeError: No such kind (the message lists the known ones).
    """
    kind = CHANGE_KINDS.get(name)
    if kind is None:
        raise ChangeError(
            f"unknown stream change kind {name!r}; known: {', '.join(sorted(CHANGE_KINDS))}"
        )
    return kind


def remaining_budget(spec: LoaderSpec, at: int) -> int | None:
    """A mixture's budget left after ``at`` global steps of its epoch (``None``: no budget;
    at least one block, so the tail is never refused for a budget the head spent exactly)."""
    if spec.budget_tokens is None:
        return None
    spent = int(at) * spec.global_batch * spec.seq_len
    return max(int(spec.budget_tokens) - spent, 0)


class _Continue:
    """``continue``: the rows not yet delivered this epoch that still pass, plus the new ones."""

    def previous_spec(self, change: StreamChange, spec: LoaderSpec) -> LoaderSpec:
        return spec.replace(version=change.version_before)

    def check_phases(self, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        from tokenloom.loader.plan.state import check_fingerprint

        # which rows are selected may change (the table's version, the filter, the pools' row
        # digests): no other input (not the tokenizer: the model reads its ids), so the tail
        # is the same stream's continuation
        free = ("table_version", "table_identity", "filter")
        check_fingerprint(
            {k: v for k, v in selection_blind(saved).items() if k not in free},
            {k: v for k, v in selection_blind(current).items() if k not in free},
        )

    def tail_plan(
        self,
        planner: Any,
        change: StreamChange,
        index: int,
        head: EpochView,
        delivered: Delivered,
    ) -> BlockPlan:
        keep = [_not_in(np.asarray(u), delivered.row_ids) for u in planner.universes()]
        return planner.plan_rows(
            keep,
            seed=change.tail_seed(planner.spec.seed, index),
            epoch=change.epoch,
            budget_tokens=remaining_budget(planner.spec, change.step),
        )


register_kind("continue", _Continue())
