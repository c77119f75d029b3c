"""Block → stretches: agree with a walk of the stream; cheap for documents of millions of tokens."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings

from tests.loader.helpers import columns, corpora, epochs, make_rows, seeds
from tokenloom.loader import PlanError, block_spans, epoch_permutation, plan_epoch, stream_counts


def naive_spans(plan, blocks) -> list[tuple]:
    """Walk the stream position by position; a stretch starts at each block start / doc change."""
    stream = []  # (doc, token index or len for the EOS)
    for k, n in enumerate(plan.lengths.tolist()):
        stream += [(k, t) for t in range(n + 1)]
    out = []
    for i, b in enumerate(blocks):
        if b < 0:
            continue
        cur = None
        for j in range(plan.seq_len):
            p = b * plan.seq_len + j
            if p >= len(stream):
                break
            k, t = stream[p]
            n = int(plan.lengths[k])
            if k != cur:
                cur = k
                out.append([i, j, k, int(plan.row_ids[k]), n, t, t, False])
            if t < n:
                out[-1][6] = t + 1
            else:
                out[-1][7] = True
    return [tuple(s) for s in out]


def as_tuples(spans) -> list[tuple]:
    cols = (spans.block, spans.pos, spans.doc, spans.row_id, spans.doc_len)
    cols += (spans.tok_start, spans.tok_end, spans.has_eos)
    return [tuple(x.item() for x in row) for row in zip(*cols, strict=True)]


@settings(derandomize=True, max_examples=150, deadline=None)
@given(corpus=corpora(), seed=seeds, epoch=epochs)
def test_spans_match_a_walk_of_the_stream(
    corpus: tuple[int, list[int]], seed: int, epoch: int
) -> None:
    L, lengths = corpus
    ids, n = columns(make_rows(lengths))
    plan = plan_epoch(ids, n, seed=seed, epoch=epoch, seq_len=L)
    rng = np.random.default_rng(seed % 2**32)
    blocks = np.arange(plan.num_blocks, dtype=np.int64)
    shuffled = np.concatenate([rng.permutation(blocks), [-1], blocks[:2]])  # any order, repeats
    for req in (blocks, shuffled):
        spans = block_spans(plan, req)
        assert as_tuples(spans) == naive_spans(plan, req.tolist())
        assert np.array_equal(spans.blocks, req)
        assert (spans.length >= 1).all()
    # All blocks together: each position of the stream exactly once, one EOS per doc.
    spans = block_spans(plan, blocks)
    assert int(spans.length.sum()) == plan.stream_len
    assert int(spans.has_eos.sum()) == plan.num_docs
    assert int((spans.tok_end - spans.tok_start).sum()) == plan.num_tokens


def test_padding_blocks_have_no_spans() -> None:
    ids, n = columns(make_rows([3, 4]))
    plan = plan_epoch(ids, n, seed=0, epoch=0, seq_len=4)
    spans = block_spans(plan, np.array([-1, -1]))
    assert len(spans) == 0 and spans.blocks.tolist() == [-1, -1]
    assert len(block_spans(plan, np.zeros(0, np.int64))) == 0


@pytest.mark.parametrize("bad", [[3], [-2], [0, 99]])
def test_rejects_blocks_outside_the_epoch(bad: list[int]) -> None:
    ids, n = columns(make_rows([3, 4]))  # 9 positions, 3 blocks of 4
    plan = plan_epoch(ids, n, seed=0, epoch=0, seq_len=4)
    with pytest.raises(PlanError, match=r"outside the epoch's blocks \[0, 3\)"):
        block_spans(plan, np.array(bad))


def test_two_million_token_document_is_linear() -> None:
    big = 2_000_000
    ids, n = columns({7: np.zeros(0), 9: np.zeros(big), 11: np.zeros(5)})
    plan = plan_epoch(ids, n, seed=0, epoch=0, seq_len=1024)
    assert plan.stream_len == big + 5 + 2 and plan.empty_rows == 1
    blocks = np.arange(plan.num_blocks, dtype=np.int64)
    t0 = time.perf_counter()
    spans = block_spans(plan, blocks)
    elapsed = time.perf_counter() - t0
    print(f"\nblock_spans: {plan.num_blocks} blocks of a 2M-token doc in {elapsed * 1e3:.1f} ms")
    # One stretch per block, except the single block where the two documents meet.
    assert len(spans) == plan.num_blocks + 1
    for name in ("block", "pos", "doc", "row_id", "tok_start", "tok_end", "has_eos"):
        assert getattr(spans, name).shape == (len(spans),)  # nothing proportional to tokens
    one = plan_epoch(ids[1:2], n[1:2], seed=0, epoch=0, seq_len=1024)
    spans = block_spans(one, np.arange(one.num_blocks))
    assert len(spans) == one.num_blocks == -(-(big + 1) // 1024)
    assert spans.tok_start.tolist() == list(range(0, big, 1024))
    assert spans.tok_end.tolist() == [*range(1024, big, 1024), big]
    assert spans.has_eos.tolist() == [False] * (one.num_blocks - 1) + [True]


def reference_spans(row_ids, lengths, L, blocks) -> list[tuple]:
    """The block → stretch search over every document offset (what the plan no longer stores)."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=starts[1:])
    out = []
    for i, b in enumerate(blocks.tolist()):
        if b < 0:
            continue
        lo, hi = b * L, min((b + 1) * L, int(starts[-1]))
        k = int(np.searchsorted(starts, lo, side="right")) - 1
        while k < len(lengths) and starts[k] < hi:
            s0, s1 = max(starts[k], lo), min(starts[k + 1], hi)
            n = int(lengths[k])
            t0, t1 = int(s0 - starts[k]), int(min(s1 - starts[k], n))
            out.append((i, int(s0 - lo), k, int(row_ids[k]), n, t0, t1, bool(s1 == starts[k + 1])))
            k += 1
    return out


@pytest.mark.parametrize("L", [1, 5, 64, 2048])
def test_spans_across_many_mark_groups(L: int) -> None:
    # Hundreds of documents (several groups of MARK_EVERY), empty rows, any block order.
    from tokenloom.loader.plan.epoch import MARK_EVERY

    rng = np.random.default_rng(L)
    n = 9 * MARK_EVERY + 13
    lens = rng.integers(0, 3 * L + 2, n).astype(np.int64)
    lens[rng.random(n) < 0.1] = 0
    ids = np.cumsum(rng.integers(1, 4, n)).astype(np.int64)
    plan = plan_epoch(ids, lens, seed=11, epoch=2, seq_len=L)
    keep = lens > 0
    perm = epoch_permutation(int(keep.sum()), seed=11, epoch=2)
    ref_ids, ref_lens = ids[keep][perm], lens[keep][perm]
    assert plan.row_ids.tolist() == ref_ids.tolist()
    blocks = np.arange(plan.num_blocks, dtype=np.int64)
    picks = [blocks, rng.permutation(blocks)[:40], np.array([-1, plan.num_blocks - 1, 0, -1])]
    for req in picks:
        assert as_tuples(block_spans(plan, req)) == reference_spans(ref_ids, ref_lens, L, req)
    starts = np.r_[0, np.cumsum(ref_lens + 1)]
    eos_at = starts[1:] - 1
    for lo, hi in [(0, plan.stream_len), *rng.integers(0, plan.stream_len + 3, (30, 2)).tolist()]:
        a, b = min(lo, plan.stream_len), min(max(hi, lo), plan.stream_len)
        eos = int(((eos_at >= a) & (eos_at < b)).sum())
        assert stream_counts(plan, lo, hi) == (b - a - eos, eos)
