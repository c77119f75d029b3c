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
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import torch

from tokenloom.loader.spec import LoaderSpec
from tokenloom.progress import progress as show_progress
from tokenloom.train.checkpoint import (
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tokenloom.train.config import (
    MODEL_KEYS,
    SCHEDULE_KEYS,
    TrainConfig,
    TrainError,
    TrainResult,
)
from tokenloom.train.dist import Dist, device_name
from tokenloom.train.fed import as_dicts, fed_totals, pool_line
from tokenloom.train.flops import (
    SLOW_VOCAB_SHARE,
    flops_per_token,
    mfu,
    peak_flops,
    vocab_for_share,
    vocab_share,
)
from tokenloom.train.lineage import plan_budget
from tokenloom.train.metrics import MetricsLog
from tokenloom.train.model import GPT, attention_mask
from tokenloom.train.pins import pin_run
from tokenloom.train.provenance_loss import ProvenanceLoss, ProvenanceLosses
from tokenloom.train.record import RunRecord, write_record
from tokenloom.train.runs import (
    StopRequest,
    check_resume,
    load_weights,
    parent_run,
    prepare_out,
)

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
def evaluate(run: _Run, model: GPT, spec: LoaderSpec, by: ProvenanceLoss | None = None) -> float:
    """Mean loss per target token over the first ``eval_batches`` global validation batches
    (``by``: also by provenance, reported by the caller)."""
    cfg, dist = run.cfg, run.dist
    by = by or ProvenanceLoss((), lambda _: None, dist.device)
    val_spec = spec.replace(filter=cfg.val_filter, seed=0, mixture=(), budget_tokens=None)
    ds = _dataset(val_spec, dist, cfg.storage_options)
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dist.device)
    for i, batch in enumerate(ds):
        if i == cfg.eval_batches:
            break
        for mb in _split(batch, run.accum, dist.device):
            total[0] += by.take(run.forward(model, mb, by.reduction)).double()
            total[1] += (mb["labels"] != -100).sum()
        by.add(batch)
    dist.all_reduce_sum(total)
    model.train(was_training)
    return float(total[0] / total[1]) if total[1] else float("nan")


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reschedule: bool = False,
    allow_data_change: bool = False,
    log=print,  # noqa: ANN001
    warn=None,  # noqa: ANN001
    progress: bool | None = None,
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
        warn: Where rank 0's warnings go (default: ``log``).
        progress: Rank 0 shows a step bar or periodic lines on stderr (see
            :mod:`tokenloom.progress`; ``None``: unless silenced).
    """
    dist = Dist.setup(cfg.device)
    try:
        cfg = plan_budget(cfg, resume=resume, log=log if dist.is_main else None)
        prepare_out(cfg, resume, overwrite, dist)
        with StopRequest() as stop, contextlib.ExitStack() as closing:
            main = dist.is_main
            say = log if main else _quiet
            warns = (warn or log) if main else _quiet
            show = progress if main else False
            return _train(
                cfg, dist, resume, reschedule, allow_data_change, stop, closing, say, warns, show
            )
    finally:
        dist.close()


def _quiet(*_: Any) -> None:
    return None


def _train(
    cfg: TrainConfig,
    dist: Dist,
    resume: bool,
    reschedule: bool,
    allow_data_change: bool,
    stop: StopRequest,
    closing: contextlib.ExitStack,
    log,  # noqa: ANN001
    warn,  # noqa: ANN001
    show: bool | None,
) -> TrainResult:  # noqa: ANN001, C901, PLR0912, PLR0915
    from tokenloom.loader import DataLoader

    began = time.perf_counter()  # the invocation's wall time, start-up included
    run = _Run(cfg, dist, log)
    state = load_checkpoint(os.path.join(cfg.out, "last.pt")) if resume else None
    parent_state, parent = parent_run(cfg, cfg.loader) if state is None else (None, None)
    spec = cfg.loader
    if state is not None:
        saved = state["config"]
        check_resume(cfg, saved, reschedule)
        parent = state.get("parent")
        if spec.version is None:  # the pinned version of the checkpoint, after later backfills
            spec = spec.replace(version=state["loader"]["inputs"]["table_version"])
    ds = _dataset(spec, dist, cfg.storage_options, allow_data_change)
    spec = ds.spec  # version pinned
    if state is not None:
        ds.load_state_dict(state["loader"])  # refuses a changed table/filter/tokenizer/batch
    ds.view()  # refuses an epoch with no step (EmptyEpochError) before anything is built
    pins = pin_run(cfg, spec, dist, resume=resume, warn=warn)  # the version kept from cleanup
    groups = ProvenanceLosses.setup(cfg, spec, dist.device, warn)  # --loss-slice, pools
    if parent is not None and parent_state is not None and parent.get("format") == "hf":
        from tokenloom.train.hf import check_hf_tokenizer

        check_hf_tokenizer(cfg.init_from, ds.inputs.tokenizer)
        rows = int(parent_state["model"]["wte.weight"].shape[0])
        if rows != int(ds.inputs.tokenizer.get("vocab_size") or 0):
            raise TrainError(
                f"--init-from {cfg.init_from} has {rows:,} embedding rows but the column's "
                f"tokenizer {ds.inputs.tokenizer.get('name')!r} has "
                f"{ds.inputs.tokenizer.get('vocab_size')} ids; tokenloom needs one row per id"
            )
    elif parent is not None and parent_state is not None:
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
        load_weights(raw, parent_state["model"])
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
    G = spec.global_batch
    if state is None:
        at = f" (step {parent['step']})" if parent and parent.get("step") is not None else ""
        origin = f"; weights from {cfg.init_from}{at}" if parent else ""
        log(
            f"model {cfg.model}: {raw.num_params() / 1e6:.2f}M parameters, vocab {vocab}; "
            f"{dist.world_size} process(es) on {dist.device.type}, {run.dtype}, "
            f"attention {cfg.attention}/{run.kernel}{', compiled' if cfg.compile else ''}; "
            f"global batch {G} blocks x {spec.seq_len} = {G * spec.seq_len:,} tokens "
            f"(B={run.micro}, K={run.accum}); {total} steps{origin}"
        )
        log(f"data: {spec.table} v{spec.version}, {spec.describe()}")
        if ds.inputs.left_out():
            log(f"data: {ds.inputs.left_out()}")
        share = vocab_share(raw)
        if share > SLOW_VOCAB_SHARE:
            warn(_slow_vocab(cfg.model, raw, share, vocab, ds.inputs.tokenizer, spec))
    else:
        log(f"resuming at step {step} of {total} on {dist.world_size} process(es)")
    # which ranks read which blocks from which step on: `tokenloom trace` maps steps to ranks
    history.setdefault("topology", []).append(
        {
            "from_step": step + 1,
            "world_size": dist.world_size,
            "blocks_per_rank": ds.blocks_per_rank,
            "device": dist.device.type,
            "device_name": device_name(dist.device),
        }
    )
    result = TrainResult(step=step, world_size=dist.world_size, history=history)
    end = min(total, cfg.stop_at) if cfg.stop_at else total
    metrics = closing.enter_context(
        MetricsLog(cfg.out, cfg.log_to if dist.is_main else (), start_step=step)
    )
    bar = closing.enter_context(
        show_progress("train", total=end, unit="steps", initial=step, show=show)
    )
    log = bar.logger(log)
    per_token = flops_per_token(raw, spec.seq_len)
    peak = peak_flops(dist.device)
    if cfg.val_filter and step == 0:
        val = evaluate(run, raw, spec, groups.val)
        result.val_losses.append((0, val))
        history["val"].append((0, val))
        metrics.val(0, val)
        log(f"step {0:>6}  val loss {val:.4f}  (before training)")
        groups.log_val(0, dist, metrics, log, history)
    started = last_log = time.perf_counter()
    tokens_since = 0
    it, fresh = iter(loader), True
    model.train()
    fed = None
    empty = 0  # passes in a row that yielded no batch (the planner refuses an empty epoch)
    while step < end:
        wait = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # epoch done: the next epoch reshuffles the whole selection
            empty = empty + 1 if fresh else 0
            if empty >= 2:  # a resume at an epoch's end gives one empty pass, never two
                raise TrainError(
                    f"the loader yielded no batch in {empty} passes in a row at step {step}; "
                    "check the selection with `tokenloom stats`"
                ) from None
            it, fresh = iter(loader), True
            continue
        # until a batch arrives (plan, model, workers starting) a signal ends the run at once;
        # from the first step on it ends at a step boundary, with a checkpoint
        stop.defer()
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
                loss = groups.train.take(run.forward(model, mb, groups.train.reduction))
                # DDP averages gradients over ranks; scale so they are d(global mean)/dw
                (loss * (dist.world_size / targets)).backward()
            loss_sum += loss.detach().double()
        groups.train.add(batch)
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
        bar.update()
        bar.note(f"loss {value:.4f}")
        if step % cfg.log_every == 0 or step == end:
            fed = fed_totals(loader, dist)
            now = time.perf_counter()
            rate = tokens_since / max(now - last_log, 1e-9)
            util = mfu(rate / dist.world_size, per_token, peak)
            log(
                f"step {step:>6}  loss {value:.4f}  lr {lr_at(step - 1, total, cfg):.2e}  "
                f"{rate:,.0f} tok/s" + (f"  MFU {100 * util:.1f}%" if util is not None else "")
            )
            log(f"{'':>13}{loader.stats.summary(now - started)}")
            log(f"{'':>13}fed: {pool_line(as_dicts(fed))}")
            groups.log_train(step, dist, metrics, log, history)
            metrics.train(
                step,
                loss=value,
                lr=lr_at(step - 1, total, cfg),
                tokens_per_second=rate,
                mfu=util,
                elapsed_seconds=now - started,
            )
            last_log, tokens_since = now, 0
        if cfg.val_filter and (step % cfg.eval_every == 0 or step == end):
            val = evaluate(run, raw, spec, groups.val)
            result.val_losses.append((step, val))
            history["val"].append((step, val))
            metrics.val(step, val)
            log(f"step {step:>6}  val loss {val:.4f}")
            groups.log_val(step, dist, metrics, log, history)
        if step % cfg.checkpoint_every == 0 or step == end:
            if step % cfg.log_every and step != end:
                fed = fed_totals(loader, dist)
            history["topology"][-1].update(to_step=step, wall_seconds=time.perf_counter() - began)
            _save(cfg, dist, raw, opt, step, loader, ds, history, fed, parent, pins)
    if result.interrupted:
        log(f"stopped by a signal at step {step}: checkpoint written; continue with --resume")
    result.step = step
    result.seconds = time.perf_counter() - started
    result.loader_summary = loader.stats.summary(result.seconds)
    result.pools = as_dicts(fed) if fed is not None else []
    result.loss_by = groups.last(history)
    return result


def _slow_vocab(model: str, raw: GPT, share: float, vocab: int, tokenizer: dict, spec) -> str:  # noqa: ANN001
    """The warning for a vocabulary that dominates the model, with the commands to a smaller
    tokenizer (tokenloom's own byte-level BPE, trained on the table)."""
    size = vocab_for_share(raw)
    rest = raw.num_params() - raw.wte.weight.numel()
    smaller = size * raw.cfg.n_embd / (rest + size * raw.cfg.n_embd)
    name = tokenizer.get("name") or "?"
    column = f"{spec.token_column}_bpe{size}"
    return (
        f"warning: the vocabulary is {share:.0%} of the {model} model's "
        f"{raw.num_params() / 1e6:.2f}M parameters ({vocab:,} ids of tokenizer {name}, in the "
        "embedding and the tied LM head), so the LM head, not the transformer, takes most of "
        f"each step. A {size:,}-id byte-level BPE trained on the table would be {smaller:.0%} of "
        f"it: `tokenloom tokenizer train --table {spec.table} --vocab-size {size} --out "
        f"bpe{size}/`, `tokenloom tokenize --table {spec.table} --tokenizer bpe{size}/ --column "
        f"{column}`, then train with `--column {column}` (tokenloom's tokenizers: gpt2 with "
        "50,257 ids, a BPE of any size from `tokenloom tokenizer train`, tiktoken encodings, "
        "tokenizer.json files)"
    )


def _log_provenance(out: str, rank: int, step: int, spans) -> None:  # noqa: ANN001
    with open(os.path.join(out, f"provenance-rank{rank}.jsonl"), "a") as fh:
        fh.write(json.dumps({"step": step, "spans": spans.tolist()}) + "\n")


def _save(cfg, dist, raw, opt, step, loader, ds, history, fed, parent, pins) -> None:  # noqa: ANN001
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
                val_loss_by=history["val_by"][-1][1] if history.get("val_by") else {},
                pools=as_dicts(fed),
                parent=parent,
                pins=pins,
            )
        )
    dist.barrier()
