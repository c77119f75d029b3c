"""Token-quota mixtures through PackedDataset: shares, repeats, per-pool provenance, resume."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import PackedDataset, ResumeMismatchError  # noqa: E402

L = 32
MIX = {"even": ("id % 2 = 0", 0.4), "odd": ("id % 2 = 1", 0.6, 3)}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("mixture"), real_paragraphs(80))


def _ds(table, **kw):
    return PackedDataset(
        table,
        seq_len=L,
        global_batch=kw.pop("global_batch", 4),
        seed=5,
        mixture=MIX,
        budget_tokens=kw.pop("budget", 40_000),
        **kw,
        block_order="sequential",
    )


def test_shares_hold_on_every_window_and_blocks_name_their_pool(table):
    ds = _ds(table)
    batches = list(ds)
    pools = torch.cat([b["block_pool"] for b in batches]).numpy()
    pools = pools[pools >= 0]
    assert len(pools) == ds.epoch_info()["blocks"] == -(-40_000 // L)
    for start in range(0, len(pools) - 100, 25):
        share = (pools[start : start + 100] == 0).mean()
        assert abs(share - 0.4) <= 0.025, (start, share)
    # every block's rows come from its pool's filter
    for b in batches:
        for blk, _pos, rid, _s, _e in b["spans"].tolist():
            assert rid % 2 == int(b["block_pool"][blk]), (rid, b["block_pool"][blk])
    info = ds.epoch_info()
    reports = {p["name"]: p for p in info["pools"]}
    odd_tokens = sum(len(t.encode()) for i, t in enumerate(real_paragraphs(80)) if i % 2)
    assert reports["odd"]["tokens"] > odd_tokens  # its quota exceeds its inventory...
    assert reports["odd"]["passes"] >= 2  # ...so it repeats, with a new order per pass


def test_mixture_resume_on_another_world_size(table):
    full = [b["input_ids"] for b in _ds(table, global_batch=4)]
    first = _ds(table, global_batch=4, rank=0, world_size=2)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.state_dict()
    rest = []
    for rank in range(4):
        d = _ds(table, global_batch=4, rank=rank, world_size=4)
        d.load_state_dict(state)
        rest.append([b["input_ids"] for b in d])
    merged = [torch.cat([r[s] for r in rest]) for s in range(len(rest[0]))]
    assert len(merged) == len(full) - 7
    assert all(torch.equal(a, b) for a, b in zip(full[7:], merged, strict=True))
    other = PackedDataset(
        table,
        seq_len=L,
        global_batch=4,
        seed=5,
        mixture={"even": ("id % 2 = 0", 0.5), "odd": ("id % 2 = 1", 0.5, 3)},
        budget_tokens=40_000,
        block_order="sequential",
    )
    with pytest.raises(ResumeMismatchError, match="mixture"):
        other.load_state_dict(state)
    assert np.isfinite(len(full))
