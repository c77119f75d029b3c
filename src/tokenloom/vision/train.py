"""``tokenloom train`` on an image+text table: the tiny VLM trained from an
:class:`~tokenloom.vision.ImageTextSpec`, with the text trainer's run record, checkpoints, exact
resume, metrics sinks and signals.

The run is a :class:`~tokenloom.train.config.TrainConfig` whose ``loader`` is an
:class:`ImageTextSpec`; :func:`tokenloom.train.loop.train` hands it here. One optimizer step
consumes one global step of ``G`` blocks (``W`` ranks each build ``G / W``); the loss is the sum
of cross-entropies over the global batch's response tokens divided by their global count. A
checkpoint is the same :class:`~tokenloom.train.checkpoint.RunState` (weights, AdamW, every RNG,
the loader's cursor and ledger, the loss history) with the same
:class:`~tokenloom.train.record.RunRecord` (its ``loader`` the image+text spec), so ``--resume``
continues exactly: the loss at step k+1 equals the uninterrupted run's (CPU, fp32; tested).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn import functional as F

from tokenloom.progress import progress as show_progress
from tokenloom.train.checkpoint import (
    RunState,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tokenloom.train.config import TrainConfig, TrainError, TrainResult
from tokenloom.train.dist import Dist, device_name
from tokenloom.train.metrics import MetricsLog
from tokenloom.train.presets import PRESETS
from tokenloom.train.record import RunRecord
from tokenloom.train.runs import StopRequest, check_resume, run_out
from tokenloom.vision.spec import ImageTextSpec

__all__ = ["train_vlm", "UNSUPPORTED"]

UNSUPPORTED = {
    "val_filter": "--val-filter",
    "init_from": "--init-from",
    "total_budget_tokens": "--total-budget-tokens",
    "loss_slices": "--loss-slice",
    "provenance_log": "--provenance-log",
    "compile": "--compile",
    "keep_best": "--keep-best",
}
"""Trainer options the image+text run does not take (refused, naming the option)."""


def _check(cfg: TrainConfig) -> None:
    for key, flag in UNSUPPORTED.items():
        if getattr(cfg, key) not in (None, False, ()):
            raise TrainError(
                f"{flag} applies to token tables; an image+text run (--image-column) trains "
                f"the tiny VLM without it: drop {flag}"
            )
    if cfg.kernel == "flex":
        raise TrainError("--kernel flex is for token tables; the VLM uses the SDPA mask")


def _lr(step: int, total: int, cfg: TrainConfig) -> float:
    from tokenloom.train.loop import lr_at

    return lr_at(step, total, cfg)


class _VLMRun:
    """One invocation (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, stop: StopRequest, log: Any) -> None:
        self.cfg, self.dist, self.stop, self.log = cfg, dist, stop, log
        self.step = 0
        self.history: dict[str, list] = {"train": [], "val": []}

    def setup(self, resume: bool, reschedule: bool, allow_data_change: bool) -> None:
        from tokenloom.vision.iterable import ImageTextDataset
        from tokenloom.vision.loader import ImageTextLoader
        from tokenloom.vision.vlm import TinyVLM, VLMConfig

        cfg, dist = self.cfg, self.dist
        state = load_checkpoint(cfg.out) if resume else None
        spec: ImageTextSpec = cfg.loader  # type: ignore[assignment]
        if state is not None:
            check_resume(cfg, state.config, reschedule)
            if spec.version is None:  # the checkpoint's, after later backfills
                saved = state.record.loader_state["inputs"]["table_version"]
                spec = spec.replace(version=saved)
        self.ds = ImageTextDataset(
            spec,
            rank=dist.rank,
            world_size=dist.world_size,
            threads=0 if cfg.workers else 2,
            storage_options=dict(cfg.storage_options) if cfg.storage_options else None,
            allow_data_change=allow_data_change,
        )
        if state is not None:
            self.ds.load_state_dict(state.record.loader_state)
            if not dist.is_main:  # the record holds every rank's totals: they continue on rank 0
                self.ds.counts, self.ds.skipped = Counter(), Counter()
        self.spec = self.ds.spec
        from tokenloom.train.pins import pin_run

        # the version kept from gc and Lance's cleanup (a tag), as for a token run
        self.pins = pin_run(cfg, self.spec, dist, resume=state is not None, warn=self.log)
        per_rank = self.ds.per_rank
        if cfg.micro_batch_size not in (None, per_rank):
            raise TrainError(
                f"--micro-batch-size {cfg.micro_batch_size}: an image+text run takes each "
                f"process's whole share ({per_rank} blocks) per step; drop the option"
            )
        self.total = cfg.steps
        if cfg.epochs is not None:
            self.total = sum(self.ds.steps(e) for e in range(cfg.epochs))
        torch.manual_seed(self.spec.seed)  # the same initial weights on every rank
        size = PRESETS[cfg.model]
        vcfg = VLMConfig(
            vocab_size=max(self.ds.vocab_size, self.ds.eos_id + 1),
            patch_dim=self.spec.grid.patch_dim,
            block_size=self.spec.budget,
            **size,
        )
        self.raw = TinyVLM(vcfg).to(dist.device)
        decay = [p for p in self.raw.parameters() if p.dim() >= 2]
        rest = [p for p in self.raw.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": rest, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95),
        )  # fmt: skip
        self.loader = ImageTextLoader(self.ds, num_workers=cfg.workers)
        if state is not None:
            self.raw.load_state_dict(state.model)
            self.opt.load_state_dict(state.optimizer)
            set_rng_state(state.rng)
            self.step = state.step
            self.history = dict(state.history) or self.history
        self.model = self.raw
        if dist.distributed:
            from torch.nn.parallel import DistributedDataParallel

            dev = dist.device
            self.model = DistributedDataParallel(
                self.raw, device_ids=[dev.index] if dev.type == "cuda" else None
            )
        self.history.setdefault("topology", []).append(
            {
                "from_step": self.step + 1,
                "world_size": dist.world_size,
                "blocks_per_rank": per_rank,
                "device": dist.device.type,
                "device_name": device_name(dist.device),
            }
        )
        if state is not None:
            self.log(
                f"resuming at step {self.step} of {self.total} on {dist.world_size} process(es)"
            )
        else:
            n = sum(p.numel() for p in self.raw.parameters())
            self.log(
                f"model {cfg.model} VLM: {n / 1e6:.2f}M parameters, vocab {vcfg.vocab_size}; "
                f"{dist.world_size} process(es) on {dist.device.type}; global batch "
                f"{self.spec.global_batch} blocks x {self.spec.budget} positions; {self.total} "
                "steps"
            )
        plan = self.ds.plan_ledger()
        self.log(
            f"data: {self.spec.table} v{self.ds.version}, {self.spec.describe()}; epoch "
            f"{self.ds.epoch}: {plan['samples']:,} samples in {plan['blocks']:,} blocks, "
            f"padding {plan['padding_share']:.1%} planned, {plan['dropped_samples']} too long"
        )

    def _batches(self) -> Iterator[tuple[dict, float]]:
        it, fresh = iter(self.loader), True
        while True:
            started = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                if fresh:
                    raise TrainError(
                        f"the image+text loader yielded no batch at step {self.step}"
                    ) from None
                it, fresh = iter(self.loader), True
                continue
            self.stop.defer()
            waited = time.perf_counter() - started
            if fresh:
                self.result.startup_seconds += waited
            else:
                self.result.data_seconds += waited
            fresh = False
            yield batch, waited

    def one_step(self, batch: dict) -> float:
        dist, cfg = self.dist, self.cfg
        dev = dist.device
        keys = ("input_ids", "image_mask", "patches", "position_ids", "doc_ids", "labels")
        t = {k: torch.from_numpy(batch[k]).to(dev) for k in keys}
        count = torch.tensor([float((t["labels"] != -100).sum())], dtype=torch.float64, device=dev)
        targets = max(float(dist.all_reduce_sum(count)[0]), 1.0)
        for group in self.opt.param_groups:
            group["lr"] = _lr(self.step, self.total, cfg)
        labels = t.pop("labels")
        logits, _ = self.model(**t)
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), labels.view(-1), reduction="sum"
        )
        (loss * (dist.world_size / targets)).backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        total = dist.all_reduce_sum(loss.detach().double().reshape(1))
        return float(total[0] / targets)

    def run(self, closing: contextlib.ExitStack, show: bool | None) -> TrainResult:
        cfg, dist = self.cfg, self.dist
        self.result = TrainResult(step=self.step, world_size=dist.world_size, history=self.history)
        end = min(self.total, cfg.stop_at) if cfg.stop_at else self.total
        metrics = closing.enter_context(
            MetricsLog(cfg.out, cfg.log_to if dist.is_main else (), start_step=self.step)
        )
        bar = closing.enter_context(
            show_progress("train", total=end, unit="steps", initial=self.step, show=show)
        )
        log = bar.logger(self.log)
        started = last = time.perf_counter()
        since = 0
        self.raw.train()
        batches = self._batches()
        while self.step < end:
            batch, waited = next(batches)
            value = self.one_step(batch)
            self.result.step_seconds.append(time.perf_counter() - started)
            self.result.wait_seconds.append(waited)
            over = cfg.time_limit is not None and time.perf_counter() - started > cfg.time_limit
            if self.step < end and (over or self.stop.requested or dist.distributed):
                flag = torch.tensor([float(over or self.stop.requested)], device=dist.device)
                if float(dist.all_reduce_sum(flag)[0]):
                    end = self.step
                    self.result.interrupted = self.stop.signal
            positions = self.spec.global_batch * self.spec.budget
            self.result.losses.append(value)
            self.history["train"].append((self.step, value))
            self.result.tokens += positions
            since += positions
            bar.update()
            bar.note(f"loss {value:.4f}")
            if self.step % cfg.log_every == 0 or self.step == end:
                now = time.perf_counter()
                rate = since / max(now - last, 1e-9)
                led = self.ds.ledger()
                share = led["padding"] / max(led["blocks"] * self.spec.budget, 1)
                lr = _lr(self.step - 1, self.total, cfg)
                log(f"step {self.step:>6}  loss {value:.4f}  lr {lr:.2e}  {rate:,.0f} pos/s")
                log(
                    f"{'':>13}fed (rank {dist.rank}): {led['blocks']:,} blocks, "
                    f"{led['images']:,} images, {led['image_tokens']:,} image tokens, "
                    f"{led['text_tokens']:,} text tokens, padding {share:.1%}, "
                    f"{led['skipped']} skipped"
                )
                metrics.train(self.step, loss=value, lr=lr, tokens_per_second=rate,
                              elapsed_seconds=now - started)  # fmt: skip
                last, since = now, 0
            if (
                self.step % cfg.checkpoint_every == 0
                or self.step == end
                or (cfg.keep_every and self.step % cfg.keep_every == 0)
            ):
                self.checkpoint(started)
        batches.close()
        if self.result.interrupted:
            self.log(f"stopped by a signal at step {self.step}: checkpoint written; continue "
                     "with --resume")  # fmt: skip
        self.result.step = self.step
        self.result.seconds = time.perf_counter() - started
        led = self.ds.ledger()
        self.result.loader_summary = (
            f"{led['blocks']} blocks, {led['images']} images, {led['image_tokens']} image "
            f"tokens, {led['text_tokens']} text tokens, {led['padding']} padding, "
            f"{led['skipped']} skipped"
        )
        return self.result

    def loader_state(self) -> dict:
        """The loader's state for the record, its ledger what every rank delivered (summed: a
        collective; each rank counts its own blocks, and a resume continues the totals on rank
        0)."""
        state = self.loader.state_dict()
        if self.dist.distributed:
            counts: Counter = Counter()
            skipped: Counter = Counter()
            for c, k in self.dist.gather_objects((dict(self.ds.counts), dict(self.ds.skipped))):
                counts.update(c)
                skipped.update(k)
            state["ledger"], state["skipped"] = dict(counts), dict(skipped)
        return state

    def checkpoint(self, started: float) -> None:
        cfg, dist = self.cfg, self.dist
        self.history["topology"][-1].update(
            to_step=self.step, wall_seconds=time.perf_counter() - started
        )
        loader_state = self.loader_state()  # every rank takes part
        if dist.is_main:
            hist = self.history
            record = RunRecord(
                out=cfg.out,
                step=self.step,
                loader=self.spec,  # type: ignore[arg-type]
                loader_state=loader_state,
                config=cfg.options(),
                tokenizer=self.ds.tokenizer,
                topology=hist["topology"],
                world_size=dist.world_size,
                train_loss=hist["train"][-1][1] if hist["train"] else None,
                pins=self.pins,
            )
            state = RunState(
                record=record,
                model=self.raw.state_dict(),
                optimizer=self.opt.state_dict(),
                rng=rng_state(),
                history=hist,
            )
            save_checkpoint(state, keep_every=cfg.keep_every, keep_last=cfg.keep_last)
        dist.barrier()


def train_vlm(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reschedule: bool = False,
    allow_data_change: bool = False,
    log: Any = print,
    progress: bool | None = None,
) -> TrainResult:
    """Train (or continue ``cfg.out``) the tiny VLM on ``cfg.loader``, an
    :class:`~tokenloom.vision.ImageTextSpec`, up to ``cfg.steps`` steps (or ``cfg.epochs``).

    Raises:
        TrainError: An option that does not apply to an image+text run (named), or a resume
            whose model or schedule differ.
    """
    if not isinstance(cfg.loader, ImageTextSpec):
        raise TrainError(f"train_vlm trains from an ImageTextSpec, not {type(cfg.loader)}")
    _check(cfg)
    dist = Dist.setup(cfg.device)
    try:
        with (
            run_out(cfg, resume, overwrite, dist),
            StopRequest() as stop,
            contextlib.ExitStack() as closing,
        ):
            quiet = lambda *_: None  # noqa: E731 - the other ranks say nothing
            run = _VLMRun(cfg, dist, stop, log if dist.is_main else quiet)
            run.setup(resume, reschedule, allow_data_change)
            return run.run(closing, show=progress if dist.is_main else False)
    finally:
        dist.close()
