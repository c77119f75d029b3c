"""Check 4, loss positions: exactly the intended positions carry a label.

The expected labels are recomputed position by position from the step's stretches, the rows'
stored ids and the EOS id, without the packer: the position holding token ``t`` of a document of
``n`` tokens has label ``ids[t + 1]`` when ``t + 1 < n``, the EOS id when ``t + 1 == n`` (even if
the EOS lies in the next block), and ``-100`` when its target is a context-only token (a later
window of a long document re-reading the previous window's end) or when the stretch ends a window
whose next window trains that target. The EOS position and padding have ``-100``. The batch's
``input_ids`` must hold the EOS id where a document's EOS is.

Then: the batch's ``labels`` equal the expected ones everywhere; the number of expected loss
positions equals what the loader's ``stats.loss_positions`` counted for those batches; and over
the whole epoch each target ``1..n`` of each fixed document (``n`` = its EOS) is trained exactly
once per visit (a visit is a pass holding the document: a mixture pool that repeats delivers it
once per pass; a visit in a pass its pool's epoch ends inside trains each target at most once,
those inside its delivered stretches exactly once), target 0 never.

With a loss-mask column (:mod:`~tokenloom.loader.pipeline.lossmask`) a target token ``t`` inside one
of its row's spans is expected to be ``-100`` too (the spans are read from the column apart from the
loader), the labels it takes out are expected to equal the loader's ``stats.masked_tokens``, and
the coverage rule leaves masked targets out ("trained exactly once" becomes "never").
"""

from __future__ import annotations

import time

import numpy as np

from tokenloom.loader.plan.pack import IGNORE_INDEX
from tokenloom.verify.report import CheckResult
from tokenloom.verify.sample import Sample, StepBatch
from tokenloom.verify.text import stretches, visits

__all__ = ["expected_labels", "check_loss"]


def _in_spans(target: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Which targets lie in one of the ``(K, 2)`` ``[start, end)`` spans."""
    if not len(mask):
        return np.zeros(target.shape, dtype=bool)
    t = target[:, None]
    return ((mask[None, :, 0] <= t) & (t < mask[None, :, 1])).any(axis=1)


def expected_labels(
    batch: StepBatch,
    rows: dict,
    eos_id: int,
    masked: list[int] | None = None,
    overlap_loss: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The labels the batch should carry, and where its EOS ids should be (with
    ``overlap_loss``, a context token is a target too: the recipe trains the overlap again).

    Args:
        masked: If given, receives (appended) the number of labels a loss mask takes out.

    Returns:
        ``(labels, eos)``: ``(B, L)`` int64 expected labels and ``(B, L)`` bool EOS positions.
    """
    B, L = batch.arrays["input_ids"].shape
    labels = np.full((B, L), IGNORE_INDEX, dtype=np.int64)
    eos = np.zeros((B, L), dtype=bool)
    sp = batch.plan
    for i in range(len(sp)):
        blk, pos, s, e = int(sp.block[i]), int(sp.pos[i]), int(sp.tok_start[i]), int(sp.tok_end[i])
        ids = rows[int(sp.row_id[i])].stored
        n = len(ids)
        target = np.arange(s + 1, e + 1)  # (e - s,) token index each position should predict
        value = np.where(target < n, ids[np.minimum(target, max(n - 1, 0))], eos_id)
        trained = np.ones(e - s, dtype=bool)
        if sp.ctx_end is not None and not overlap_loss:
            trained &= target >= int(sp.ctx_end[i])  # a context token is never a target
        if sp.ends_window is not None and bool(sp.ends_window[i]) and e > s:
            trained[-1] = False  # the next window trains it, with its context
        hit = trained & (target < n) & _in_spans(target, rows[int(sp.row_id[i])].mask)
        if masked is not None:
            masked.append(int(hit.sum()))
        trained &= ~hit
        labels[blk, pos : pos + e - s] = np.where(trained, value, IGNORE_INDEX)
        if bool(sp.has_eos[i]):
            eos[blk, pos + e - s] = True
    return labels, eos


def _fixed_coverage(sample: Sample, overlap_loss: bool = False) -> str | None:
    """Why some target of a fixed document is not trained exactly once per visit (or None);
    with ``overlap_loss``, once more for each window that holds it as a context token.

    A mixture pool that repeats delivers the document once per pass (each a visit); a visit that
    its pool's epoch ends inside trains the targets it delivered, once, and no other."""
    fixed = set(sample.fixed_rows)
    parts: dict[int, list] = {rid: [] for rid in fixed}
    trained: dict[int, np.ndarray] = {}
    for batch in sample.batches:
        labels = batch.arrays["labels"]
        for st in stretches(batch):
            if st.row in fixed:
                parts[st.row].append(st)
                trained[id(st)] = labels[st.block, st.pos : st.pos + st.end - st.start] != (
                    IGNORE_INDEX
                )
    for rid in sample.fixed_rows:
        if rid not in sample.rows:
            return f"row {rid}: selected, but no block of the epoch trains any of its targets"
        n = len(sample.rows[rid].stored)
        for i, visit in enumerate(visits(parts[rid]) or [[]]):
            count = np.zeros(n + 1, dtype=np.int64)
            for st in visit:
                np.add.at(count, np.arange(st.start + 1, st.end + 1)[trained[id(st)]], 1)
            want = np.ones(n + 1, dtype=np.int64)
            want[0] = 0
            if overlap_loss:  # a window's context tokens (but its first) are trained again
                goes_on = {st.start for st in visit if st.ctx_end > st.start}
                for st in visit:
                    want[st.start + 1 : st.ctx_end] += 1
                    if st.ctx_end == st.end > st.start and st.end in goes_on:
                        want[st.end] += 1  # the context runs on in the next block
            if visit and visit[0].visit in sample.cut_passes:
                # the pool's epoch ends inside this pass, so any piece may be missing: each
                # target is trained at most as often as a whole pass trains it, and a delivered
                # stretch trains its own targets but the first (a context token, or the previous
                # stretch's) and the last (its window's next one, or a lookahead's)
                full = want
                want = np.minimum(count, full)
                for st in visit:
                    lo = max(st.ctx_end, st.start + 1)
                    want[lo : st.end] = full[lo : st.end]
                want[0] = 0
            want[:n][_in_spans(np.arange(n), sample.rows[rid].mask)] = 0  # masked targets
            if n and not np.array_equal(count, want):
                t = int(np.flatnonzero(count != want)[0])
                return (
                    f"row {rid}: target {t} of {n} is trained {count[t]} times in visit {i + 1} "
                    f"of the epoch (expected {want[t]})"
                )
    return None


def check_loss(sample: Sample) -> CheckResult:
    """Check 4 (see the module docstring)."""
    started = time.perf_counter()
    problem = None
    expected = counted = 0
    masked: list[int] = []
    counted_masked = 0
    overlap_loss = bool(sample.spec.recipe.overlap_loss)
    for batch in sample.batches:
        stray = np.setdiff1d(batch.plan.row_id, np.fromiter(sample.rows, dtype=np.int64))
        if stray.size:
            problem = (
                f"step {batch.step}: row {int(stray[0])} is not a row the loader's filter "
                "selects, so its labels cannot be checked"
            )
            break
        counted_masked += batch.masked_tokens
        want, eos = expected_labels(batch, sample.rows, sample.eos_id, masked, overlap_loss)
        got = batch.arrays["labels"]
        inp = batch.arrays["input_ids"]
        expected += int((want != IGNORE_INDEX).sum())
        counted += batch.loss_positions
        if not bool(np.all(inp[eos] == sample.eos_id)):
            b, j = np.argwhere(eos & (inp != sample.eos_id))[0]
            problem = f"step {batch.step} block {b} position {j}: EOS expected, found {inp[b, j]}"
            break
        if not np.array_equal(got, want):
            b, j = np.argwhere(got != want)[0]
            problem = (
                f"step {batch.step} block {b} position {j}: label {got[b, j]}, expected "
                f"{want[b, j]} ({int((got != want).sum())} labels of the step differ)"
            )
            break
    if problem is None and expected != counted:
        problem = (
            f"{expected:,} positions should carry loss but the loader's stats counted {counted:,}"
        )
    if problem is None and sum(masked) != counted_masked:
        problem = (
            f"the loss-mask column takes {sum(masked):,} labels out but the loader's stats "
            f"counted {counted_masked:,} masked tokens"
        )
    if problem is None:
        problem = _fixed_coverage(sample, overlap_loss)
    seconds = time.perf_counter() - started
    if problem:
        return CheckResult(name="loss_positions", passed=False, detail=problem, seconds=seconds)
    return CheckResult(
        name="loss_positions",
        passed=True,
        detail=(
            f"{expected:,} labelled positions in {len(sample.batches)} steps, each the next token "
            "of its document or its EOS, -100 elsewhere; equal to the loader's "
            "stats.loss_positions; every target of the fixed rows trained exactly once per visit"
            + (
                f"; {sum(masked):,} labels in loss-mask spans -100, equal to stats.masked_tokens"
                if sample.spec.loss_mask_column
                else ""
            )
            + (" (a window's overlap once more: --overlap-loss)" if overlap_loss else "")
        ),
        seconds=seconds,
    )
