"""Check 3, document isolation: attention built from the batch alone never crosses a document.

**Reference.** The plan's stretches of the step (after checking that the batch's provenance is
exactly them): stretch ``i`` of block ``b`` occupies positions ``[pos, pos + tok_end - tok_start +
has_eos)``; the rest of the block is padding.

**From the batch alone**, the block-diagonal causal mask ``allowed[i, j] = j <= i and i, j are in
the same segment and neither is padding``, built twice: segments from ``cu_seqlens`` (what a
variable-length attention kernel uses) and from ``doc_ids`` (what a dense mask uses), padding from
``doc_ids == -1``. Both must equal the reference's mask. Two masks of this form are equal exactly
when every position's segment starts at the same position in both (segments are runs), so each
block is compared in O(L) through those start positions; no ``(L, L)`` mask is ever built.
``cu_seqlens`` must hold every block start (no segment crosses a block), ``max_seqlen`` must be
its longest segment, ``position_ids`` must restart at 0 at every document stretch, and
``continues`` must flag the blocks that start mid-document.

**Attention.** On some blocks, the training kernel for long blocks
(:class:`~tokenloom.train.segments.DocumentSegments`: ``scaled_dot_product_attention`` run
document by document, memory O(L); float64, random ``q, k, v``) runs on the batch's segments;
then the ``q, k, v`` of all positions of one segment (a document's stretch, or the padding) are
replaced by other random values, and the outputs at every position of the other documents must
stay exactly the same, while the changed document's do change.
"""

from __future__ import annotations

import time

import numpy as np

from tokenloom.verify.report import CheckResult
from tokenloom.verify.sample import Sample, StepBatch

__all__ = ["check_isolation", "reference_segments", "segment_starts", "attention_leak"]

ATTENTION_BLOCKS = 24
"""Blocks run through attention per verify (the O(L) mask comparison covers every block)."""
SEGMENTS_PER_BLOCK = 6
"""Segments perturbed per block in the attention test."""
_HEADS, _DIM = 1, 8


def reference_segments(batch: StepBatch) -> np.ndarray:
    """``(B, L)`` int64: the plan's stretch index at each position, ``-1`` on padding."""
    B, L = batch.arrays["input_ids"].shape
    sp = batch.plan
    size = sp.tok_end - sp.tok_start + sp.has_eos  # (S,) positions of each stretch
    ref = np.full(B * L, -1, dtype=np.int64)
    first = sp.block * L + sp.pos
    idx = np.repeat(first - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
    ref[idx] = np.repeat(np.arange(len(sp)), size)
    return ref.reshape(B, L)


def segment_starts(labels: np.ndarray) -> np.ndarray:
    """``(B, L)``: for each position, the first position of its block with the same label;
    ``-1`` where the label is ``-1`` (padding). Two labelings give equal masks iff these agree."""
    B, L = labels.shape
    key = np.arange(B)[:, None] * (int(labels.max(initial=0)) + 2) + labels + 1  # unique per block
    _, first, inverse = np.unique(key.reshape(-1), return_index=True, return_inverse=True)
    starts = (first[inverse] % L).reshape(B, L)
    return np.where(labels < 0, -1, starts)


def _batch_labels(batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """Segment labels of the batch from ``cu_seqlens`` and from ``doc_ids`` (``-1``: padding)."""
    a = batch.arrays
    B, L = a["input_ids"].shape
    cu = a["cu_seqlens"].astype(np.int64)
    seg = (np.searchsorted(cu, np.arange(B * L), side="right") - 1).reshape(B, L)
    pad = a["doc_ids"] < 0
    return np.where(pad, -1, seg), np.where(pad, -1, a["doc_ids"])


def _metadata_problem(batch: StepBatch, ref: np.ndarray) -> str | None:
    """Why the batch's segment metadata breaks the contract (or None)."""
    a, sp, s = batch.arrays, batch.plan, batch.step
    B, L = ref.shape
    want = np.stack([sp.block, sp.pos, sp.row_id, sp.tok_start, sp.tok_end], axis=1)
    if a["spans"].shape != want.shape or not np.array_equal(a["spans"], want):
        return f"step {s}: the batch's provenance differs from the plan's stretches of its blocks"
    cu = a["cu_seqlens"].astype(np.int64)
    if cu[0] != 0 or cu[-1] != B * L or not bool(np.all(np.diff(cu) > 0)):
        return f"step {s}: cu_seqlens is not strictly increasing from 0 to B*L={B * L}"
    missing = np.setdiff1d(np.arange(B) * L, cu)
    if missing.size:
        return f"step {s}: a segment crosses into block {missing[0] // L} (no cu_seqlens boundary)"
    if batch.max_seqlen != int(np.diff(cu).max()):
        return f"step {s}: max_seqlen {batch.max_seqlen} is not the longest segment"
    start = segment_starts(ref)
    real = ref >= 0
    expect = np.arange(L)[None, :] - start
    if not np.array_equal(a["position_ids"][real], expect[real]):
        b, j = np.argwhere(real & (a["position_ids"] != expect))[0]
        return (
            f"step {s} block {b} position {j}: position_ids {a['position_ids'][b, j]} but the "
            f"document stretch started {expect[b, j]} positions earlier"
        )
    new_block = np.ones(len(sp), dtype=bool)
    new_block[1:] = sp.block[1:] != sp.block[:-1]
    cont = np.zeros(B, dtype=bool)
    cont[sp.block[new_block]] = sp.tok_start[new_block] > 0
    if not np.array_equal(a["continues"], cont):
        b = int(np.flatnonzero(a["continues"] != cont)[0])
        return f"step {s} block {b}: continues is {bool(a['continues'][b])}, expected {cont[b]}"
    return None


def attention_leak(
    labels: np.ndarray, ref: np.ndarray, segments: list[int], seed: int
) -> str | None:
    """Run attention with the batch's mask of one block and perturb ``segments`` of ``ref``.

    Args:
        labels: ``(L,)`` the batch's segment labels of the block (``-1``: padding).
        ref: ``(L,)`` the reference stretch index of each position (``-1``: padding).
        segments: Reference segments to perturb, one at a time (``-1``: the padding).
        seed: Seed of the random ``q, k, v``.

    Returns:
        Why isolation fails in this block, or None.
    """
    import torch

    from tokenloom.train.segments import DocumentSegments

    L = labels.shape[0]
    # the training kernel for long blocks: document by document, never an (L, L) mask
    runs = DocumentSegments(torch.from_numpy(np.ascontiguousarray(labels))[None, :])
    gen = torch.Generator().manual_seed(seed)

    def rand() -> torch.Tensor:
        return torch.randn(1, _HEADS, L, _DIM, dtype=torch.float64, generator=gen)

    q, k, v = rand(), rand(), rand()
    base = runs.attend(q, k, v)
    for seg in segments:
        inside = torch.from_numpy(ref == seg)
        others = torch.from_numpy((ref != seg) & (ref >= 0))
        q2, k2, v2 = (torch.where(inside[None, None, :, None], rand(), x) for x in (q, k, v))
        out = runs.attend(q2, k2, v2)
        leak = float((out - base)[:, :, others].abs().max()) if bool(others.any()) else 0.0
        if leak != 0.0 or not bool(torch.isfinite(out[:, :, others]).all()):
            what = "the padding" if seg < 0 else f"document stretch {seg}"
            return f"changing {what} changes other documents' outputs by up to {leak:.3g}"
        if seg >= 0 and not bool((out - base)[:, :, inside].abs().max() > 0):
            return f"changing document stretch {seg} left its own outputs unchanged"
    return None


def check_isolation(sample: Sample) -> CheckResult:
    """Check 3 (see the module docstring)."""
    started = time.perf_counter()
    rng = np.random.default_rng([sample.spec.seed, 0x150])
    candidates: list[tuple[int, int]] = []  # (batch index, block) with two or more segments
    refs = []
    blocks = segments = 0
    problem = None
    for n, batch in enumerate(sample.batches):
        ref = reference_segments(batch)
        refs.append(ref)
        problem = _metadata_problem(batch, ref)
        if problem:
            break
        want = segment_starts(ref)
        for name, labels in zip(("cu_seqlens", "doc_ids"), _batch_labels(batch), strict=True):
            bad = np.flatnonzero((segment_starts(labels) != want).any(axis=1))
            if bad.size:
                problem = (
                    f"step {batch.step} block {bad[0]}: the mask built from {name} differs from "
                    "the documents' segments in the spans"
                )
                break
        if problem:
            break
        for b in range(ref.shape[0]):
            blocks += 1
            count = len(np.unique(ref[b]))
            segments += count
            if count > 1:
                candidates.append((n, b))
    tested = perturbed = 0
    if not problem and candidates:
        pick = rng.choice(
            len(candidates), size=min(ATTENTION_BLOCKS, len(candidates)), replace=False
        )
        for c in np.sort(pick):
            n, b = candidates[int(c)]
            batch, ref = sample.batches[n], refs[n][b]
            labels = _batch_labels(batch)[0][b]
            if not np.array_equal(segment_starts(labels[None]), segment_starts(ref[None])):
                problem = (
                    f"step {batch.step} block {b}: the cu_seqlens mask differs from the spans'"
                )
                break
            segs = np.unique(ref)
            if segs.size > SEGMENTS_PER_BLOCK:
                segs = rng.choice(segs, size=SEGMENTS_PER_BLOCK, replace=False)
            leak = attention_leak(labels, ref, [int(x) for x in segs], seed=int(c))
            if leak:
                problem = f"step {batch.step} block {b}: {leak}"
                break
            tested += 1
            perturbed += len(segs)
    seconds = time.perf_counter() - started
    if problem:
        return CheckResult(name="document_isolation", passed=False, detail=problem, seconds=seconds)
    return CheckResult(
        name="document_isolation",
        passed=True,
        detail=(
            f"masks from cu_seqlens and doc_ids equal the spans' {segments:,} segments in "
            f"{blocks:,} blocks; position_ids, continues, max_seqlen agree; attention: "
            f"{perturbed} segments perturbed in {tested} blocks, other documents' outputs "
            "unchanged"
        ),
        seconds=seconds,
    )
