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

A checkpoint is one :class:`~tokenloom.train.checkpoint.RunState` (model, optimizer, step, every
RNG state, the loader's cursor, the per-pool counts of what was fed, the loss history and the
readable :class:`~tokenloom.train.record.RunRecord`), written as ``OUT/step-N`` with
``OUT/last.json`` naming it; older ones are kept by ``keep_every``/``keep_last``/``keep_best``
(:mod:`tokenloom.train.retention`). Resuming loads all of it, so the loss at step k+1 equals the
uninterrupted run's (CPU, fp32; tested). A run can also start from another run's weights
(``init_from``: ``RUN``, ``RUN/step-N`` or a ``transformers`` folder) with a new spec: a stage
transition.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.loader.plan.state import ResumeMismatchError
from tokenloom.progress import progress as show_progress
from tokenloom.train.checkpoint import (
    RunState,
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
from tokenloom.train.record import RunRecord
from tokenloom.train.retention import best_step
from tokenloom.train.runs import (
    Parent,
    StopRequest,
    check_resume,
    load_weights,
    parent_run,
    rewind_run,
    run_out,
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
            f"process(es) gets of the global batch {cfg.loader.global_batch}; pass a divisor of "
            f"{per_rank} ({', '.join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0)})"
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
    data_change: str = "refuse",
):  # noqa: ANN202
    from tokenloom.loader import PackedDataset

    return PackedDataset(
        spec,
        rank=dist.rank,
        world_size=dist.world_size,
        storage_options=dict(storage_options) if storage_options else None,
        allow_data_change=allow_data_change,
        data_change=data_change,
    )


@torch.no_grad()
def evaluate(run: _Run, model: GPT, spec: LoaderSpec, by: ProvenanceLoss | None = None) -> float:
    """Mean loss per target token over the first ``eval_batches`` global validation batches
    (``by``: also by provenance, reported by the caller)."""
    cfg, dist = run.cfg, run.dist
    by = by or ProvenanceLoss((), lambda _: None, dist.device)
    # Shuffled even when training follows a curriculum: the first batches must be a fair sample.
    val_spec = spec.replace(
        filter=cfg.val_filter, seed=0, mixture=(), budget_tokens=None, order_by=None, order_jitter=1
    )
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
    data_change: str = "refuse",
    reweight: bool = False,
    exclude: str | None = None,
    rewind: int | None = None,
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
        data_change: On ``resume``, what to do with a table changed since the checkpoint
            (:data:`~tokenloom.loader.plan.change.DATA_CHANGES`): ``"refuse"`` (keep reading the
            checkpoint's version), or ``"continue"``: move to the latest version (or
            ``cfg.loader.version`` when it names another than the checkpoint's) and finish
            the epoch with the rows not yet delivered that still pass plus the new ones
            (:mod:`tokenloom.loader.plan.change`).
        reweight: On ``resume``, ``cfg.loader`` has new mixture shares: keep what each pool was
            fed this epoch and plan the rest of its budget with them (a ``reweight`` change,
            :mod:`~tokenloom.loader.plan.reweight`).
        exclude: On ``resume``, leave the rows of this quarantine (under the run's table) out of
            the rest of the run (an ``exclude`` change, :mod:`~tokenloom.loader.pipeline.exclude`).
        rewind: On ``resume``, first make the kept checkpoint of this step the run's latest
            (the later ones are moved aside, :func:`~tokenloom.train.runs.rewind_run`).
        log: Where rank 0's log lines go.
        warn: Where rank 0's warnings go (default: ``log``).
        progress: Rank 0 shows a step bar or periodic lines on stderr (see
            :mod:`tokenloom.progress`; ``None``: unless silenced).
    """
    if not isinstance(cfg.loader, LoaderSpec):  # an image+text run: the tiny VLM
        return _train_vlm(cfg, resume, overwrite, reschedule, allow_data_change, data_change,
                          reweight, exclude, rewind, log, progress)  # fmt: skip
    dist = Dist.setup(cfg.device)
    try:
        if resume and rewind is not None:
            if dist.is_main:
                moved = rewind_run(cfg.out, rewind)
                where = f"; the later checkpoints are in {moved}" if moved else ""
                log(f"rewound {cfg.out} to its step {rewind}{where}")
            dist.barrier()
        cfg = plan_budget(cfg, resume=resume, log=log if dist.is_main else None)
        with (
            run_out(cfg, resume, overwrite, dist),
            StopRequest() as stop,
            contextlib.ExitStack() as closing,
        ):
            main = dist.is_main
            trainer = _Trainer(
                cfg,
                dist,
                stop,
                log=log if main else _quiet,
                warn=(warn or log) if main else _quiet,
            )
            trainer.setup(
                resume,
                reschedule,
                allow_data_change,
                data_change,
                reweight=reweight,
                exclude=exclude,
            )
            return trainer.run(closing, show=progress if main else False)
    finally:
        dist.close()


def _train_vlm(cfg, resume, overwrite, reschedule, allow_data_change, data_change, reweight,
               exclude, rewind, log, progress) -> TrainResult:  # noqa: ANN001  # fmt: skip
    """An image+text run (:mod:`tokenloom.vision.train`), refusing what applies to tokens."""
    from tokenloom.vision.train import train_vlm

    changes = (
        (data_change != "refuse", "--data-change"),
        (reweight, "--reweight"),
        (exclude is not None, "--exclude"),
        (rewind is not None, "RUN/step-N"),
    )
    for given, flag in changes:
        if given:
            raise TrainError(f"{flag} applies to token runs; an image+text run resumes its "
                             "latest checkpoint as is")  # fmt: skip
    return train_vlm(cfg, resume=resume, overwrite=overwrite, reschedule=reschedule,
                     allow_data_change=allow_data_change, log=log, progress=progress)  # fmt: skip


def _quiet(*_: Any) -> None:
    return None


def _name_data_change(exc: ResumeMismatchError, out: str) -> ResumeMismatchError:
    """``exc`` with the exact way onto a changed table named, where the version changed."""
    if "table_version" not in exc.changes:  # a table rebuilt at the same version: no way on
        return exc
    return ResumeMismatchError(
        f"{exc}; or `tokenloom train --out {out} --resume --data-change continue` to finish the "
        "epoch on the new version with the rows not yet delivered",
        exc.changes,
    )


def _newer_version_note(ds, cfg: TrainConfig, warn) -> None:  # noqa: ANN001
    """Say so when the table has a newer version than the one a resume stays on."""
    from tokenloom.table import Table

    try:
        latest = Table.open(ds.spec.table, storage_options=cfg.storage_options).version
    except Exception:  # noqa: BLE001 - a note only: the run goes on without it
        return
    if latest > ds.version:
        warn(
            f"note: {ds.spec.table} has version {latest}; this run stays on its version "
            f"{ds.version} (pass --data-change continue to move onto the new data)"
        )


class _Trainer:
    """One invocation of :func:`train`, top to bottom: :meth:`setup` (data, model, optimizer,
    restored state), then per step :meth:`one_step` and the after-step actions (:meth:`check_stop`,
    :meth:`maybe_log`, :meth:`maybe_eval`, :meth:`maybe_checkpoint`)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, stop: StopRequest, *, log, warn) -> None:  # noqa: ANN001
        self.cfg, self.dist, self.stop = cfg, dist, stop
        self.log, self.warn = log, warn
        self.began = time.perf_counter()  # the invocation's wall time, start-up included
        self.compute = _Run(cfg, dist, log)
        self.step = 0
        self.history: dict[str, list] = {"train": [], "val": []}
        self.parent: dict | None = None
        self.fed = None  # the all-rank per-pool counters, as of step `fed_step`
        self.fed_step = -1

    # -- setup ------------------------------------------------------------------------------

    def setup(
        self,
        resume: bool,
        reschedule: bool,
        allow_data_change: bool,
        data_change: str = "refuse",
        *,
        reweight: bool = False,
        exclude: str | None = None,
    ) -> None:
        """Open the data, build the model and the optimizer, and restore the checkpoint (on
        ``resume``) or the parent's weights (``init_from``)."""
        cfg = self.cfg
        state = load_checkpoint(cfg.out) if resume else None
        source = parent_run(cfg) if state is None else None
        if state is not None:
            check_resume(cfg, state.config, reschedule)
            self.parent = state.record.parent
        elif source is not None:
            self.parent = source.entry
        self._open_data(state, allow_data_change, data_change, reweight=reweight, exclude=exclude)
        if source is not None:
            _check_parent_tokenizer(cfg, source, self.ds)
        self._build(state, source)
        self._announce(resumed=state is not None)
        # which ranks read which blocks from which step on: `tokenloom trace` maps steps to ranks
        self.history.setdefault("topology", []).append(
            {
                "from_step": self.step + 1,
                "world_size": self.dist.world_size,
                "blocks_per_rank": self.ds.blocks_per_rank,
                "device": self.dist.device.type,
                "device_name": device_name(self.dist.device),
            }
        )

    def _open_data(
        self,
        state: RunState | None,
        allow_data_change: bool,
        data_change: str = "refuse",
        *,
        reweight: bool = False,
        exclude: str | None = None,
    ) -> None:
        """The dataset (at the checkpoint's cursor and pinned version on resume, onto the
        changed table with ``data_change="continue"``, or with a ``reweight``/``exclude``
        change at the cursor) and the schedule's length."""
        cfg, spec = self.cfg, self.cfg.loader
        continuing = state is not None and data_change == "continue"
        saved = state.record.loader_state["inputs"]["table_version"] if state else None
        if continuing and spec.version == saved:
            spec = spec.replace(version=None)  # the latest (the record pins the run's own)
        elif state is not None and spec.version is None and not continuing:
            spec = spec.replace(version=saved)  # the checkpoint's, after later backfills
        ds = _dataset(
            spec,
            self.dist,
            cfg.storage_options,
            allow_data_change,
            data_change if continuing else "refuse",
        )
        if state is not None and (reweight or exclude is not None):
            self._change_stream(ds, state, reweight=reweight, exclude=exclude)
        elif state is not None:
            try:
                ds.load_state_dict(state.record.loader_state)  # refuses another table/filter
            except ResumeMismatchError as exc:
                raise _name_data_change(exc, cfg.out) from None
        if state is not None and not continuing and self.dist.is_main:
            _newer_version_note(ds, cfg, self.warn)
        if ds.change is not None and ds.change.kind == "continue":
            c = ds.change
            self.log(
                f"data change: {spec.table} v{c.version_before} -> v{c.version_after} from step "
                f"{c.global_step + 1} (epoch {c.epoch}, step {c.step} of it): the epoch goes on "
                "with the rows not yet delivered that still pass, and the new ones"
            )
        ds.view()  # refuses an epoch with no step (EmptyEpochError) before anything is built
        self.ds, self.spec = ds, ds.spec  # version pinned
        # the version kept from cleanup (a Lance tag), and the loss by pool and --loss-slice
        self.pins = pin_run(cfg, ds.spec, self.dist, resume=state is not None, warn=self.warn)
        self.groups = ProvenanceLosses.setup(cfg, ds.spec, self.dist.device, self.warn)
        self.total = cfg.steps
        if cfg.epochs is not None:
            self.total = sum(ds.epoch_info(e)["steps"] for e in range(cfg.epochs))
        self.vocab = int(ds.inputs.tokenizer.get("vocab_size") or (int(ds.eos_id) + 1))

    def _change_stream(self, ds, state: RunState, *, reweight: bool, exclude: str | None):  # noqa: ANN001, ANN202
        """Resume ``state`` with a ``reweight`` (``ds`` holds the new mixture) or an ``exclude``
        change at its cursor (:meth:`PackedStream.resume_with_change`), and say what it did."""
        if reweight:
            from tokenloom.loader.plan.reweight import REWEIGHT, check_pools, reweight_params

            old, new = state.record.loader.mixture, ds.spec.mixture
            check_pools(old, new)
            c = ds.resume_with_change(
                state.record.loader_state, REWEIGHT, reweight_params(old, new)
            )
            shares = ", ".join(f"{p.name} {p.share:g}" for p in new)
            self.log(
                f"data: reweighted from step {c.global_step + 1} (epoch {c.epoch}, its step "
                f"{c.step + 1}): the rest of the epoch's budget is planned with {shares}"
            )
        else:
            from tokenloom.loader.pipeline.exclude import EXCLUDE, exclude_params
            from tokenloom.search.quarantine import read_quarantine

            q = read_quarantine(ds.uri, exclude, storage_options=self.cfg.storage_options)
            c = ds.resume_with_change(state.record.loader_state, EXCLUDE, exclude_params(q))
            self.log(
                f"data: excluding quarantine {q.name!r} ({len(q.row_ids):,} rows, {q.tokens:,} "
                f"tokens fed at steps {q.first_step}..{q.last_step}) from step "
                f"{c.global_step + 1} (epoch {c.epoch}, its step {c.step + 1}) on"
            )

    def _build(self, state: RunState | None, source: Parent | None) -> None:
        """Model, optimizer and loader; then the checkpoint's state or the parent's weights."""
        cfg, dist, ds = self.cfg, self.dist, self.ds
        torch.manual_seed(self.spec.seed)  # the same initial weights on every rank
        block = self.spec.seq_len
        if source is not None:
            block = max(block, int(source.weights["wpe.weight"].shape[0]))
        if state is not None:
            block = int(state.model["wpe.weight"].shape[0])
        raw = GPT.preset(cfg.model, vocab_size=self.vocab, block_size=block).to(dist.device)
        self.raw = raw
        self.opt = _optimizer(raw, cfg, fused=dist.device.type == "cuda")
        from tokenloom.loader import DataLoader

        self.loader = DataLoader(  # workers kept from one epoch to the next (~1 s an epoch)
            ds,
            num_workers=cfg.workers,
            persistent_workers=cfg.workers > 0,
            pin_memory=dist.device.type == "cuda",
        )
        if state is not None:
            self._restore(state)
        elif source is not None:
            load_weights(raw, source.weights)
            if cfg.keep_optimizer:
                self.opt.load_state_dict(source.optimizer)
                for group in self.opt.param_groups:
                    group["lr"] = cfg.lr
        self.model = self._wrap(raw)

    def _restore(self, state: RunState) -> None:
        """Continue ``state`` exactly: weights, optimizer, RNG, step, history, fed counts."""
        self.raw.load_state_dict(state.model)
        self.opt.load_state_dict(state.optimizer)
        set_rng_state(state.rng)
        self.step = state.step
        self.history = dict(state.history) or self.history
        if state.fed is not None and self.dist.is_main:  # all-rank totals continue on rank 0
            saved = state.fed["counts"].numpy()
            counts = np.zeros_like(self.loader.ledger.counts)  # an older checkpoint lacks
            counts[:, : saved.shape[1]] = saved  # the newer counters: they start at 0
            self.loader.ledger.counts = counts
            # a change made here moved the ledger onto more rows: carry the counters over
            before = self.ds.planner.previous().run_universes() if self.ds.change else None
            self.loader.ledger.merge_seen([t.numpy() for t in state.fed["seen"]], before)

    def _wrap(self, raw: GPT):  # noqa: ANN202
        model = torch.compile(raw) if self.cfg.compile else raw
        if self.dist.distributed:
            from torch.nn.parallel import DistributedDataParallel

            dev = self.dist.device
            model = DistributedDataParallel(
                model, device_ids=[dev.index] if dev.type == "cuda" else None
            )
        return model

    def _announce(self, resumed: bool) -> None:
        cfg, dist, run, spec, raw = self.cfg, self.dist, self.compute, self.spec, self.raw
        if resumed:
            self.log(
                f"resuming at step {self.step} of {self.total} on {dist.world_size} process(es)"
            )
            return
        parent = self.parent
        at = f" (step {parent['step']})" if parent and parent.get("step") is not None else ""
        origin = f"; weights from {cfg.init_from}{at}" if parent else ""
        G = spec.global_batch
        self.log(
            f"model {cfg.model}: {raw.num_params() / 1e6:.2f}M parameters, vocab {self.vocab}; "
            f"{dist.world_size} process(es) on {dist.device.type}, {run.dtype}, "
            f"attention {cfg.attention}/{run.kernel}{', compiled' if cfg.compile else ''}; "
            f"global batch {G} blocks x {spec.seq_len} = {G * spec.seq_len:,} tokens "
            f"(B={run.micro}, K={run.accum}); {self.total} steps{origin}"
        )
        self.log(f"data: {spec.table} v{spec.version}, {spec.describe()}")
        if self.ds.inputs.left_out():
            self.log(f"data: {self.ds.inputs.left_out()}")
        share = vocab_share(raw)
        if share > SLOW_VOCAB_SHARE:
            tokenizer = self.ds.inputs.tokenizer
            self.warn(_slow_vocab(cfg.model, raw, share, self.vocab, tokenizer, spec))

    # -- the loop ---------------------------------------------------------------------------

    def run(self, closing: contextlib.ExitStack, show: bool | None) -> TrainResult:
        """Train from :attr:`step` to the end of the schedule (or ``stop_at``, a time limit, a
        signal), checkpointing as configured."""
        cfg, dist = self.cfg, self.dist
        self.result = TrainResult(step=self.step, world_size=dist.world_size, history=self.history)
        self.end = min(self.total, cfg.stop_at) if cfg.stop_at else self.total
        self.metrics = closing.enter_context(
            MetricsLog(cfg.out, cfg.log_to if dist.is_main else (), start_step=self.step)
        )
        self.bar = closing.enter_context(
            show_progress("train", total=self.end, unit="steps", initial=self.step, show=show)
        )
        self.log = self.bar.logger(self.log)
        self.per_token = flops_per_token(self.raw, self.spec.seq_len)
        self.peak = peak_flops(dist.device)
        if cfg.val_filter and self.step == 0:
            self._eval(before=True)
        self.started = self.last_log = time.perf_counter()
        self.tokens_since = 0
        self.model.train()
        batches = self._batches()
        try:
            while self.step < self.end:
                batch, waited = next(batches)
                value = self.one_step(batch, waited)
                self.check_stop()
                self.record_step(value)
                self.maybe_log(value)
                new_best = self.maybe_eval()
                self.maybe_checkpoint(new_best)
        finally:
            batches.close()  # the loader's iterator ends here
            self.loader.close()  # and the workers it kept between epochs
        return self._finish()

    def _batches(self) -> Iterator[tuple[dict, float]]:
        """``(batch, seconds waited)`` forever, epoch after epoch (each reshuffled); start-up
        waits (workers starting, the plan) are counted apart from stalls."""
        it, fresh, empty = iter(self.loader), True, 0
        while True:
            wait = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:  # epoch done: the next epoch reshuffles the whole selection
                empty = empty + 1 if fresh else 0
                if empty >= 2:  # a resume at an epoch's end gives one empty pass, never two
                    raise TrainError(
                        f"the loader yielded no batch in {empty} passes in a row at step "
                        f"{self.step}; check the selection with `tokenloom stats`"
                    ) from None
                it, fresh = iter(self.loader), True
                continue
            # until a batch arrives (plan, model, workers starting) a signal ends the run at
            # once; from the first step on it ends at a step boundary, with a checkpoint
            self.stop.defer()
            self._wait_started = wait
            waited = time.perf_counter() - wait
            if fresh:  # workers starting: not a stall of the running pipeline
                self.result.startup_seconds += waited
                fresh = False
            else:
                self.result.data_seconds += waited
            yield batch, waited

    def one_step(self, batch: dict, waited: float) -> float:
        """One optimizer step on one global batch; returns its loss (mean per target token)."""
        cfg, dist, run, model, opt = self.cfg, self.dist, self.compute, self.model, self.opt
        if cfg.provenance_log:
            _log_provenance(cfg.out, dist.rank, self.step + 1, batch["spans"])
        micro = _split(batch, run.accum, dist.device)
        counts = torch.tensor(  # target tokens of this rank's share, counted on the host
            [float((batch["labels"] != -100).sum())], dtype=torch.float64, device=dist.device
        )
        targets = max(float(dist.all_reduce_sum(counts)[0]), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(self.step, self.total, cfg)
        loss_sum = torch.zeros((), dtype=torch.float64, device=dist.device)
        for i, mb in enumerate(micro):
            sync = not dist.distributed or i == run.accum - 1
            ctx = contextlib.nullcontext() if sync else model.no_sync()
            with ctx:
                loss = self.groups.train.take(run.forward(model, mb, self.groups.train.reduction))
                # DDP averages gradients over ranks; scale so they are d(global mean)/dw
                (loss * (dist.world_size / targets)).backward()
            loss_sum += loss.detach().double()
        self.groups.train.add(batch)
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        value = float(dist.all_reduce_sum(loss_sum) / targets)  # (synchronises the device)
        self.result.step_seconds.append(time.perf_counter() - self._wait_started)
        self.result.wait_seconds.append(waited)
        return value

    # -- after each step --------------------------------------------------------------------

    def check_stop(self) -> None:
        """A signal or the time limit ends the run at this step (every rank together)."""
        cfg, dist, stop = self.cfg, self.dist, self.stop
        if self.step < self.end and (
            cfg.time_limit is not None or stop.requested or dist.distributed
        ):
            over = (
                cfg.time_limit is not None and time.perf_counter() - self.started > cfg.time_limit
            )
            flag = torch.tensor([float(over or stop.requested)], device=dist.device)
            if float(dist.all_reduce_sum(flag)[0]):
                self.end = self.step
                self.result.interrupted = stop.signal

    def record_step(self, value: float) -> None:
        """The step's loss and tokens into the result, the history and the progress bar."""
        n_tokens = self.spec.global_batch * self.spec.seq_len
        self.result.losses.append(value)
        self.history["train"].append((self.step, value))
        self.result.tokens += n_tokens
        self.tokens_since += n_tokens
        self.bar.update()
        self.bar.note(f"loss {value:.4f}")

    def maybe_log(self, value: float) -> None:
        """Every ``log_every`` steps (and the last): loss, lr, throughput, MFU, fed per pool."""
        cfg, step = self.cfg, self.step
        if step % cfg.log_every and step != self.end:
            return
        fed = self._fed()
        now = time.perf_counter()
        rate = self.tokens_since / max(now - self.last_log, 1e-9)
        util = mfu(rate / self.dist.world_size, self.per_token, self.peak)
        lr = lr_at(step - 1, self.total, cfg)
        self.log(
            f"step {step:>6}  loss {value:.4f}  lr {lr:.2e}  {rate:,.0f} tok/s"
            + (f"  MFU {100 * util:.1f}%" if util is not None else "")
        )
        self.log(f"{'':>13}{self.loader.stats.summary(now - self.started)}")
        self.log(f"{'':>13}fed: {pool_line(as_dicts(fed))}")
        self.groups.log_train(step, self.dist, self.metrics, self.log, self.history)
        self.metrics.train(
            step,
            loss=value,
            lr=lr,
            tokens_per_second=rate,
            mfu=util,
            elapsed_seconds=now - self.started,
        )
        self.last_log, self.tokens_since = now, 0

    def maybe_eval(self) -> bool:
        """Every ``eval_every`` steps (and the last), with ``val_filter``: the validation loss.
        Returns whether it is the lowest so far (``keep_best`` checkpoints that step)."""
        cfg, step = self.cfg, self.step
        if not cfg.val_filter or (step % cfg.eval_every and step != self.end):
            return False
        val = self._eval()
        return best_step(self.history["val"]) == step and math.isfinite(val)

    def _eval(self, before: bool = False) -> float:
        val = evaluate(self.compute, self.raw, self.spec, self.groups.val)
        self.result.val_losses.append((self.step, val))
        self.history["val"].append((self.step, val))
        self.metrics.val(self.step, val)
        self.log(
            f"step {self.step:>6}  val loss {val:.4f}" + ("  (before training)" if before else "")
        )
        self.groups.log_val(self.step, self.dist, self.metrics, self.log, self.history)
        return val

    def maybe_checkpoint(self, new_best: bool) -> None:
        """Checkpoint every ``checkpoint_every`` steps, at the last step, at the kept steps
        (``keep_every``) and at a new best validation loss (``keep_best``)."""
        cfg, step = self.cfg, self.step
        due = step % cfg.checkpoint_every == 0 or step == self.end
        due = due or bool(cfg.keep_every and step % cfg.keep_every == 0)
        if due or (cfg.keep_best and new_best):
            self.checkpoint()

    def _fed(self):  # noqa: ANN202
        """Per-pool counters summed over ranks (a collective), computed once per step."""
        if self.fed_step != self.step:
            self.fed, self.fed_step = fed_totals(self.loader, self.dist), self.step
        return self.fed

    def checkpoint(self) -> None:
        """Rank 0 writes the run state (atomically, :func:`save_checkpoint`); every rank waits
        until it is on disk."""
        cfg, dist = self.cfg, self.dist
        fed = self._fed()
        self.history["topology"][-1].update(
            to_step=self.step, wall_seconds=time.perf_counter() - self.began
        )
        if dist.is_main:
            history = self.history
            record = RunRecord(
                out=cfg.out,
                step=self.step,
                loader=self.ds.spec,
                loader_state=self.loader.state_dict(),
                config=cfg.options(),
                tokenizer=self.ds.inputs.tokenizer,
                topology=history["topology"],
                world_size=dist.world_size,
                train_loss=history["train"][-1][1] if history["train"] else None,
                val_loss=history["val"][-1][1] if history["val"] else None,
                val_loss_by=history["val_by"][-1][1] if history.get("val_by") else {},
                pools=as_dicts(fed),
                parent=self.parent,
                pins=self.pins,
            )
            state = RunState(
                record=record,
                model=self.raw.state_dict(),
                optimizer=self.opt.state_dict(),
                rng=rng_state(),
                fed={  # what all ranks were fed so far, per pool
                    "counts": torch.from_numpy(fed.counts.copy()),
                    "seen": [torch.from_numpy(s.copy()) for s in fed.seen],
                },
                history=history,
            )
            save_checkpoint(
                state,
                keep_every=cfg.keep_every,
                keep_last=cfg.keep_last,
                keep_best=cfg.keep_best,
            )
        dist.barrier()

    def _finish(self) -> TrainResult:
        result = self.result
        if result.interrupted:
            self.log(
                f"stopped by a signal at step {self.step}: checkpoint written; continue with "
                "--resume"
            )
        result.step = self.step
        result.seconds = time.perf_counter() - self.started
        result.loader_summary = self.loader.stats.summary(result.seconds)
        result.pools = as_dicts(self.fed) if self.fed is not None else []
        result.loss_by = self.groups.last(self.history)
        return result


def _check_parent_tokenizer(cfg: TrainConfig, source: Parent, ds) -> None:  # noqa: ANN001
    """Refuse ``init_from`` weights whose vocabulary is not the token column's."""
    tokenizer = ds.inputs.tokenizer
    if source.is_hf:
        from tokenloom.train.hf import check_hf_tokenizer

        check_hf_tokenizer(cfg.init_from, tokenizer)
        rows = int(source.weights["wte.weight"].shape[0])
        if rows != int(tokenizer.get("vocab_size") or 0):
            raise TrainError(
                f"--init-from {cfg.init_from} has {rows:,} embedding rows but the column's "
                f"tokenizer {tokenizer.get('name')!r} has {tokenizer.get('vocab_size')} ids; "
                "tokenloom needs one row per id"
            )
        return
    theirs = source.entry["tokenizer"]
    if theirs.get("vocab_size") != tokenizer.get("vocab_size"):
        raise TrainError(
            f"--init-from {cfg.init_from} was trained on tokenizer {theirs.get('name')!r} "
            f"({theirs.get('vocab_size')} ids); the column {cfg.loader.token_column!r} holds "
            f"{tokenizer.get('name')!r} ({tokenizer.get('vocab_size')})"
        )


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
