"""GPT-2 with document-isolated attention, built from the loader's batch contract.

A packed block holds several documents. ``doc_ids`` (segment index per position, -1 on padding)
and ``position_ids`` (restarting at each document) are all the model needs: attention is causal
*and* block-diagonal over segments, so no token attends across a document boundary, and learned
positions restart per document. ``attention="causal"`` keeps plain causal attention over the whole
block, for comparison. Shapes are noted as ``(B, T, C)``.

Two kernels build the document mask: ``sdpa`` hands PyTorch's scaled-dot-product attention a
``(B, 1, T, T)`` boolean mask (any device; memory ``O(B T^2)``) up to :data:`DENSE_MASK_MAX`
positions and attends document by document beyond (:mod:`tokenloom.train.segments`, memory
``O(B T)``), and ``flex`` builds a sparse
block mask for ``flex_attention``, which skips fully masked tiles and is fused under
``torch.compile`` (the default on CUDA). Both give the same attention (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenloom.train.presets import PRESETS
from tokenloom.train.segments import DocumentSegments

__all__ = [
    "GPTConfig",
    "PRESETS",
    "GPT",
    "DENSE_MASK_MAX",
    "attention_mask",
    "document_mask",
    "flex_document_mask",
    "generate",
]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Model size; see :data:`PRESETS`."""

    vocab_size: int = 50257
    """Token ids must be below this (GPT-2's BPE: 50,257)."""
    block_size: int = 1024
    """Largest position id + 1 (the loader's ``seq_len`` at most)."""
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, 1, T, T)`` bool: position i may attend to j iff j <= i and both are in the same
    document. Padding (doc id -1) attends only to itself, so no attention row is empty."""
    B, T = doc_ids.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
    eye = torch.eye(T, dtype=torch.bool, device=doc_ids.device)
    pad = (doc_ids < 0)[:, :, None]
    allowed = causal & same & ~pad | (pad & eye)
    return allowed[:, None, :, :]


def flex_document_mask(doc_ids: torch.Tensor):  # noqa: ANN201 (a flex_attention BlockMask)
    """The same rule as :func:`document_mask` as a ``flex_attention`` block mask (tiles that are
    fully masked, e.g. across documents, are skipped). Padding attends causally to padding, which
    only changes padding positions (they carry no loss)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc_ids.shape

    def mask_mod(b, h, q, kv):  # noqa: ANN001, ANN202
        return ((kv <= q) & (doc_ids[b, q] == doc_ids[b, kv])) | (q == kv)

    return create_block_mask(mask_mod, B, None, T, T, device=doc_ids.device)


DENSE_MASK_MAX = 4096
"""Longest block the ``sdpa`` kernel gives a dense ``(B, 1, T, T)`` mask (fastest for short
blocks); longer blocks attend document by document (:class:`DocumentSegments`, memory O(T))."""


def attention_mask(doc_ids: torch.Tensor | None, *, attention: str, kernel: str):  # noqa: ANN201
    """What :class:`GPT` attends with: ``None`` (plain causal), a ``(B, 1, T, T)`` boolean mask
    (``sdpa`` up to :data:`DENSE_MASK_MAX` positions), :class:`DocumentSegments` (``sdpa``,
    longer blocks) or a flex_attention block mask (``flex``)."""
    if attention == "causal":
        return None
    if attention != "document":
        raise ValueError(f"attention must be 'document' or 'causal', not {attention!r}")
    if doc_ids is None:
        raise ValueError("attention='document' needs the batch's doc_ids")
    if kernel == "flex":
        return flex_document_mask(doc_ids)
    if kernel == "sdpa":
        if doc_ids.shape[-1] > DENSE_MASK_MAX:  # a (T, T) mask would grow with T squared
            return DocumentSegments(doc_ids)
        return document_mask(doc_ids)
    raise ValueError(f"kernel must be 'sdpa' or 'flex', not {kernel!r}")


_flex_kernel = None


def _flex_attention(q, k, v, block_mask):  # noqa: ANN001, ANN202
    """``flex_attention``, compiled once on CUDA (eager elsewhere: correct, unfused)."""
    global _flex_kernel
    if _flex_kernel is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_kernel = torch.compile(flex_attention) if q.is_cuda else flex_attention
    return _flex_kernel(q, k, v, block_mask=block_mask)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:  # noqa: ANN001
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if isinstance(mask, DocumentSegments):  # long blocks: attention run by run
            y = mask.attend(q, k, v, self.dropout if self.training else 0.0)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        if mask is not None and not isinstance(mask, torch.Tensor):  # a flex BlockMask
            y = _flex_attention(q, k, v, mask)  # (B, nh, T, hs)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        y = F.scaled_dot_product_attention(  # (B, nh, T, hs)
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:  # noqa: ANN001
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: learned positions, pre-LayerNorm blocks, tied input/output embeddings."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def preset(cls, name: str, **overrides: int) -> GPT:
        """``tiny``, ``small`` (124M) or ``medium`` (350M), with overrides (e.g. vocab_size)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model {name!r}; one of {', '.join(PRESETS)}")
        return cls(GPTConfig(**{**PRESETS[name], **overrides}))

    def num_params(self) -> int:
        """Parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        attention: str = "document",
        kernel: str = "sdpa",
        mask=None,  # noqa: ANN001
        reduction: str = "mean",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``(B, T, V)`` and, with ``labels``, the loss over labels != -100.

        Args:
            attention: ``"document"`` (needs ``doc_ids``): causal within each document only;
                ``"causal"``: plain causal attention over the whole block.
            kernel: ``"sdpa"`` (a dense boolean mask) or ``"flex"`` (a flex_attention block
                mask) for document attention.
            mask: A prebuilt :func:`attention_mask` (the trainer builds it outside a compiled
                model, as flex_attention's block masks want); overrides the three above.
            reduction: ``"mean"`` over target tokens, or ``"sum"`` (the trainer divides by the
                global number of targets, so any split into ranks and micro-batches gives the
                same loss).
        """
        B, T = input_ids.shape  # (B, T)
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        if mask is None:
            mask = attention_mask(doc_ids, attention=attention, kernel=kernel)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)),
                labels.view(-1),
                ignore_index=-100,
                reduction=reduction,
            )
        return logits, loss


@torch.no_grad()
def generate(
    model: GPT,
    ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Sample a continuation of ``ids`` (one document: positions 0.., plain causal attention)."""
    model.eval()
    out = list(ids)
    for _ in range(max_new_tokens):
        ctx = torch.tensor([out[-model.cfg.block_size :]])  # (1, T)
        logits, _ = model(ctx, attention="causal")
        logits = logits[0, -1] / max(temperature, 1e-6)  # (V,)
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if nxt == eos_id:
            break
        out.append(nxt)
    return out[len(ids) :]
