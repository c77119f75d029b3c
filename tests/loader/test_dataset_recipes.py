"""Best-fit packing and overlapping windows through PackedDataset/DataLoader on a real table."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.loader.test_dataset import _rows, _texts  # noqa: E402
from tokenloom.loader import DataLoader, PackedDataset, ResumeMismatchError  # noqa: E402

L = 32


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("recipes"), _texts())


def _coverage(batches):
    covered: dict[int, list[tuple[int, int, int]]] = {}
    for step, batch in enumerate(batches):
        for b, _pos, rid, start, end in batch["spans"].tolist():
            covered.setdefault(rid, []).append((step * 100 + b, start, end))
    return covered


def test_best_fit_never_cuts_a_fitting_document_and_conserves_tokens(table):
    rows = _rows(table)
    ds = PackedDataset(
        table,
        seq_len=L,
        global_batch=4,
        seed=2,
        packing="best_fit",
        fit_window=8,
        block_order="sequential",
    )
    batches = list(DataLoader(ds, num_workers=0))
    cov = _coverage(batches)
    for rid, toks in rows.items():
        pieces = sorted(cov[rid], key=lambda p: p[1])
        assert pieces[0][1] == 0 and pieces[-1][2] == len(toks)
        if len(toks) + 1 <= L:
            assert len({p[0] for p in pieces}) == 1, f"row {rid} ({len(toks)} tokens) was cut"
    info = ds.epoch_info()
    assert info["tokens"] == sum(len(t) for t in rows.values())
    padding = sum(int((b["doc_ids"] == -1).sum()) for b in batches)
    assert padding == info["padding_positions"] > 0
    # topology independence holds for best-fit too
    halves = [
        list(
            PackedDataset(
                table,
                seq_len=L,
                global_batch=4,
                seed=2,
                packing="best_fit",
                fit_window=8,
                rank=r,
                world_size=2,
                block_order="sequential",
            )
        )
        for r in range(2)
    ]
    for whole, a, b in zip(batches, *halves, strict=True):
        assert torch.equal(whole["input_ids"], torch.cat([a["input_ids"], b["input_ids"]]))


def test_windows_carry_context_without_loss(table):
    rows = _rows(table)
    ds = PackedDataset(
        table,
        seq_len=L,
        global_batch=4,
        seed=1,
        long_docs="window",
        window=24,
        overlap=8,
        block_order="sequential",
    )
    batches = list(ds)
    assert any("context" in b for b in batches)
    new_tokens = 0
    for batch in batches:
        labels = batch["labels"]
        for (blk, pos, _rid, start, end), (c0, c1) in zip(
            batch["spans"].tolist(), batch["context"].tolist(), strict=True
        ):
            n_ctx = c1 - c0
            assert 0 <= n_ctx <= 8  # a window's context may straddle two blocks
            if n_ctx > 1:
                # targets inside the context get no loss
                assert (labels[blk, pos : pos + n_ctx - 1] == -100).all()
            new_tokens += end - start - n_ctx
    assert new_tokens == sum(len(t) for t in rows.values())  # each token is new exactly once
    other = PackedDataset(table, seq_len=L, global_batch=4, seed=1, block_order="sequential")
    with pytest.raises(ResumeMismatchError):
        other.load_state_dict(ds.state_dict())  # the recipe is part of the fingerprint


def test_default_recipe_keeps_old_checkpoints_resumable(table):
    state = PackedDataset(table, seq_len=L, global_batch=4, block_order="sequential").state_dict()
    PackedDataset(
        table, seq_len=L, global_batch=4, packing="concat", block_order="sequential"
    ).load_state_dict(state)
    assert real_paragraphs(1)
