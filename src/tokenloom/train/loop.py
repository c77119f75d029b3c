"""The training loop, top to bottom: loader → model → AdamW → atomic checkpoints → exact resume.

The data is one :class:`~tokenloom.loader.LoaderSpec` (every recipe: concat, best-fit, windows
with cut points, token-quota mixtures). One optimizer step consumes one *global batch* of ``G``
blocks (``spec.global_batch``): ``W`` ranks (``torchrun``) each pack ``G / W`` blocks and run them
as ``K`` micro-batches of ``B`` (gradient accumulation, ``K = G / (B W)``). The loader's global
step *is* the optimizer step and its stream depends on ``G`` only, so a run resumed with another
``W`` or ``B`` continues the same data.

The loss is the sum of cross-entropies over the global batch's target tokens divided by their
global count (all-reduced), so it is the same number whatever the split into ranks and
micro-batches (tested: 2 gloo processes = 1 process).

A checkpoint (``last.pt``, tensors and plain values only) holds the model, the optimizer, the
step, every RNG state, the loader's cursor, the per-pool counts of what was fed and the loss
history; ``last.json`` is its readable :class:`~tokenloom.train.record.RunRecord`. Resuming loads
all of it, so the loss at step k+1 equals the uninterrupted run's (CPU, fp32; tested). A run can
also start from another run's weights (``init_from``) with a new spec: a stage transition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tokenloom.errors import TokenloomError
from tokenloom.loader.spec import LoaderSpec, absolute_uri
from tokenloom.train.checkpoint import (
    load_checkpoint,
    remove_stale_temporaries,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tokenloom.train.dist import Dist
from tokenloom.train.flops import flops_per_token, mfu, peak_flops
from tokenloom.train.model import GPT, attention_mask
from tokenloom.train.record import RunRecord, read_record, write_record

__all__ = [
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "train",
    "save_checkpoint",
    "load_checkpoint",
    "evaluate",
    "lr_at",
    "MODEL_KEYS",
    "SCHEDULE_KEYS",
]

MODEL_KEYS = ("model", "attention")
"""Options a resumed run must share with its checkpoint (the weights depend on them)."""
INVOCATION_KEYS = ("stop_at", "time_limit")
"""Options of one invocation only: a resume does not inherit them from the record."""
SCHEDULE_KEYS = ("steps", "epochs", "lr", "min_lr_ratio", "warmup_steps", "weight_decay")
"""Options that shape the learning-rate schedule: changing one on resume needs ``reschedule``."""


class TrainError(TokenloomError):
    """A training run's options cannot work (or do not match the checkpoint resumed)."""


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
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """Object-store options for the table (credentials): passed to the loader, never written to
    the record or the checkpoint (a resume gives them again, or takes the ``AWS_*``
    environment)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", absolute_uri(self.out))
        if self.init_from is not None:
            object.__setattr__(self, "init_from", absolute_uri(self.init_from))
        if (self.steps is None) == (self.epochs is None):
            raise TrainError("give exactly one of steps and epochs")
        if self.keep_optimizer and not self.init_from:
            raise TrainError("keep_optimizer applies with init_from only")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise TrainError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")

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
    interrupted: int = 0
    """The signal (SIGINT/SIGTERM) that ended the invocation after checkpointing, else 0."""


def _micro_batches(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """``(B, K)``: blocks per micro-batch and micro-batches per step on each of ``world`` ranks."""
    per_rank = cfg.loader.per_rank(world)
    b = cfg.micro_batch_size or per_rank
    if per_rank % b:
        raise TrainError(
            f"--micro-batch-size {b} does not divide the {per_rank} blocks each of {world} "
            f"process(es) gets of the global batch {cfg.loader.global_batch}"
        )
    return b, per_rank // b


def _optimizer(model: GPT, cfg: TrainConfig, fused: bool) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("wpe")]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n.startswith("wpe")]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused or None)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at ``total``."""
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, total // 20)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def _split(batch: dict, accum: int, device: torch.device) -> list[dict]:
    keys = ("input_ids", "labels", "position_ids", "doc_ids")
    parts = {k: batch[k].to(device, non_blocking=True).chunk(accum) for k in keys}
    return [{k: parts[k][i] for k in keys} for i in range(accum)]


class _Run:
    """One invocation of :func:`train` (state shared by its steps)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, log) -> None:  # noqa: ANN001
        self.cfg, self.dist, self.log = cfg, dist, log
        self.micro, self.accum = _micro_batches(cfg, dist.world_size)
        dev = dist.device
        self.kernel = cfg.kernel
        if self.kernel == "auto":
            self.kernel = "flex" if dev.type == "cuda" else "sdpa"
        if self.kernel == "flex" and dev.type != "cuda":
            raise TrainError(
                "--kernel flex trains on CUDA only (PyTorch's flex_attention has no backward "
                "on CPU); use --kernel sdpa (the default off-GPU)"
            )
        dtype = cfg.dtype
        if dtype == "auto":
            dtype = "bf16" if dev.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
        if dtype not in ("bf16", "fp32"):
            raise TrainError(f"dtype must be bf16, fp32 or auto, not {cfg.dtype!r}")
        self.dtype = dtype
        self.autocast = (
            (lambda: torch.autocast(dev.type, dtype=torch.bfloat16))
            if dtype == "bf16"
            else contextlib.nullcontext
        )

    def forward(self, model, mb: dict, reduction: str = "sum"):  # noqa: ANN001, ANN201
        # the mask is built here, outside a compiled model (flex block masks are made eagerly)
        mask = attention_mask(mb["doc_ids"], attention=self.cfg.attention, kernel=self.kernel)
        with self.autocast():
            _, loss = model(
                mb["input_ids"],
                position_ids=mb["position_ids"],
                labels=mb["labels"],
                mask=mask,
                reduction=reduction,
            )
        return loss


def _dataset(
    spec: LoaderSpec,
    dist: Dist,
    storage_options: Mapping[str, str] | None,
    allow_data_change: bool = False,
):  # noqa: ANN202
    from tokenloom.loader import PackedDataset

    return PackedDataset(
        spec,
        rank=dist.rank,
        world_size=dist.world_size,
        storage_options=dict(storage_options) if storage_options else None,
        allow_data_change=allow_data_change,
    )


@torch.no_grad()
def evaluate(run: _Run, model: GPT, spec: LoaderSpec) -> float:
    """Mean loss per target token over the first ``eval_batches`` global validation batches."""
    cfg, dist = run.cfg, run.dist
    val_spec = spec.replace(filter=cfg.val_filter, seed=0, mixture=(), budget_tokens=None)
    ds = _dataset(val_spec, dist, cfg.storage_options)
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dist.device)
    for i, batch in enumerate(ds):
        if i == cfg.eval_batches:
            break
        for mb in _split(batch, run.accum, dist.device):
            total[0] += run.forward(model, mb).double()
            total[1] += (mb["labels"] != -100).sum()
    dist.all_reduce_sum(total)
    model.train(was_training)
    return float(total[0] / total[1]) if total[1] else float("nan")


def _check_resume(cfg: TrainConfig, saved: dict, reschedule: bool) -> None:
    for key in MODEL_KEYS:
        if saved.get(key) != getattr(cfg, key):
            raise TrainError(
                f"the checkpoint was trained with {key}={saved.get(key)!r}, not "
                f"{getattr(cfg, key)!r}; resume with the same {key} or start a new --out"
            )
    if reschedule:
        return
    for key in SCHEDULE_KEYS:
        if key in saved and saved[key] != getattr(cfg, key):
            raise TrainError(
                f"the checkpoint's schedule has {key}={saved[key]!r} but this resume asks for "
                f"{getattr(cfg, key)!r}; drop the option to continue the same schedule, or pass "
                "--reschedule to change it knowingly"
            )


def _prepare_out(cfg: TrainConfig, resume: bool, overwrite: bool, dist: Dist) -> None:
    """Refuse to mix two runs in one directory; clean what a killed save left."""
    ckpt = os.path.join(cfg.out, "last.pt")
    exists = os.path.exists(ckpt) or os.path.exists(os.path.join(cfg.out, "last.json"))
    if resume and not os.path.exists(ckpt):
        raise TrainError(
            f"--resume: no checkpoint in {cfg.out} (no last.pt); start the run without --resume"
        )
    if not resume and exists and not overwrite:
        raise TrainError(
            f"{cfg.out} already holds a run; continue it with `tokenloom train --out {cfg.out} "
            "--resume`, pick another --out, or pass --overwrite to replace it"
        )
    if dist.is_main:
        os.makedirs(cfg.out, exist_ok=True)
        remove_stale_temporaries(cfg.out)
        if overwrite and not resume:
            for name in ("last.pt", "last.json"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(cfg.out, name))
    dist.barrier()


class _Stop:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and ends."""

    def __init__(self) -> None:
        self.requested = False
        self.signal = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested, self.signal = True, signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reschedule: bool = False,
    allow_data_change: bool = False,
    log=print,  # noqa: ANN001
) -> TrainResult:
    """Train (or continue from ``cfg.out`` when ``resume``) up to ``cfg.steps`` optimizer steps
    (or ``cfg.epochs`` epochs). Under ``torchrun`` every rank calls this.

    Args:
        cfg: The run.
        resume: Continue the checkpoint in ``cfg.out`` exactly (its loader cursor must match).
        overwrite: Replace a run already in ``cfg.out`` (otherwise refused).
        reschedule: Let a resume change the schedule (``steps``, ``lr``, ...).
        allow_data_change: Let a resume continue its cursor on other data (another table
            version, filter or tokenizer, or a table rebuilt at the same URI), knowingly.
        log: Where rank 0's log lines go.
    """
    dist = Dist.setup(cfg.device)
    try:
        _prepare_out(cfg, resume, overwrite, dist)
        with _Stop() as stop:
            quiet = log if dist.is_main else _quiet
            return _train(cfg, dist, resume, reschedule, allow_data_change, stop, quiet)
    finally:
        dist.close()


def _quiet(*_: Any) -> None:
    return None


def _parent(cfg: TrainConfig, loader: LoaderSpec) -> tuple[dict | None, dict | None]:
    """``(state, record)`` of ``cfg.init_from`` (weights to start from), checked against the
    new run's tokenizer."""
    if cfg.init_from is None:
        return None, None
    record = read_record(cfg.init_from)
    state = load_checkpoint(os.path.join(cfg.init_from, "last.pt"))
    if record.config.get("model") != cfg.model:
        raise TrainError(
            f"--init-from {cfg.init_from} holds a {record.config.get('model')!r} model, not "
            f"{cfg.model!r}; pass --model {record.config.get('model')}"
        )
    return state, {
        "out": record.out,
        "step": record.step,
        "loader": record.loader.to_dict(),
        "tokenizer": record.tokenizer,
    }


def _load_weights(model: GPT, weights: dict) -> None:
    """Load weights into ``model``, growing or keeping the position table when the block length
    differs (a stage transition to longer blocks keeps the learned positions it has)."""
    weights = dict(weights)
    old = weights["wpe.weight"]
    new = model.wpe.weight
    if old.shape != new.shape:
        grown = new.detach().clone()
        n = min(old.shape[0], new.shape[0])
        grown[:n] = old[:n]
        weights["wpe.weight"] = grown
    model.load_state_dict(weights)


def _fed_totals(loader, dist: Dist):  # noqa: ANN001, ANN202
    """Per-pool counters of everything the run was fed, summed over ranks (a collective)."""
    from tokenloom.loader.ledger import LedgerCounter

    counter = loader.ledger
    if not dist.distributed:
        return counter
    counts = torch.from_numpy(counter.counts.copy()).to(dist.device)
    dist.all_reduce_sum(counts)
    seen = []
    for arr in counter.seen:
        t = torch.from_numpy(arr.astype(np.int32)).to(dist.device)
        dist.all_reduce_sum(t)
        seen.append(t.cpu().numpy())
    total = LedgerCounter(counter.names, counter.universes)
    total.counts = counts.cpu().numpy()
    total.merge_seen(seen)
    return total


def _as_dicts(counter) -> list[dict]:  # noqa: ANN001
    return [dataclasses.asdict(p) for p in counter.pools()]


def _pool_line(pools: list[dict]) -> str:
    return "  ".join(
        f"{p['name']} {p['body_tokens'] / 1e6:.2f}M tok/{p['unique_documents']:,} docs/"
        f"{p['documents_seen_more_than_once']:,} rep"
        for p in pools
    )


def _train(
    cfg: TrainConfig,
    dist: Dist,
    resume: bool,
    reschedule: bool,
    allow_data_change: bool,
    stop: _Stop,
    log,  # noqa: ANN001
) -> TrainResult:  # noqa: ANN001, C901, PLR0912, PLR0915
    from tokenloom.loader import DataLoader

    run = _Run(cfg, dist, log)
    state = load_checkpoint(os.path.join(cfg.out, "last.pt")) if resume else None
    parent_state, parent = _parent(cfg, cfg.loader) if state is None else (None, None)
    spec = cfg.loader
    if state is not None:
        saved = state["config"]
        _check_resume(cfg, saved, reschedule)
        parent = state.get("parent")
        if spec.version is None:  # the pinned version of the checkpoint, after later backfills
            spec = spec.replace(version=state["loader"]["inputs"]["table_version"])
    ds = _dataset(spec, dist, cfg.storage_options, allow_data_change)
    spec = ds.spec  # version pinned
    if state is not None:
        ds.load_state_dict(state["loader"])  # refuses a changed table/filter/tokenizer/batch
    if parent is not None and parent_state is not None:
        if parent["tokenizer"].get("vocab_size") != ds.inputs.tokenizer.get("vocab_size"):
            raise TrainError(
                f"--init-from {cfg.init_from} was trained on tokenizer "
                f"{parent['tokenizer'].get('name')!r} ({parent['tokenizer'].get('vocab_size')} "
                f"ids); the column {spec.token_column!r} holds "
                f"{ds.inputs.tokenizer.get('name')!r} ({ds.inputs.tokenizer.get('vocab_size')})"
            )
    total = cfg.steps
    if cfg.epochs is not None:
        total = sum(ds.epoch_info(e)["steps"] for e in range(cfg.epochs))
    vocab = int(ds.inputs.tokenizer.get("vocab_size") or (int(ds.eos_id) + 1))
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    block = spec.seq_len
    if parent_state is not None:
        block = max(block, int(parent_state["model"]["wpe.weight"].shape[0]))
    if state is not None:
        block = int(state["model"]["wpe.weight"].shape[0])
    raw = GPT.preset(cfg.model, vocab_size=vocab, block_size=block).to(dist.device)
    opt = _optimizer(raw, cfg, fused=dist.device.type == "cuda")
    step, history = 0, {"train": [], "val": []}
    loader = DataLoader(ds, num_workers=cfg.workers, pin_memory=dist.device.type == "cuda")
    if state is not None:
        raw.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        step, history = state["step"], state.get("history", history)
        fed = state.get("fed")
        if fed is not None and dist.is_main:  # the all-rank totals so far continue on rank 0
            loader.ledger.counts = fed["counts"].numpy().copy()
            loader.ledger.merge_seen([t.numpy() for t in fed["seen"]])
    elif parent_state is not None:
        _load_weights(raw, parent_state["model"])
        if cfg.keep_optimizer:
            opt.load_state_dict(parent_state["optimizer"])
            for group in opt.param_groups:
                group["lr"] = cfg.lr
    model = raw
    if cfg.compile:
        model = torch.compile(model)
    if dist.distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None
        )
    per_token = flops_per_token(raw, spec.seq_len)
    peak = peak_flops(dist.device)
    G = spec.global_batch
    if state is None:
        origin = f"; weights from {cfg.init_from} (step {parent['step']})" if parent else ""
        log(
            f"model {cfg.model}: {raw.num_params() / 1e6:.2f}M parameters, vocab {vocab}; "
            f"{dist.world_size} process(es) on {dist.device.type}, {run.dtype}, "
            f"attention {cfg.attention}/{run.kernel}{', compiled' if cfg.compile else ''}; "
            f"global batch {G} blocks x {spec.seq_len} = {G * spec.seq_len:,} tokens "
            f"(B={run.micro}, K={run.accum}); {total} steps{origin}"
        )
        log(f"data: {spec.table} v{spec.version}, {spec.describe()}")
    else:
        log(f"resuming at step {step} of {total} on {dist.world_size} process(es)")
    # which ranks read which blocks from which step on: `tokenloom trace` maps steps to ranks
    history.setdefault("topology", []).append(
        {
            "from_step": step + 1,
            "world_size": dist.world_size,
            "blocks_per_rank": ds.blocks_per_rank,
        }
    )
    result = TrainResult(step=step, world_size=dist.world_size, history=history)
    if cfg.val_filter and step == 0:
        val = evaluate(run, raw, spec)
        result.val_losses.append((0, val))
        history["val"].append((0, val))
        log(f"step {0:>6}  val loss {val:.4f}  (before training)")
    started = last_log = time.perf_counter()
    tokens_since = 0
    it, fresh = iter(loader), True
    model.train()
    end = min(total, cfg.stop_at) if cfg.stop_at else total
    fed = None
    while step < end:
        wait = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # epoch done: the next epoch reshuffles the whole selection
            it, fresh = iter(loader), True
            continue
        waited = time.perf_counter() - wait
        if fresh:  # workers starting: not a stall of the running pipeline
            result.startup_seconds += waited
            fresh = False
        else:
            result.data_seconds += waited
        if cfg.provenance_log:
            _log_provenance(cfg.out, dist.rank, step + 1, batch["spans"])
        micro = _split(batch, run.accum, dist.device)
        counts = torch.tensor(  # target tokens of this rank's share, counted on the host
            [float((batch["labels"] != -100).sum())], dtype=torch.float64, device=dist.device
        )
        targets = max(float(dist.all_reduce_sum(counts)[0]), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, cfg)
        loss_sum = torch.zeros((), dtype=torch.float64, device=dist.device)
        for i, mb in enumerate(micro):
            sync = not dist.distributed or i == run.accum - 1
            ctx = contextlib.nullcontext() if sync else model.no_sync()
            with ctx:
                loss = run.forward(model, mb)
                # DDP averages gradients over ranks; scale so they are d(global mean)/dw
                (loss * (dist.world_size / targets)).backward()
            loss_sum += loss.detach().double()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        value = float(dist.all_reduce_sum(loss_sum) / targets)  # (synchronises the device)
        result.step_seconds.append(time.perf_counter() - wait)
        result.wait_seconds.append(waited)
        if step < end and (cfg.time_limit is not None or stop.requested or dist.distributed):
            over = cfg.time_limit is not None and time.perf_counter() - started > cfg.time_limit
            flag = torch.tensor([float(over or stop.requested)], device=dist.device)
            if float(dist.all_reduce_sum(flag)[0]):  # every rank stops together
                end = step
                result.interrupted = stop.signal
        result.losses.append(value)
        history["train"].append((step, value))
        n_tokens = G * spec.seq_len
        result.tokens += n_tokens
        tokens_since += n_tokens
        if step % cfg.log_every == 0 or step == end:
            fed = _fed_totals(loader, dist)
            now = time.perf_counter()
            rate = tokens_since / max(now - last_log, 1e-9)
            util = mfu(rate / dist.world_size, per_token, peak)
            log(
                f"step {step:>6}  loss {value:.4f}  lr {lr_at(step - 1, total, cfg):.2e}  "
                f"{rate:,.0f} tok/s"
                + (f"  MFU {100 * util:.1f}%" if util is not None else "")
                + f"  | {loader.stats.summary(now - started)}"
            )
            log(f"{'':>13}fed: {_pool_line(_as_dicts(fed))}")
            last_log, tokens_since = now, 0
        if cfg.val_filter and (step % cfg.eval_every == 0 or step == end):
            val = evaluate(run, raw, spec)
            result.val_losses.append((step, val))
            history["val"].append((step, val))
            log(f"step {step:>6}  val loss {val:.4f}")
        if step % cfg.checkpoint_every == 0 or step == end:
            if step % cfg.log_every and step != end:
                fed = _fed_totals(loader, dist)
            _save(cfg, dist, raw, opt, step, loader, ds, history, fed, parent)
    if result.interrupted:
        log(f"stopped by a signal at step {step}: checkpoint written; continue with --resume")
    result.step = step
    result.seconds = time.perf_counter() - started
    result.loader_summary = loader.stats.summary(result.seconds)
    result.pools = _as_dicts(fed) if fed is not None else []
    return result


def _log_provenance(out: str, rank: int, step: int, spans) -> None:  # noqa: ANN001
    with open(os.path.join(out, f"provenance-rank{rank}.jsonl"), "a") as fh:
        fh.write(json.dumps({"step": step, "spans": spans.tolist()}) + "\n")


def _save(cfg, dist, raw, opt, step, loader, ds, history, fed, parent) -> None:  # noqa: ANN001
    """Rank 0 writes the checkpoint (atomically); every rank waits until it is on disk."""
    if dist.is_main:
        save_checkpoint(
            os.path.join(cfg.out, "last.pt"),
            {
                "model": raw.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "rng": rng_state(),
                "loader": loader.state_dict(),
                "config": cfg.options(),
                "history": history,
                "world_size": dist.world_size,
                "parent": parent,
                "fed": {  # what all ranks were fed so far, per pool
                    "counts": torch.from_numpy(fed.counts.copy()),
                    "seen": [torch.from_numpy(s.copy()) for s in fed.seen],
                },
            },
        )
        write_record(
            RunRecord(
                out=cfg.out,
                step=step,
                loader=ds.spec,
                loader_state=loader.state_dict(),
                config=cfg.options(),
                tokenizer=ds.inputs.tokenizer,
                topology=history["topology"],
                world_size=dist.world_size,
                train_loss=history["train"][-1][1] if history["train"] else None,
                val_loss=history["val"][-1][1] if history["val"] else None,
                pools=_as_dicts(fed),
                parent=parent,
            )
        )
    dist.barrier()
