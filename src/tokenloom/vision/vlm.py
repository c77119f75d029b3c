"""A tiny VLM: a patch embedding in front of tokenloom's GPT, trained on packed image+text blocks.

The vision encoder is the minimum that shows the contract end to end: one linear layer from a
flattened patch (``patch*patch*3`` values) to the model width plus a learned embedding of the
patch's place in the block. Image positions take those vectors instead of token embeddings;
attention is the GPT's document mask from ``doc_ids`` (no sample sees another), and the loss is
on response tokens only (the block's ``labels``). :func:`train_steps` trains a few steps on CPU;
``tokenloom train`` trains it from an image+text table (:mod:`tokenloom.vision.train`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from tokenloom.train.model import GPT, GPTConfig, document_mask

__all__ = ["TinyVLM", "VLMConfig", "train_steps", "TrainReport"]


@dataclass(frozen=True, kw_only=True)
class VLMConfig:
    """Model size (a GPT ``tiny`` by default), the vocabulary and the patch size it reads."""

    vocab_size: int
    """Ids of the token columns' tokenizer (:attr:`ImageTextDataset.vocab_size`)."""
    patch_dim: int = 16 * 16 * 3
    """Values per flattened patch."""
    block_size: int = 256
    """Positions per block (the packer's budget)."""
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128


class TinyVLM(nn.Module):
    """Patch embedding + GPT (see the module docstring)."""

    def __init__(self, cfg: VLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gpt = GPT(
            GPTConfig(
                vocab_size=cfg.vocab_size,
                block_size=cfg.block_size,
                n_layer=cfg.n_layer,
                n_head=cfg.n_head,
                n_embd=cfg.n_embd,
            )
        )
        self.patch_embed = nn.Sequential(
            nn.LayerNorm(cfg.patch_dim), nn.Linear(cfg.patch_dim, cfg.n_embd)
        )

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        image_mask: torch.Tensor,  # (B, T) bool
        patches: torch.Tensor,  # (image positions, patch_dim), in (b, t) order
        position_ids: torch.Tensor,  # (B, T)
        doc_ids: torch.Tensor,  # (B, T)
        labels: torch.Tensor | None = None,  # (B, T)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        g = self.gpt
        x = g.wte(input_ids)  # (B, T, C)
        if patches.shape[0]:
            x = x.masked_scatter(image_mask[..., None], self.patch_embed(patches).to(x.dtype))
        x = g.drop(x + g.wpe(position_ids))
        mask = document_mask(doc_ids)  # (B, 1, T, T): causal within a sample only
        for block in g.blocks:
            x = block(x, mask)
        logits = g.lm_head(g.ln_f(x))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))
        return logits, loss


@dataclass
class TrainReport:
    """Losses of a short run."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0
    """Positions with a loss (response tokens and EOS)."""


def train_steps(
    model: TinyVLM, batches: Iterable[dict], *, steps: int, lr: float = 3e-3, seed: int = 0
) -> TrainReport:
    """Train ``steps`` optimizer steps on numpy batches from
    :class:`~tokenloom.vision.ImageTextDataset` (cycled if shorter)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    report = TrainReport()
    started = time.perf_counter()
    model.train()
    done = 0
    while done < steps:
        got_any = False
        for b in batches:
            got_any = True
            t = {k: torch.from_numpy(b[k]) for k in ("input_ids", "image_mask", "patches")}
            t |= {k: torch.from_numpy(b[k]) for k in ("position_ids", "doc_ids", "labels")}
            _, loss = model(**t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            report.losses.append(loss.item())
            report.tokens += int((t["labels"] != -100).sum())
            done += 1
            if done >= steps:
                break
        if not got_any:
            raise ValueError("no batch to train on: the loader produced no step")
    report.seconds = time.perf_counter() - started
    return report
