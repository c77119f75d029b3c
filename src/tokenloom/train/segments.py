"""Document-isolated causal attention without a ``(T, T)`` mask: memory proportional to tokens.

The documents packed in a block are contiguous runs of ``doc_ids`` (the batch contract numbers a
block's stretches 0, 1, 2, ... and marks padding ``-1``), so attention that stays inside a
document and is causal is plain causal attention over each run. :class:`DocumentSegments` finds
the runs once per batch (every layer reuses them) and groups them by length rounded up to a power
of two: the runs of a group are gathered into one ``(m, nh, n, hs)`` batch and go through
``scaled_dot_product_attention(is_causal=True)``, whose fused kernels never build ``T x T``
scores. Rounding a run up is exact: the extra positions come after the run's last query, and a
causal query never sees a later key; their outputs are dropped. Padding attends only to itself,
so its output is its own value, as under :func:`~tokenloom.train.model.document_mask` (the dense
reference this is tested against).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["DocumentSegments", "MIN_BUCKET"]

MIN_BUCKET = 64
"""Shortest padded run length: shorter documents share one batched call instead of one each."""


class DocumentSegments:
    """The document runs of a ``(B, T)`` ``doc_ids`` batch, grouped for batched attention.

    Args:
        doc_ids: ``(B, T)`` int segment ids, ``-1`` on padding; each document one contiguous
            run per block.

    Raises:
        ValueError: A document id appears in two separate runs of a block (not the batch
            contract: documents packed in a block are contiguous).
    """

    def __init__(self, doc_ids: torch.Tensor) -> None:
        B, T = doc_ids.shape
        self.shape = (B, T)
        flat = doc_ids.reshape(-1)
        pos = torch.arange(B * T, device=doc_ids.device)
        # a run starts at each block start and wherever the id changes
        starts_mask = (pos % T == 0) | torch.cat(
            [torch.ones(1, dtype=torch.bool, device=flat.device), flat[1:] != flat[:-1]]
        )
        starts = pos[starts_mask]
        lengths = torch.diff(starts, append=torch.tensor([B * T], device=flat.device))
        ids = flat[starts]
        real = ids >= 0
        row = starts // T
        # ids of a block's document runs must increase: a repeated id would be one document
        # split in two runs, which the dense rule lets attend across
        r_ids, r_row = ids[real], row[real]
        if r_ids.numel() > 1 and bool(
            ((r_row[1:] == r_row[:-1]) & (r_ids[1:] <= r_ids[:-1])).any()
        ):
            raise ValueError("a document appears in two separate runs of a block")
        self.padding = ~(flat >= 0)  # (B*T,) positions that attend only to themselves
        s, n = starts[real], lengths[real]
        bucket = (2 ** torch.ceil(torch.log2(n.double()))).long().clamp(min=MIN_BUCKET, max=T)
        self.groups: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Per padded length ``N``: ``(m, N)`` gather index (clamped to the batch) and ``(m, N)``
        bool keep (the run's own positions)."""
        for size in torch.unique(bucket).tolist():
            pick = bucket == size
            first = s[pick]
            offs = torch.arange(size, device=flat.device)
            index = first[:, None] + offs[None, :]  # (m, N)
            keep = offs[None, :] < n[pick][:, None]
            self.groups.append((index.clamp(max=B * T - 1), keep))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0
    ) -> torch.Tensor:
        """``(B, nh, T, hs)`` document-isolated causal attention of ``(B, nh, T, hs)`` inputs."""
        B, H, T, D = q.shape
        if (B, T) != self.shape:
            raise ValueError(f"q is {tuple(q.shape)}, the segments were built for {self.shape}")
        # (B*T, H, D): one row per position, so a run is a gather of rows
        qf, kf, vf = (t.transpose(1, 2).reshape(B * T, H, D) for t in (q, k, v))
        out = torch.where(self.padding[:, None, None], vf, torch.zeros_like(vf))
        for index, keep in self.groups:
            m, N = index.shape
            flat = index.reshape(-1)
            # (m, H, N, D) per run
            qs, ks, vs = (t[flat].view(m, N, H, D).transpose(1, 2) for t in (qf, kf, vf))
            y = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, dropout_p=dropout_p)
            y = y.transpose(1, 2).reshape(m * N, H, D)
            sel = keep.reshape(-1)
            out = out.index_copy(0, flat[sel], y[sel])
        return out.view(B, T, H, D).transpose(1, 2)
