"""The training loop, top to bottom: loader → model → AdamW → atomic checkpoints → exact resume.

One optimizer step consumes one *global batch* of ``G = B * K * W`` blocks: ``W`` ranks
(``torchrun``), each reading ``B * K`` blocks per loader step and running them as ``K``
micro-batches of ``B`` (gradient accumulation). The loader is built with ``batch_size = B * K``,
so its global step *is* the optimizer step and its stream depends on ``G`` only: a run resumed
with another ``W`` and ``K`` (same ``G``, e.g. via ``global_batch_size``) continues the same data.

The loss is the sum of cross-entropies over the global batch's target tokens divided by their
global count (all-reduced), so it is the same number whatever the split into ranks and
micro-batches (tested: 2 gloo processes = 1 process).

A checkpoint holds the model, the optimizer, the step, every RNG state, the loader's cursor (which
pins the table version, filter, tokenizer, block length and global batch), the run's options and
its loss history. Resuming loads all of it, so the loss at step k+1 equals the uninterrupted run's
(CPU, fp32; tested).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from tokenloom.errors import TokenloomError
from tokenloom.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from tokenloom.train.dist import Dist
from tokenloom.train.flops import flops_per_token, mfu, peak_flops
from tokenloom.train.model import GPT, attention_mask

__all__ = [
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "train",
    "save_checkpoint",
    "load_checkpoint",
    "evaluate",
]

_MODEL_KEYS = ("model", "token_column", "attention")  # must match on resume


class TrainError(TokenloomError):
    """A training run's options cannot work (or do not match the checkpoint resumed)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The knobs of a run, each with its reason."""

    table: str
    """The tokenloom table to train from."""
    out: str
    """Checkpoint directory (``last.pt``, ``last.json``, ``log.jsonl``)."""
    model: str = "tiny"
    """``tiny`` trains usefully on 2 CPU cores; ``small``/``medium`` are GPT-2 124M/350M."""
    token_column: str = "input_ids"
    filter: str | None = None
    """Training rows (SQL)."""
    val_filter: str | None = None
    """Held-out rows for validation loss (e.g. ``id % 100 = 0``)."""
    seq_len: int = 256
    batch_size: int = 8
    """Micro-batch ``B``: blocks per forward pass per process."""
    grad_accum: int = 1
    """Micro-batches ``K`` per optimizer step: a larger global batch without more memory."""
    global_batch_size: int | None = None
    """Blocks per optimizer step ``G``; when set, ``K = G / (B * W)`` (so a run resumed on
    another number of processes keeps its data stream)."""
    steps: int | None = 100
    """Optimizer steps in all (a resumed run continues up to this)."""
    stop_at: int | None = None
    """End this invocation after this step (checkpointed), as a preempted job would; the
    learning-rate schedule still runs to ``steps`` and ``--resume`` continues."""
    time_limit: float | None = None
    """End this invocation (checkpointed) once this many seconds of training have passed."""
    epochs: int | None = None
    """Instead of ``steps``: whole passes over the selection (each reshuffled)."""
    lr: float = 3e-3
    """Peak AdamW learning rate; tiny models like it high."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at ``lr * min_lr_ratio``."""
    warmup_steps: int | None = None
    """Linear warm-up; default 5% of the steps (at least 1)."""
    weight_decay: float = 0.1
    """On matrices only (not biases, LayerNorms or the position embedding)."""
    grad_clip: float = 1.0
    seed: int = 0
    """Seeds the model init and the loader's shuffle."""
    block_order: str = "interleave"
    """Each global batch takes one block from each of G far-apart stretches of the shuffled
    stream, so a long document spreads over consecutive steps instead of filling one batch
    (``sequential``: G consecutive blocks)."""
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


def _micro_batches(cfg: TrainConfig, world: int) -> int:
    if cfg.global_batch_size is None:
        return cfg.grad_accum
    per_pass = cfg.batch_size * world
    if cfg.global_batch_size % per_pass:
        raise TrainError(
            f"--global-batch-size {cfg.global_batch_size} is not a multiple of --batch-size "
            f"{cfg.batch_size} x {world} processes"
        )
    return cfg.global_batch_size // per_pass


def _dataset(cfg: TrainConfig, dist: Dist, accum: int, *, filter, seed, version=None):  # noqa: ANN001, ANN202
    from tokenloom.loader import PackedDataset

    return PackedDataset(
        cfg.table,
        cfg.token_column,
        filter=filter,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size * accum,
        seed=seed,
        version=version,
        rank=dist.rank,
        world_size=dist.world_size,
        block_order=cfg.block_order,
    )


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
        self.accum = _micro_batches(cfg, dist.world_size)
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


@torch.no_grad()
def evaluate(run: _Run, model: GPT, version: int) -> float:
    """Mean loss per target token over the first ``eval_batches`` global validation batches."""
    cfg, dist = run.cfg, run.dist
    ds = _dataset(cfg, dist, run.accum, filter=cfg.val_filter, seed=0, version=version)
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


def _check_resume(cfg: TrainConfig, saved: dict) -> None:
    for key in _MODEL_KEYS:
        if saved.get(key) != getattr(cfg, key):
            raise TrainError(
                f"the checkpoint was trained with {key}={saved.get(key)!r}, not "
                f"{getattr(cfg, key)!r}; resume with the same {key} or start a new --out"
            )


def train(cfg: TrainConfig, *, resume: bool = False, log=print) -> TrainResult:  # noqa: ANN001
    """Train (or continue from ``cfg.out/last.pt`` when ``resume``) up to ``cfg.steps`` optimizer
    steps (or ``cfg.epochs`` epochs). Under ``torchrun`` every rank calls this."""
    dist = Dist.setup(cfg.device)
    try:
        return _train(cfg, dist, resume, log if dist.is_main else (lambda *_: None))
    finally:
        dist.close()


def _train(cfg: TrainConfig, dist: Dist, resume: bool, log) -> TrainResult:  # noqa: ANN001, C901, PLR0915
    from tokenloom.loader import DataLoader

    if (cfg.steps is None) == (cfg.epochs is None):
        raise TrainError("give exactly one of steps and epochs")
    run = _Run(cfg, dist, log)
    ckpt_path = os.path.join(cfg.out, "last.pt")
    state = load_checkpoint(ckpt_path) if resume and os.path.exists(ckpt_path) else None
    if state is not None:
        _check_resume(cfg, state["config"])
    ds = _dataset(
        cfg,
        dist,
        run.accum,
        filter=cfg.filter,
        seed=cfg.seed,
        version=state["loader"]["inputs"]["table_version"] if state else None,
    )
    if state is not None:
        ds.load_state_dict(state["loader"])  # refuses a changed table/filter/tokenizer/batch
    total = cfg.steps
    if cfg.epochs is not None:
        total = sum(ds.epoch_info(e)["steps"] for e in range(cfg.epochs))
    vocab = int(ds.inputs.tokenizer.get("vocab_size") or (int(ds.eos_id) + 1))
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    raw = GPT.preset(cfg.model, vocab_size=vocab, block_size=cfg.seq_len).to(dist.device)
    opt = _optimizer(raw, cfg, fused=dist.device.type == "cuda")
    step, history = 0, {"train": [], "val": []}
    if state is not None:
        raw.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        step, history = state["step"], state.get("history", history)
    model = raw
    if cfg.compile:
        model = torch.compile(model)
    if dist.distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None
        )
    loader = DataLoader(ds, num_workers=cfg.workers, pin_memory=dist.device.type == "cuda")
    per_token = flops_per_token(raw, cfg.seq_len)
    peak = peak_flops(dist.device)
    global_blocks = cfg.batch_size * run.accum * dist.world_size
    if step == 0 or state is None:
        log(
            f"model {cfg.model}: {raw.num_params() / 1e6:.2f}M parameters, vocab {vocab}; "
            f"{dist.world_size} process(es) on {dist.device.type}, {run.dtype}, "
            f"attention {cfg.attention}/{run.kernel}{', compiled' if cfg.compile else ''}; "
            f"global batch {global_blocks} blocks x {cfg.seq_len} = "
            f"{global_blocks * cfg.seq_len:,} tokens (B={cfg.batch_size}, K={run.accum}); "
            f"{total} steps"
        )
    else:
        log(f"resuming at step {step} of {total} on {dist.world_size} process(es)")
    # which ranks read which blocks from which step on: `tokenloom trace` maps steps to ranks
    history.setdefault("topology", []).append(
        {
            "from_step": step + 1,
            "world_size": dist.world_size,
            "blocks_per_rank": cfg.batch_size * run.accum,
        }
    )
    result = TrainResult(step=step, world_size=dist.world_size, history=history)
    if cfg.val_filter and step == 0:
        val = evaluate(run, raw, ds.version)
        result.val_losses.append((0, val))
        history["val"].append((0, val))
        log(f"step {0:>6}  val loss {val:.4f}  (before training)")
    os.makedirs(cfg.out, exist_ok=True)
    started = last_log = time.perf_counter()
    tokens_since = 0
    it, fresh = iter(loader), True
    model.train()
    end = min(total, cfg.stop_at) if cfg.stop_at else total
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
        if cfg.time_limit is not None and step < end:
            over = torch.tensor([float(time.perf_counter() - started > cfg.time_limit)])
            if float(dist.all_reduce_sum(over.to(dist.device))[0]):  # every rank stops together
                end = step
        result.losses.append(value)
        history["train"].append((step, value))
        n_tokens = global_blocks * cfg.seq_len
        result.tokens += n_tokens
        tokens_since += n_tokens
        if step % cfg.log_every == 0 or step == end:
            now = time.perf_counter()
            rate = tokens_since / max(now - last_log, 1e-9)
            util = mfu(rate / dist.world_size, per_token, peak)
            log(
                f"step {step:>6}  loss {value:.4f}  lr {lr_at(step - 1, total, cfg):.2e}  "
                f"{rate:,.0f} tok/s"
                + (f"  MFU {100 * util:.1f}%" if util is not None else "")
                + f"  | {loader.stats.summary(now - started)}"
            )
            last_log, tokens_since = now, 0
        if cfg.val_filter and (step % cfg.eval_every == 0 or step == end):
            val = evaluate(run, raw, ds.version)
            result.val_losses.append((step, val))
            history["val"].append((step, val))
            log(f"step {step:>6}  val loss {val:.4f}")
        if step % cfg.checkpoint_every == 0 or step == end:
            _save(cfg, dist, raw, opt, step, loader, ds, history)
    result.step = step
    result.seconds = time.perf_counter() - started
    result.loader_summary = loader.stats.summary(result.seconds)
    return result


def _log_provenance(out: str, rank: int, step: int, spans) -> None:  # noqa: ANN001
    with open(os.path.join(out, f"provenance-rank{rank}.jsonl"), "a") as fh:
        fh.write(json.dumps({"step": step, "spans": spans.tolist()}) + "\n")


def _save(cfg, dist, raw, opt, step, loader, ds, history) -> None:  # noqa: ANN001
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
                "config": asdict(cfg),
                "tokenizer": ds.inputs.tokenizer,
                "history": history,
                "world_size": dist.world_size,
            },
        )
        tmp = os.path.join(cfg.out, "last.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(
                {
                    "step": step,
                    "table_version": ds.version,
                    "filter": cfg.filter,
                    "world_size": dist.world_size,
                    "train_loss": history["train"][-1][1] if history["train"] else None,
                    "val_loss": history["val"][-1][1] if history["val"] else None,
                    "config": asdict(cfg),
                    "loader": loader.state_dict(),
                    "tokenizer": ds.inputs.tokenizer,
                    "topology": history["topology"],
                },
                fh,
            )
        os.replace(tmp, os.path.join(cfg.out, "last.json"))
    dist.barrier()
