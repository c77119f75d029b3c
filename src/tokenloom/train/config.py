"""A training run's options (``TrainConfig``) and outcome (``TrainResult``).

Pure: no torch. The data is one :class:`~tokenloom.loader.LoaderSpec`; everything else is a knob
of the trainer with its reason. The options a resume must keep, and those of one invocation only,
are named here once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError
from tokenloom.loader.spec import LoaderSpec, absolute_uri
from tokenloom.train.metrics import parse_log_to
from tokenloom.train.record import RunRecord

__all__ = [
    "MODEL_KEYS",
    "INVOCATION_KEYS",
    "SCHEDULE_KEYS",
    "TrainError",
    "BudgetError",
    "TrainConfig",
    "TrainResult",
]

MODEL_KEYS = ("model", "attention")
"""Options a resumed run must share with its checkpoint (the weights depend on them)."""
INVOCATION_KEYS = ("stop_at", "time_limit")
"""Options of one invocation only: a resume does not inherit them from the record."""
SCHEDULE_KEYS = ("steps", "epochs", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
"""Options that shape the learning-rate schedule: changing one on resume needs ``reschedule``."""


class TrainError(TokenloomError):
    """A training run's options cannot work (or do not match the checkpoint resumed)."""


class BudgetError(TrainError):
    """``total_budget_tokens`` leaves not one step to a run (its lineage spent the rest)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The knobs of a run, each with its reason. The data is :attr:`loader`, whole."""

    loader: LoaderSpec
    """What the run trains on: table, version, filter, block length, global batch, seed,
    packing recipe, mixture (:class:`~tokenloom.loader.LoaderSpec`)."""
    out: str
    """Run directory (``last.pt``, ``last.json``); stored absolute."""
    model: str = "tiny"
    """``tiny`` trains usefully on 2 CPU cores; ``small``/``medium`` are GPT-2 124M/350M."""
    val_filter: str | None = None
    """Held-out rows for validation loss (e.g. ``id % 100 = 0``), read with the loader's
    other options, seed 0 and no mixture."""
    micro_batch_size: int | None = None
    """Blocks per forward pass per process ``B``; ``None``: the rank's whole share ``G / W``
    (no accumulation). ``K = G / (B W)`` micro-batches make one optimizer step."""
    steps: int | None = 100
    """Optimizer steps in all (a resumed run continues up to this)."""
    epochs: int | None = None
    """Instead of ``steps``: whole passes over the selection (each reshuffled)."""
    stop_at: int | None = None
    """End this invocation after this step (checkpointed), as a preempted job would; the
    learning-rate schedule still runs to ``steps`` and ``--resume`` continues."""
    time_limit: float | None = None
    """End this invocation (checkpointed) once this many seconds of training have passed."""
    lr: float = 3e-3
    """Peak AdamW learning rate; tiny models like it high."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at ``lr * min_lr_ratio``."""
    warmup_steps: int | None = None
    """Linear warm-up; default 5% of the steps (at least 1)."""
    weight_decay: float = 0.1
    """On matrices only (not biases, LayerNorms or the position embedding)."""
    grad_clip: float = 1.0
    attention: str = "document"
    """``document`` isolates documents inside a block; ``causal`` for comparison."""
    kernel: str = "auto"
    """``sdpa`` (dense mask), ``flex`` (flex_attention block mask) or ``auto`` (flex on CUDA)."""
    device: str = "auto"
    """``auto``: ``cuda:LOCAL_RANK`` when a GPU is visible, else ``cpu``."""
    dtype: str = "auto"
    """``bf16`` autocast or ``fp32``; ``auto``: bf16 on a GPU that supports it, fp32 on CPU."""
    compile: bool = False
    """``torch.compile`` the model (worth it on GPU for runs longer than the compile)."""
    workers: int = 0
    """DataLoader workers (0: read and pack in the training process)."""
    eval_every: int = 50
    eval_batches: int = 4
    """Global validation batches per evaluation (the same rows every time)."""
    checkpoint_every: int = 50
    log_every: int = 10
    provenance_log: bool = False
    """Each rank appends ``provenance-rank{R}.jsonl``: the loader's provenance of every step.
    Not needed by ``tokenloom trace`` (it recomputes it); an audit trail to check that against."""
    init_from: str | None = None
    """Start from this run directory's weights (a stage transition); the data, schedule and
    step start anew. The new run's record names it as its parent."""
    keep_optimizer: bool = False
    """With ``init_from``: also take its optimizer state (moments), not only the weights."""
    total_budget_tokens: int | None = None
    """Cap on the block positions the whole lineage trains on (this run plus every run it
    started from, carried through ``init_from``): the run plans the steps that remain;
    ``steps``, when not ``None`` (its default 100 included), only lowers them. See
    :mod:`tokenloom.train.lineage`."""
    loss_slices: tuple[tuple[str, str], ...] = ()
    """Named SQL slices ``(name, filter)`` whose training and validation loss is reported
    beside each mixture pool's (:mod:`tokenloom.train.provenance_loss`)."""
    log_to: tuple[str, ...] = ()
    """Metric sinks beside the checkpoint besides the log lines: ``csv`` (``metrics.csv``) and
    ``tensorboard`` (event files in ``tensorboard/``); see :mod:`tokenloom.train.metrics`."""
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """Object-store options for the table (credentials): passed to the loader, never written to
    the record or the checkpoint (a resume gives them again, or takes the ``AWS_*``
    environment)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", absolute_uri(self.out))
        if self.init_from is not None:
            object.__setattr__(self, "init_from", absolute_uri(self.init_from))
        budget = self.total_budget_tokens
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < 1):  # fmt: skip
            raise TrainError(f"total_budget_tokens must be an integer >= 1, got {budget!r}")
        if budget is not None and self.epochs is not None:
            raise TrainError(
                "total_budget_tokens derives the steps from what the lineage has left; "
                "drop epochs (steps, when given, caps them)"
            )
        if (self.steps is None) == (self.epochs is None) and budget is None:
            raise TrainError("give exactly one of steps and epochs")
        if self.keep_optimizer and not self.init_from:
            raise TrainError("keep_optimizer applies with init_from only")
        try:
            object.__setattr__(self, "log_to", parse_log_to(self.log_to))
        except ValueError as exc:
            raise TrainError(f"log_to: {exc}") from exc
        from tokenloom.train.slices import SliceError, parse_loss_slices

        try:
            object.__setattr__(self, "loss_slices", parse_loss_slices(self.loss_slices))
        except SliceError as exc:
            raise TrainError(f"loss_slices: {exc}") from exc
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise TrainError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        # The optimizer would refuse these only once the model is built (a bare ValueError).
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise TrainError(f"lr must be a finite number > 0, got {self.lr!r}")
        wd = self.weight_decay
        if not (isinstance(wd, (int, float)) and math.isfinite(wd) and wd >= 0):
            raise TrainError(f"weight_decay must be a finite number >= 0, got {wd!r}")

    def options(self) -> dict[str, Any]:
        """Every option but the loader spec, as JSON values (the run record's ``config``)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("loader", "storage_options")
        }

    @classmethod
    def from_record(cls, record: RunRecord, **changes: Any) -> TrainConfig:
        """The config a run was trained with, with ``changes`` (``loader`` may be among them)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(INVOCATION_KEYS)
        options = {k: v for k, v in record.config.items() if k in known}
        options["loader"] = record.loader
        options.update(changes)
        return cls(**options)


@dataclass(kw_only=True)
class TrainResult:
    """What a run did."""

    step: int
    losses: list[float] = field(default_factory=list)
    """Training loss of every step of this invocation, in order."""
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0
    """Block positions processed by all ranks in this invocation."""
    seconds: float = 0.0
    data_seconds: float = 0.0
    """Time this (main) process waited for batches, worker start-up excluded."""
    startup_seconds: float = 0.0
    """Time to the first batch of each epoch (DataLoader workers start, plan built)."""
    step_seconds: list[float] = field(default_factory=list)
    """Wall time of each step of this invocation (data wait included)."""
    wait_seconds: list[float] = field(default_factory=list)
    """Time each step waited for its batch."""
    history: dict = field(default_factory=dict)
    """The whole run's ``{"train": [(step, loss)], "val": [(step, loss)]}``, across resumes."""
    loader_summary: str = ""
    world_size: int = 1
    pools: list[dict] = field(default_factory=list)
    """Per pool, what the whole run was fed (the ledger's fields), at the last step."""
    loss_by: dict[str, dict] = field(default_factory=dict)
    """The loss by provenance last reported: ``{"train"|"val": {group: {"loss", "tokens"}}}``
    (:mod:`tokenloom.train.provenance_loss`)."""
    interrupted: int = 0
    """The signal (SIGINT/SIGTERM) that ended the invocation after checkpointing, else 0."""

    def to_json(self) -> dict[str, Any]:
        """This invocation's figures as JSON values (the per-step timings and the whole run's
        history left out: they are in the checkpoint)."""
        out = dataclasses.asdict(self)
        for key in ("history", "step_seconds", "wait_seconds"):
            out.pop(key)
        out["val_losses"] = [list(v) for v in self.val_losses]
        out["tokens_per_second"] = self.tokens / self.seconds if self.seconds else None
        out["data_wait_share"] = self.data_seconds / self.seconds if self.seconds else None
        return out
