"""A whole epoch across every rank and step: token conservation and padding only at the end."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.loader.helpers import EOS, PAD, columns, corpora, epochs, gather, make_rows, seeds
from tokenloom.loader import block_spans, epoch_steps, pack_blocks, plan_epoch, step_blocks


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    corpus=corpora(),
    seed=seeds,
    epoch=epochs,
    batch_size=st.integers(1, 4),
    world_size=st.integers(1, 4),
    drop_last=st.booleans(),
    lookahead=st.booleans(),
)
def test_every_token_exactly_once_per_epoch(
    corpus: tuple[int, list[int]],
    seed: int,
    epoch: int,
    batch_size: int,
    world_size: int,
    drop_last: bool,
    lookahead: bool,
) -> None:
    L, lengths = corpus
    rows = make_rows(lengths)
    plan = plan_epoch(*columns(rows), seed=seed, epoch=epoch, seq_len=L)
    info = epoch_steps(plan, global_batch=(batch_size) * world_size, drop_last=drop_last)
    seen_tokens: list[np.ndarray] = []
    seen_rows: dict[int, list[tuple[int, int]]] = {}
    eos = padding = 0
    for step in range(info.steps):
        step_padding = 0
        for rank in range(world_size):
            blocks = step_blocks(
                step,
                rank=rank,
                world_size=world_size,
                batch_size=batch_size,
                num_blocks=plan.num_blocks,
                drop_last=drop_last,
            )
            spans = block_spans(plan, blocks)
            tokens, offsets = gather(spans, rows, lookahead=lookahead)
            out = pack_blocks(
                spans,
                tokens,
                offsets,
                num_blocks_in_batch=batch_size,
                seq_len=L,
                eos_id=EOS,
                pad_id=PAD,
                lookahead=lookahead,
            )
            ids = out.input_ids
            seen_tokens.append(ids[ids > 0])  # corpus token ids are >= 1
            assert int((ids == EOS).sum()) == out.eos_positions
            assert int((ids > 0).sum()) == out.real_tokens
            eos += out.eos_positions
            step_padding += out.padding_positions
            for _, _, row, a, b in out.spans.tolist():  # provenance covers what was packed
                seen_rows.setdefault(row, []).append((a, b))
        if step < info.steps - 1:
            assert step_padding == 0, "padding before the last step"
        padding += step_padding

    got = np.sort(np.concatenate(seen_tokens)) if seen_tokens else np.zeros(0, np.int64)
    assert len(np.unique(got)) == len(got), "a token was delivered twice"
    total = int(sum(lengths))
    if drop_last:
        assert len(got) + info.dropped_tokens == total
        assert eos + info.dropped_eos == plan.num_docs
    else:
        assert np.array_equal(got, np.arange(1, total + 1)), "a token is missing"
        assert eos == plan.num_docs
        for row, toks in rows.items():  # provenance: each row's ranges tile [0, n)
            ranges = sorted(seen_rows.get(row, []))
            if len(toks) == 0:
                assert ranges == []
                continue
            assert ranges[0][0] == 0 and ranges[-1][1] == len(toks)
            assert all(a2 == b1 for (_, b1), (a2, _) in zip(ranges, ranges[1:], strict=False))
    assert padding == info.padding_positions


def test_grid_world_sizes_share_the_global_stream() -> None:
    """Fixed corpus, G = 12 split over world sizes 1-4, two epochs: same stream, same batches."""
    rng = np.random.default_rng(5)
    lengths = rng.geometric(1 / 20, 300).tolist() + [0] * 7 + [50 * 16]
    rows = make_rows([int(x) for x in rng.permutation(lengths)])
    total = sum(len(t) for t in rows.values())
    for epoch in (0, 1):
        plan = plan_epoch(*columns(rows), seed=11, epoch=epoch, seq_len=16)
        streams = {}
        for world in (1, 2, 3, 4):
            b = 12 // world
            info = epoch_steps(plan, global_batch=(b) * world, drop_last=False)
            steps = []
            for step in range(info.steps):
                per_rank = []
                for rank in range(world):
                    blocks = step_blocks(
                        step,
                        rank=rank,
                        world_size=world,
                        batch_size=b,
                        num_blocks=plan.num_blocks,
                        drop_last=False,
                    )
                    spans = block_spans(plan, blocks)
                    tokens, offsets = gather(spans, rows, lookahead=True)
                    out = pack_blocks(
                        spans,
                        tokens,
                        offsets,
                        num_blocks_in_batch=b,
                        seq_len=16,
                        eos_id=EOS,
                        pad_id=PAD,
                        lookahead=True,
                    )
                    per_rank.append(np.stack([out.input_ids, out.labels, out.position_ids]))
                steps.append(np.concatenate(per_rank, axis=1))
            streams[world] = np.stack(steps)
            ids = streams[world][:, 0]
            assert np.array_equal(np.sort(ids[ids > 0]), np.arange(1, total + 1))
        for world in (2, 3, 4):
            assert np.array_equal(streams[world], streams[1]), world
        if epoch == 0:
            first = streams[1]
        else:
            assert not np.array_equal(first[:, 0], streams[1][:, 0])  # a fresh order per epoch
