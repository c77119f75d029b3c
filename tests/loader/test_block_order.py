"""``block_order="interleave"``: every block once per epoch, each global batch gathered from G
far-apart stretches of the stream, the same global batches for any world size, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenloom.loader import PlanError, step_blocks

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import DataLoader, PackedDataset  # noqa: E402

L = 32


def _epoch(num_blocks, B, W, drop_last, order="interleave"):
    g = B * W
    steps = num_blocks // g if drop_last else -(-num_blocks // g)
    return [
        np.concatenate(
            [
                step_blocks(s, rank=r, world_size=W, batch_size=B, num_blocks=num_blocks,
                            drop_last=drop_last, order=order)
                for r in range(W)
            ]
        )
        for s in range(steps)
    ]  # fmt: skip


@given(
    num_blocks=st.integers(1, 400),
    B=st.integers(1, 6),
    W=st.integers(1, 4),
    drop_last=st.booleans(),
)
def test_every_block_once_and_independent_of_the_world_size(num_blocks, B, W, drop_last):
    steps = _epoch(num_blocks, B, W, drop_last)
    seen = np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64)
    real = np.sort(seen[seen >= 0])
    seq = np.concatenate(_epoch(num_blocks, B, W, drop_last, "sequential") or [seen])
    assert np.array_equal(real, np.sort(seq[seq >= 0]))  # the same blocks, each once
    assert len(np.unique(real)) == len(real)
    one = _epoch(num_blocks, B * W, 1, drop_last)  # G blocks on one rank: the same batches
    assert all(np.array_equal(a, b) for a, b in zip(steps, one, strict=True))


def test_a_batch_gathers_far_apart_blocks():
    steps = _epoch(1000, 4, 2, False)  # G = 8, S = 125
    assert steps[0].tolist() == [0, 125, 250, 375, 500, 625, 750, 875]
    assert steps[1].tolist() == [1, 126, 251, 376, 501, 626, 751, 876]


def test_unknown_order_is_refused():
    with pytest.raises(PlanError, match="block order"):
        step_blocks(0, rank=0, world_size=1, batch_size=2, num_blocks=10, drop_last=False,
                    order="random")  # fmt: skip


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    paras = real_paragraphs(120)
    return token_table(tmp_path_factory.mktemp("order"), [" ".join(paras[:40])] + paras[40:])


def _tokens(ds, n=None):
    out = []
    for batch in DataLoader(ds, num_workers=0):
        out.append(batch)
        if n is not None and len(out) == n:
            break
    return out


def test_interleaved_epoch_holds_every_token_once_and_mixes_long_documents(table):
    seq = _tokens(PackedDataset(table, seq_len=L, global_batch=8, seed=1, block_order="sequential"))
    inter = _tokens(
        PackedDataset(table, seq_len=L, global_batch=8, seed=1, block_order="interleave")
    )

    def stretches(batches):
        return sorted(tuple(r[2:]) for b in batches for r in b["spans"].tolist())

    assert stretches(seq) == stretches(inter)  # the same (row, token range)s, once each
    long_id = 0  # the first row: 40 paragraphs, many blocks

    def most_in_one_step(batches):
        return max(sum(r[2] == long_id for r in b["spans"].tolist()) for b in batches)

    assert most_in_one_step(seq) >= 4 and most_in_one_step(inter) <= 2


def test_interleaved_resume_onto_another_world_size(table):
    def ds(**kw):
        return PackedDataset(table, seq_len=L, seed=2, block_order="interleave", **kw)

    full = [b["input_ids"] for b in _tokens(ds(global_batch=8))]
    first = ds(global_batch=8, rank=0, world_size=2)
    _tokens(first, 3)
    state = DataLoader(first).state_dict()
    rest = []
    for rank in range(4):
        d = ds(global_batch=8, rank=rank, world_size=4)
        d.load_state_dict(state)
        rest.append([b["input_ids"] for b in _tokens(d)])
    merged = [torch.cat([r[s] for r in rest]) for s in range(len(rest[0]))]
    assert all(torch.equal(a, b) for a, b in zip(full[3:], merged, strict=True))
