"""Which rows did the model see at step N, and at which steps did it see row R.

Recomputed from the run's record (``last.json``, :class:`~tokenloom.train.record.RunRecord`: the
loader spec, its cursor and plan inputs, and the topology of every invocation) — no log of
samples; every recipe (concat, best-fit, windows, mixtures) is traced the same way, through the
loader's own :class:`~tokenloom.loader.plan.view.EpochView`. The loader's plan is a
pure function of its inputs (contract 3), so the global batch of optimizer step ``N`` is the
plan's global step ``N - 1`` (counted across epochs), and rank ``r`` of a topology with ``b``
blocks per rank held its blocks ``[r b, (r+1) b)``. Provenance is computed exactly as the loader
emits it (the same packing code on placeholder tokens), without reading a token.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tokenloom.errors import TokenloomError
from tokenloom.loader.pipeline.planner import Planner
from tokenloom.loader.plan.state import LoaderState
from tokenloom.train.record import RunRecord, read_record

__all__ = ["TraceError", "Seen", "RunTrace", "open_run"]


class TraceError(TokenloomError):
    """The checkpoint cannot be traced (missing record, step outside the run)."""


@dataclass(frozen=True)
class Seen:
    """One stretch of a row in one block: what the model saw, and where."""

    step: int
    """Optimizer step (1-based, as the training log counts)."""
    epoch: int
    rank: int
    block: int
    """Block within that rank's batch (the loader's provenance column 0)."""
    position: int
    """First position of the stretch in the block."""
    row_id: int
    token_start: int
    token_end: int
    """Tokens ``[token_start, token_end)`` of the row (the EOS is not counted)."""
    pool: str = "all"
    """The mixture pool the block came from (``all`` without a mixture)."""
    context_end: int | None = None
    """Tokens ``[token_start, context_end)`` were context only (a window repeating the end of
    the previous one: input, no loss); ``None`` when the stretch has no context."""

    kind: str = "tokens"
    """``tokens``: the row's own tokens; ``marker``: tokens of the prefix put before the row
    (its file marker, a document's BOS) by a grouped spec, ``[token_start, token_end)`` of that
    prefix (:meth:`~tokenloom.loader.plan.files.Files.prefix_of`)."""
    group: int | None = None
    """With a grouped spec: the document (group id, the plan's row) the stretch belongs to."""

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        """The loader's provenance row ``(block, position, row id, token start, token end)``."""
        return (self.block, self.position, self.row_id, self.token_start, self.token_end)


@dataclass
class RunTrace:
    """A training run's data stream, recomputable step by step."""

    record: RunRecord
    planner: Planner = field(repr=False)
    """The run's loader spec resolved against its table (global batch = the optimizer step)."""

    @property
    def steps_done(self) -> int:
        return int(self.record.step)

    @property
    def table_version(self) -> int:
        """The version the run reads now (its last, when its data changed)."""
        return self.planner.version

    def version_at(self, step: int) -> int:
        """The table version optimizer step ``step`` (1-based) read its rows from."""
        version = self.planner.version
        for entry in self.record.data_versions:
            if entry["from_step"] <= step:
                version = entry["version"]
        return int(version)

    def _topology(self, step: int) -> dict:
        segments = sorted(self.record.topology, key=lambda t: t["from_step"])
        current = segments[0]
        for seg in segments:
            if seg["from_step"] <= step:
                current = seg
        return current

    def _locate(self, step: int) -> tuple[int, int]:
        """Optimizer step (1-based) → (epoch, global step within the epoch)."""
        if not 1 <= step <= self.steps_done:
            raise TraceError(f"step {step} is outside the run: it has steps 1..{self.steps_done}")
        return self.planner.locate(step - 1)

    def _seen(
        self, epoch: int, first: int, count: int, step_base: int, row: int | None
    ) -> list[Seen]:
        """The stretches of ``count`` global steps from ``first`` (only row ``row``'s, if given),
        as the loader's packing emits them (:meth:`EpochView.skeleton`: no token is read)."""
        view = self.planner.view(epoch)
        names = self.planner.spec.pool_names
        out = []
        for s in range(first, first + count):
            layout = view.layout(s)
            if row is not None and not (layout.spans.row_id == row).any():
                continue
            packed = view.skeleton(layout)
            step = step_base + s + 1
            per_rank = self._topology(step)["blocks_per_rank"]
            ctx = packed.context
            for i, (b, pos, rid, start, end) in enumerate(packed.spans.tolist()):
                if row is not None and rid != row:
                    continue
                c_end = int(ctx[i, 1]) if ctx is not None and ctx[i, 1] > ctx[i, 0] else None
                pool = int(layout.pools[b])
                out.append(
                    Seen(
                        step, epoch, b // per_rank, b % per_rank, pos, rid, start, end,
                        pool=names[pool] if pool >= 0 else names[0], context_end=c_end,
                    )
                )  # fmt: skip
        return self._unfold(out)

    def _unfold(self, seen: list[Seen]) -> list[Seen]:
        """With a grouped spec: each stretch of a group as the pieces of its files (the file's
        row and token range, its position in the block) and of their markers."""
        files = self.planner.files
        if files is None or not seen:
            return seen
        from tokenloom.loader.plan.files import MARKER

        g = np.array([x.row_id for x in seen], dtype=np.int64)
        a = np.array([x.token_start for x in seen], dtype=np.int64)
        b = np.array([x.token_end for x in seen], dtype=np.int64)
        ctx = np.array([a[i] if x.context_end is None else x.context_end
                        for i, x in enumerate(seen)], dtype=np.int64)  # fmt: skip
        p = files.unfold(g, a, b)
        out = []
        for k in range(len(p)):
            x = seen[int(p.stretch[k])]
            lo, hi, at = int(p.lo[k]), int(p.hi[k]), int(p.at[k])
            c = min(max(int(ctx[p.stretch[k]]), at), at + hi - lo) - at + lo
            out.append(
                dataclasses.replace(
                    x,
                    position=x.position + at - x.token_start,
                    row_id=int(files.rows[p.member[k]]),
                    token_start=lo,
                    token_end=hi,
                    context_end=c if c > lo else None,
                    kind="marker" if p.kind[k] == MARKER else "tokens",
                    group=x.row_id,
                )
            )
        return out

    def step(self, step: int, rank: int | None = None) -> list[Seen]:
        """The stretches in optimizer step ``step``'s batch (of one rank, or all ranks)."""
        epoch, g = self._locate(step)
        seen = self._seen(epoch, g, 1, step - 1 - g, None)
        if rank is not None:
            world = self._topology(step)["world_size"]
            if not 0 <= rank < world:
                raise TraceError(f"rank {rank} is outside world size {world} at step {step}")
            seen = [x for x in seen if x.rank == rank]
        return seen

    def rows_fed(self, first: int, last: int, *, chunk: int = 256) -> tuple[np.ndarray, int, int]:
        """The rows whose tokens (or EOS) optimizer steps ``first..last`` (1-based, inclusive)
        held, on every rank: ``(ascending unique row ids, stretches, tokens)``.

        Laid out a group of steps at a time with the loader's own :meth:`EpochView.group` (no
        token is read, no Python per row), epoch by epoch.
        """
        if not 1 <= first <= last <= self.steps_done:
            raise TraceError(
                f"steps {first}:{last} are outside the run: it has steps 1..{self.steps_done}"
            )
        ids: list[np.ndarray] = []
        stretches = tokens = 0
        done, epoch = 0, 0
        while done < last:
            view = self.planner.view(epoch)
            lo, hi = max(first - 1 - done, 0), min(last - done, view.steps)
            for a in range(lo, hi, chunk):
                spans = view.group(np.arange(a, min(a + chunk, hi), dtype=np.int64)).spans
                real = spans.row_id >= 0
                row_id, lo, up = spans.row_id[real], spans.tok_start[real], spans.tok_end[real]
                files = self.planner.files
                if files is not None:  # groups: their files' rows and tokens
                    p = files.unfold(row_id, lo, up)
                    own = p.kind == 0
                    row_id, lo, up = files.rows[p.member[own]], p.lo[own], p.hi[own]
                ids.append(np.unique(row_id))
                stretches += int(row_id.shape[0])
                tokens += int(np.sum(up - lo, dtype=np.int64))
            done, epoch = done + view.steps, epoch + 1
        rows = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
        return rows.astype(np.int64, copy=False), stretches, tokens

    def row(self, row_id: int) -> list[Seen]:
        """Every step (rank, block, position, token range) where row ``row_id``'s tokens appeared
        in steps ``1..steps_done``, epochs and repeats included."""
        out: list[Seen] = []
        done, epoch = 0, 0
        files = self.planner.files
        doc = row_id
        if files is not None:  # the group holding the row
            where = np.flatnonzero(files.rows == row_id)
            if not where.size:
                return []
            doc = int(files.group_of(where)[0])
        while done < self.steps_done:
            view = self.planner.view(epoch)
            n = min(view.steps, self.steps_done - done)
            wanted = [s for s in view.steps_holding(np.array([doc])) if s < n]
            for s in wanted:
                out.extend(self._seen(epoch, s, 1, done, doc))
            done, epoch = done + n, epoch + 1
        return [x for x in out if x.row_id == row_id]


def open_run(
    checkpoint: str | os.PathLike[str], *, storage_options: Mapping[str, str] | None = None
) -> RunTrace:
    """The trace of the run whose directory (or ``last.json``) is ``checkpoint``.

    Raises:
        RecordError: No readable record there.
        ResumeMismatchError: The table no longer matches the run's plan (e.g. its version is gone).
    """
    record = read_record(checkpoint)
    planner = Planner(record.loader, storage_options=storage_options, changes=record.changes)
    LoaderState.from_dict(record.loader_state).check(planner.plan_inputs())
    return RunTrace(record=record, planner=planner)
