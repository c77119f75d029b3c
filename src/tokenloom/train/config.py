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
from tokenloom.loader.plan.spec import LoaderSpec, absolute_uri
from tokenloom.train.metrics import parse_log_to
from tokenloom.train.presets import PRESETS
from tokenloom.train.record import RunRecord

__all__ = [
    "MODEL_KEYS",
    "INVOCATION_KEYS",
    "SCHEDULE_KEYS",
    "TrainError",
    "BudgetError",
    "TrainConfig",
    "TrainResult",
    "knob",
    "knobs",
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


def knob(
    default: Any,
    help: str,  # noqa: A002 - the CLI's word for it
    *,
    choices: tuple[str, ...] | None = None,
    min: float | None = None,  # noqa: A002
    max: float | None = None,  # noqa: A002
    min_open: bool = False,
    metavar: str | None = None,
    flag: str | None = None,
    multiple: bool = False,
) -> Any:
    """A trainer option: its default, its one-line ``--help`` text and its rule (``choices``, a
    range), declared once. ``tokenloom train`` builds its ``--name`` option from these
    (:func:`knobs`) and :meth:`TrainConfig.__post_init__` checks the rule, so a new knob is one
    field. ``flag`` names the option when it is not ``--field-name``; ``multiple`` makes it
    repeatable (each value a string the config parses)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "min_open": min_open}
    meta.update(metavar=metavar, flag=flag, multiple=multiple)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The knobs of a run, each with its reason. The data is :attr:`loader`, whole."""

    loader: LoaderSpec
    """What the run trains on: table, version, filter, block length, global batch, seed,
    packing recipe, mixture (:class:`~tokenloom.loader.LoaderSpec`)."""
    out: str
    """Run directory (``last.json`` and the ``step-N`` checkpoints); stored absolute."""
    model: str = knob("tiny", "Model size.", choices=tuple(PRESETS))
    """``tiny`` trains usefully on 2 CPU cores; ``small``/``medium`` are GPT-2 124M/350M."""
    val_filter: str | None = knob(None, "Held-out rows for val loss.", metavar="SQL")
    """Held-out rows for validation loss (e.g. ``id % 100 = 0``), read with the loader's
    other options, seed 0 and no mixture."""
    micro_batch_size: int | None = knob(
        None,
        "Blocks per forward pass per process B [default: the process's whole share, G/W]; "
        "K = G / (B x processes) micro-batches are accumulated per step.",
        min=1,
    )
    """Blocks per forward pass per process ``B``; ``None``: the rank's whole share ``G / W``
    (no accumulation). ``K = G / (B W)`` micro-batches make one optimizer step."""
    steps: int | None = knob(100, "Optimizer steps.", min=1)
    """Optimizer steps in all (a resumed run continues up to this)."""
    epochs: int | None = knob(None, "Instead of --steps: whole passes over the selection.", min=1)
    """Instead of ``steps``: whole passes over the selection (each reshuffled)."""
    stop_at: int | None = knob(
        None,
        "End this invocation at this step (checkpointed); the schedule still runs to --steps.",
        min=1,
    )
    """End this invocation after this step (checkpointed), as a preempted job would; the
    learning-rate schedule still runs to ``steps`` and ``--resume`` continues."""
    time_limit: float | None = knob(
        None,
        "End this invocation (checkpointed) after this much training time.",
        min=0,
        metavar="SECONDS",
    )
    """End this invocation (checkpointed) once this many seconds of training have passed."""
    lr: float = knob(3e-3, "Peak learning rate.", min=0, min_open=True)
    """Peak AdamW learning rate; tiny models like it high."""
    min_lr_ratio: float = knob(0.1, "Cosine decay ends at lr x this.", min=0, max=1)
    """Cosine decay ends at ``lr * min_lr_ratio``."""
    warmup_steps: int | None = knob(
        None, "Linear warm-up steps [default: 5% of the steps, at least 1].", min=0
    )
    """Linear warm-up; default 5% of the steps (at least 1)."""
    weight_decay: float = knob(0.1, "AdamW weight decay (matrices only).", min=0)
    """On matrices only (not biases, LayerNorms or the position embedding)."""
    grad_clip: float = knob(1.0, "Clip the gradient norm to this (0: no clipping).", min=0)
    """Gradient-norm clipping; 0 turns it off."""
    attention: str = knob(
        "document", "Document-isolated attention, or plain causal.", choices=("document", "causal")
    )
    """``document`` isolates documents inside a block; ``causal`` for comparison."""
    kernel: str = knob(
        "auto",
        "Document-mask kernel (auto: flex_attention on CUDA, SDPA mask otherwise).",
        choices=("auto", "sdpa", "flex"),
    )
    """``sdpa`` (dense mask), ``flex`` (flex_attention block mask) or ``auto`` (flex on CUDA)."""
    device: str = knob("auto", "auto, cpu, cuda, cuda:1, ...")
    """``auto``: ``cuda:LOCAL_RANK`` when a GPU is visible, else ``cpu``."""
    dtype: str = knob("auto", "Autocast dtype (auto: bf16 on a GPU that has it).",
                      choices=("auto", "bf16", "fp32"))  # fmt: skip
    """``bf16`` autocast or ``fp32``; ``auto``: bf16 on a GPU that supports it, fp32 on CPU."""
    compile: bool = knob(False, "torch.compile the model.")
    """``torch.compile`` the model (worth it on GPU for runs longer than the compile)."""
    workers: int = knob(0, "DataLoader workers (0: read in the training process).", min=0)
    """DataLoader workers (0: read and pack in the training process)."""
    eval_every: int = knob(50, "Validation loss every this many steps.", min=1)
    """Steps between validation losses (with ``val_filter``)."""
    eval_batches: int = knob(4, "Global validation batches per evaluation.", min=1)
    """Global validation batches per evaluation (the same rows every time)."""
    checkpoint_every: int = knob(50, "Write a checkpoint every this many steps.", min=1)
    """Steps between checkpoints (the last step, a stop and the kept steps are written too)."""
    keep_every: int | None = knob(
        None,
        "Also keep RUN/step-N at every multiple N of this (immutable; N is the global step).",
        min=1,
        metavar="N",
    )
    """Steps whose checkpoint is never deleted (``RUN/step-N`` for N a multiple of this); they
    are written even between ``checkpoint_every`` steps."""
    keep_last: int = knob(1, "Keep the K most recent checkpoints (the latest among them).",
                          min=1, metavar="K")  # fmt: skip
    """How many of the most recent checkpoints survive a new one (older ones are deleted unless
    another rule keeps them)."""
    keep_best: bool = knob(
        False, "Keep the checkpoint of the lowest val loss (needs --val-filter)."
    )
    """Keep the checkpoint with the lowest validation loss; a new best is checkpointed at the
    step it is measured, so it needs ``val_filter``."""
    log_every: int = knob(10, "Log a line every this many steps.", min=1)
    """Steps between log lines (and metric rows)."""
    provenance_log: bool = knob(
        False, "Each rank appends OUT/provenance-rankR.jsonl (what `tokenloom trace` recomputes)."
    )
    """Each rank appends ``provenance-rank{R}.jsonl``: the loader's provenance of every step.
    Not needed by ``tokenloom trace`` (it recomputes it); an audit trail to check that against."""
    init_from: str | None = knob(
        None,
        "Start from a run's weights (RUN or RUN/step-N) or a transformers GPT-2 folder (a new "
        "stage: new data, schedule and step count).",
        metavar="RUN",
    )
    """Start from this checkpoint's weights (``RUN``, ``RUN/step-N`` or a ``transformers``
    GPT-2 folder): a stage transition; the data, schedule and step start anew. The new run's
    record names it as its parent."""
    keep_optimizer: bool = knob(False, "With --init-from: keep its optimizer moments too.")
    """With ``init_from``: also take its optimizer state (moments), not only the weights."""
    total_budget_tokens: int | None = knob(
        None,
        "Cap the tokens (block positions) of the whole lineage, --init-from runs included: "
        "the run plans the steps that remain (--steps only lowers them).",
        min=1,
        metavar="N",
    )
    """Cap on the block positions the whole lineage trains on (this run plus every run it
    started from, carried through ``init_from``): the run plans the steps that remain;
    ``steps``, when not ``None`` (its default 100 included), only lowers them. See
    :mod:`tokenloom.train.lineage`."""
    loss_slices: tuple[tuple[str, str], ...] = knob(
        (),
        "Also report the training and validation loss of the rows under SQL as NAME "
        "(e.g. \"code=source = 'python_stdlib'\"); repeatable. Mixture pools are reported always.",
        metavar="NAME=SQL",
        flag="--loss-slice",
        multiple=True,
    )
    """Named SQL slices ``(name, filter)`` whose training and validation loss is reported
    beside each mixture pool's (:mod:`tokenloom.train.provenance_loss`)."""
    log_to: tuple[str, ...] = knob(
        (),
        "Also write the logged metrics to: csv (OUT/metrics.csv), tensorboard (OUT/tensorboard/); "
        "comma-separated.",
        metavar="SINKS",
    )
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
        if self.loss_slices and self.loader.group is not None:
            raise TrainError(
                "loss_slices reads each stretch's table row, and a grouped run's stretches are "
                "groups of files: drop --loss-slice, or drop --group-by"
            )
        # The optimizer would refuse these only once the model is built (a bare ValueError).
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise TrainError(f"lr must be a finite number > 0, got {self.lr!r}")
        wd = self.weight_decay
        if not (isinstance(wd, (int, float)) and math.isfinite(wd) and wd >= 0):
            raise TrainError(f"weight_decay must be a finite number >= 0, got {wd!r}")
        for f in knobs(type(self)):
            _check_rule(f, getattr(self, f.name))
        if self.keep_best and not self.val_filter:
            raise TrainError(
                "keep_best keeps the checkpoint of the lowest validation loss, and this run has "
                "no validation: give val_filter (--val-filter SQL, with --eval-every N), or drop "
                "--keep-best"
            )

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


def knobs(cls: type | None = None) -> list[dataclasses.Field]:
    """The options of ``cls`` (:class:`TrainConfig`) declared with :func:`knob`, in order."""
    return [f for f in dataclasses.fields(cls or TrainConfig) if "help" in f.metadata]


def _check_rule(f: dataclasses.Field, value: Any) -> None:
    """Refuse ``value`` for knob ``f`` when it breaks the knob's rule (naming the knob)."""
    meta = f.metadata
    if value is None or isinstance(value, bool):
        return
    if meta["choices"] is not None and value not in meta["choices"]:
        raise TrainError(f"{f.name} must be one of {', '.join(meta['choices'])}, not {value!r}")
    if not isinstance(value, (int, float)):
        return
    low, high = meta["min"], meta["max"]
    if low is not None and (value < low or (meta["min_open"] and value == low)):
        rule = ">" if meta["min_open"] else ">="
        raise TrainError(f"{f.name} must be {rule} {low:g}, got {value!r}")
    if high is not None and value > high:
        raise TrainError(f"{f.name} must be <= {high:g}, got {value!r}")


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
