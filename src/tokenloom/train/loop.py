"""The training loop, top to bottom: loader → model → AdamW → atomic checkpoints → exact resume.

A checkpoint holds the model, the optimizer, the step, every RNG state, the loader's cursor (which
pins the table version, filter, tokenizer and block length) and the run's options. Resuming loads
all of it, so the loss at step k+1 equals the uninterrupted run's (CPU, fp32; tested).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from tokenloom.train.model import GPT

__all__ = ["TrainConfig", "TrainResult", "train", "save_checkpoint", "load_checkpoint"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The knobs of a run, each with its reason."""

    table: str
    """The tokenloom table to train from."""
    out: str
    """Checkpoint directory."""
    model: str = "tiny"
    """``tiny`` trains usefully on 2 CPU cores; ``small``/``medium`` are GPT-2 124M/350M."""
    token_column: str = "input_ids"
    filter: str | None = None
    """Training rows (SQL)."""
    val_filter: str | None = None
    """Held-out rows for validation loss (e.g. ``id % 100 = 0``)."""
    seq_len: int = 256
    batch_size: int = 8
    """Blocks per step (per process)."""
    steps: int = 100
    lr: float = 3e-3
    """AdamW learning rate; tiny models like it high."""
    weight_decay: float = 0.1
    seed: int = 0
    """Seeds the model init and the loader's shuffle."""
    attention: str = "document"
    """``document`` isolates documents inside a block; ``causal`` for comparison."""
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 50
    log_every: int = 10


@dataclass(kw_only=True)
class TrainResult:
    """What a run did."""

    step: int
    losses: list[float] = field(default_factory=list)
    """Training loss of every step of this invocation, in order."""
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0


def _dataset(cfg: TrainConfig, filter: str | None, seed: int, version: int | None = None):  # noqa: ANN202
    from tokenloom.loader import PackedDataset

    return PackedDataset(
        cfg.table,
        cfg.token_column,
        filter=filter,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        seed=seed,
        version=version,
    )


def _rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: str, payload: dict) -> None:
    """Write a checkpoint atomically (temporary file, fsync, rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@torch.no_grad()
def _evaluate(model: GPT, cfg: TrainConfig, version: int) -> float:
    ds = _dataset(cfg, cfg.val_filter, seed=0, version=version)
    model.eval()
    losses = []
    for i, b in enumerate(ds):
        if i == cfg.eval_batches:
            break
        _, loss = model(
            b["input_ids"],
            position_ids=b["position_ids"],
            doc_ids=b["doc_ids"],
            labels=b["labels"],
            attention=cfg.attention,
        )
        losses.append(loss.item())
    model.train()
    return float(np.mean(losses)) if losses else float("nan")


def train(cfg: TrainConfig, *, resume: bool = False, log=print) -> TrainResult:  # noqa: ANN001
    """Train (or continue from ``cfg.out/last.pt`` when ``resume``) for ``cfg.steps`` steps."""
    ckpt_path = os.path.join(cfg.out, "last.pt")
    state = load_checkpoint(ckpt_path) if resume and os.path.exists(ckpt_path) else None
    ds = _dataset(
        cfg,
        cfg.filter,
        cfg.seed,
        version=state["loader"]["inputs"]["table_version"] if state else None,
    )
    vocab = int(ds.inputs.tokenizer.get("vocab_size") or (int(ds.eos_id) + 1))
    torch.manual_seed(cfg.seed)
    model = GPT.preset(cfg.model, vocab_size=vocab, block_size=cfg.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        ds.load_state_dict(state["loader"])  # refuses a changed table/filter/tokenizer
        _set_rng_state(state["rng"])
        step = state["step"]
    result = TrainResult(step=step)
    started = time.perf_counter()
    it = iter(ds)
    while step < cfg.steps:
        try:
            batch = next(it)
        except StopIteration:  # epoch done: the next epoch reshuffles the whole selection
            it = iter(ds)
            continue
        _, loss = model(
            batch["input_ids"],
            position_ids=batch["position_ids"],
            doc_ids=batch["doc_ids"],
            labels=batch["labels"],
            attention=cfg.attention,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        result.losses.append(loss.item())
        result.tokens += int(batch["input_ids"].numel())
        if step % cfg.log_every == 0:
            rate = result.tokens / max(time.perf_counter() - started, 1e-9)
            log(
                f"step {step:>6}  loss {loss.item():.4f}  {rate:,.0f} tok/s  | {ds.stats.summary()}"
            )
        if cfg.val_filter and (step % cfg.eval_every == 0 or step == cfg.steps):
            val = _evaluate(model, cfg, ds.version)
            result.val_losses.append((step, val))
            log(f"step {step:>6}  val loss {val:.4f}")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint(
                ckpt_path,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "step": step,
                    "rng": _rng_state(),
                    "loader": ds.state_dict(),
                    "config": asdict(cfg),
                    "tokenizer": ds.inputs.tokenizer,
                },
            )
            with open(os.path.join(cfg.out, "last.json"), "w") as fh:
                json.dump({"step": step, "table_version": ds.version, "filter": cfg.filter}, fh)
    result.step = step
    result.seconds = time.perf_counter() - started
    return result
