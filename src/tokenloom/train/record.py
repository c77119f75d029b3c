"""``RunRecord``: the small, readable part of a training checkpoint (``OUT/last.json``).

It is what ``trace``, ``sample``, the demo and ``train --resume`` read first: the loader spec the
run trained on (table version pinned, table stored as an absolute URI so any directory works), the
loader's cursor, the run's options, the tokenizer, the topology of every invocation, per-pool
counts of what the run was fed, and the run it started from (``--init-from``). One function reads
it (:func:`read_record`); the large state (weights, optimizer) is beside it in the checkpoint
(:mod:`tokenloom.train.checkpoint`, which writes both). Pure: no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError
from tokenloom.loader.plan.spec import LoaderSpec, absolute_uri
from tokenloom.train.layout import LAST_RECORD, parse_step, resolve_checkpoint

__all__ = ["RECORD_FORMAT", "RecordError", "RunRecord", "read_record", "write_record"]

RECORD_FORMAT = 2
"""Layout version of ``last.json`` (1: the unversioned layout before the loader spec)."""


class RecordError(TokenloomError):
    """A run directory has no readable record (missing, older layout, malformed)."""


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What a run did up to its last checkpoint (see the module docstring)."""

    out: str
    """The run directory (absolute)."""
    step: int
    """Optimizer steps done."""
    loader: LoaderSpec
    """The loader spec trained on, table version pinned (an image+text run's
    :class:`~tokenloom.vision.ImageTextSpec`, told apart by its ``kind``)."""
    loader_state: dict[str, Any]
    """The loader's cursor and plan inputs (:meth:`PackedDataset.state_dict`)."""
    config: dict[str, Any]
    """The run's other options (:meth:`TrainConfig.options`)."""
    tokenizer: dict[str, Any]
    """The token column's tokenizer identity."""
    topology: list[dict[str, Any]]
    """Per invocation: ``from_step``, ``world_size``, ``blocks_per_rank``, ``device`` and
    ``device_name``, and once it checkpointed ``to_step`` and ``wall_seconds`` (since its
    start)."""
    world_size: int = 1
    train_loss: float | None = None
    val_loss: float | None = None
    val_loss_by: dict[str, Any] = field(default_factory=dict)
    """The last validation loss of each mixture pool and ``--loss-slice``: ``{"pool/NAME" |
    "slice/NAME": {"loss", "tokens"}}`` (:mod:`tokenloom.train.provenance_loss`)."""
    pools: list[dict[str, Any]] = field(default_factory=list)
    """Per pool, what the run was fed so far (the ledger's fields: blocks, body tokens, EOS,
    padding, loss positions, overlap, unique documents, repeats)."""
    parent: dict[str, Any] | None = None
    """``--init-from``: the run this one started from (``out``, ``step``, ``loader``, and
    ``carried``: the lineage's per-pool counts up to it, :mod:`tokenloom.train.lineage`)."""
    pins: list[dict[str, Any]] = field(default_factory=list)
    """The table versions this run holds a Lance tag on (``table``, ``version``, ``tag``):
    protected from ``gc`` and Lance's cleanup until ``tokenloom runs rm`` releases them."""
    format: int = RECORD_FORMAT

    @property
    def compute(self) -> dict[str, Any]:
        """Wall time, process-hours, device type/count and tokens/s over the run's invocations
        (from :attr:`topology`; :func:`tokenloom.train.lineage.compute_summary`)."""
        from tokenloom.train.lineage import compute_summary

        return compute_summary(self.topology, self.loader.global_batch, self.loader.seq_len)

    @property
    def changes(self) -> tuple[Any, ...]:
        """The run's stream changes (:class:`~tokenloom.loader.plan.change.StreamChange`), in order,
        as its loader state holds them (a plan input: the one place they are kept)."""
        from tokenloom.loader.plan.change import changes_from

        return changes_from(self.loader_state.get("inputs", {}).get("changes"))

    @property
    def data_versions(self) -> list[dict[str, Any]]:
        """Each table version the run read, with the optimizer step (1-based) it took effect
        and the change that moved to it (``None`` for the first)."""
        changes = self.changes
        first = changes[0].version_before if changes else self.loader.version
        out: list[dict[str, Any]] = [{"version": first, "from_step": 1, "change": None}]
        for c in changes:
            out.append(
                {
                    "version": c.version_after,
                    "from_step": c.global_step + 1,
                    "change": c.kind,
                    "epoch": c.epoch,
                    "epoch_step": c.step,
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "out": self.out,
            "step": self.step,
            "world_size": self.world_size,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "val_loss_by": self.val_loss_by,
            "loader": self.loader.to_dict(),
            "loader_state": self.loader_state,
            "config": self.config,
            "tokenizer": self.tokenizer,
            "topology": self.topology,
            "pools": self.pools,
            "parent": self.parent,
            "pins": self.pins,
            "compute": self.compute,
            "data_versions": self.data_versions,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "the record") -> RunRecord:
        fmt = data.get("format")
        if fmt != RECORD_FORMAT:
            raise RecordError(
                f"{where} has layout {fmt or 1}, this tokenloom reads layout {RECORD_FORMAT}; "
                "it was written by an older tokenloom (retrain, or trace it with that release)"
            )
        try:
            return cls(
                out=str(data["out"]),
                step=int(data["step"]),
                world_size=int(data.get("world_size", 1)),
                train_loss=data.get("train_loss"),
                val_loss=data.get("val_loss"),
                val_loss_by=dict(data.get("val_loss_by") or {}),
                loader=_spec_from_dict(data["loader"]),
                loader_state=dict(data["loader_state"]),
                config=dict(data["config"]),
                tokenizer=dict(data["tokenizer"]),
                topology=list(data["topology"]),
                pools=list(data.get("pools") or []),
                parent=data.get("parent"),
                pins=list(data.get("pins") or []),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where} is malformed: {type(exc).__name__}: {exc}") from exc


def _spec_from_dict(data: Mapping[str, Any]) -> Any:
    """The loader spec of a record: a token loader's, or an image+text run's (``kind``)."""
    from tokenloom.vision.spec import SPEC_KIND

    if isinstance(data, Mapping) and data.get("kind") == SPEC_KIND:
        from tokenloom.vision.spec import ImageTextSpec

        return ImageTextSpec.from_dict(dict(data))
    return LoaderSpec.from_dict(data)


def record_path(run: str | os.PathLike[str]) -> str:
    """``run`` itself when it names a ``.json`` file, ``RUN/step-N/record.json`` for a step
    checkpoint (:func:`~tokenloom.train.layout.resolve_checkpoint`: a missing step is refused,
    listing those kept), else ``run/last.json``."""
    text = os.fspath(run)
    if text.endswith(".json"):
        return text
    if parse_step(os.path.basename(os.path.abspath(text))) is not None:
        return resolve_checkpoint(text).record_path
    return os.path.join(text, LAST_RECORD)


def read_record(run: str | os.PathLike[str]) -> RunRecord:
    """The record of the run directory ``run`` (its latest checkpoint), of ``RUN/step-N``, or of
    the ``.json`` it names.

    Raises:
        CheckpointNotFoundError: ``RUN/step-N`` names a step the run does not keep.
        RecordError: No record there, or one that cannot be read.
    """
    path = record_path(run)
    if not os.path.exists(path):
        raise RecordError(
            f"{path} not found: pass the --out directory of a `tokenloom train` run that has "
            "written a checkpoint"
        )
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise RecordError(f"{path} is not a run record (a JSON object)")
    return RunRecord.from_dict(data, where=path)


def write_record(record: RunRecord) -> str:
    """Write ``record`` to ``record.out/last.json`` atomically; returns the path."""
    path = os.path.join(absolute_uri(record.out), LAST_RECORD)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record.to_dict(), fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
