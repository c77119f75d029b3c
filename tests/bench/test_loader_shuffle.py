"""The shuffle-quality figures of ``bench loader --shuffle-docs``: known permutations, the
document ids recovered from packed blocks, and one loader measured end to end."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_cli
from tokenloom.bench.loader_data import (
    EOS_ID,
    CorpusSpec,
    doc_lengths,
    packed_blocks,
    shuffled_order,
)
from tokenloom.bench.loader_shuffle import (
    KEY_TOKENS,
    delivered_docs,
    doc_index,
    shuffle_figures,
)


def _batches(order: np.ndarray, per_batch: int) -> list[np.ndarray]:
    return [order[i : i + per_batch] for i in range(0, order.shape[0], per_batch)]


def test_same_order_every_epoch_moves_nothing():
    n = 10_000
    epoch = _batches(np.arange(n), 40)
    q = shuffle_figures(epoch + epoch, n, shard_docs=1024)
    assert q.movement == 0.0
    assert q.coverage == 1.0
    # 40 consecutive ids span one shard, two when they straddle a boundary
    assert 1.0 <= q.batch_shards < 1.1
    assert q.batch_shards_uniform > 8 * q.batch_shards
    assert q.batch_docs == 40.0


def test_independent_uniform_permutations_move_a_third():
    n = 20_000
    rng = np.random.default_rng(7)
    batches = _batches(rng.permutation(n), 40) + _batches(rng.permutation(n), 40)
    q = shuffle_figures(batches, n, shard_docs=1024)
    assert q.movement == pytest.approx(1 / 3, abs=0.01)
    assert q.batch_shards == pytest.approx(q.batch_shards_uniform, rel=0.03)


def test_reversed_order_and_partial_coverage():
    """Reversal moves a document by |1 - 2x| (mean 1/2); documents seen once are left out of
    the movement and the coverage; a third sighting is ignored."""
    n = 1000
    first = np.arange(n)
    second = first[::-1][: n // 2]  # only half come back
    q = shuffle_figures([first, second, second[:10]], n, shard_docs=100)
    assert q.coverage == 0.5
    # the returning documents n-1 .. n/2: position x = id/n in epoch 0, (n-1-id)/(n/2) in 1
    ids = second
    expected = np.abs((n - 1 - ids) / (n // 2) - ids / n).mean()
    assert q.movement == pytest.approx(expected)
    assert shuffle_figures([], n).error == "no document identified"


def test_documents_are_recovered_from_packed_blocks():
    """The pre-shuffled packed stream gives back the shuffled order, every identifiable
    document once (those cut by the last, dropped, partial block aside)."""
    spec = CorpusSpec(docs=400, seed=3)
    index = doc_index(spec)
    blocks = np.concatenate(list(packed_blocks(spec, seq_len=128, shuffled=True)))
    got = np.concatenate(
        [
            delivered_docs(blocks[i : i + 8].astype(np.int64), index)
            for i in range(0, blocks.shape[0], 8)
        ]
    )
    order = shuffled_order(spec)
    identifiable = order[doc_lengths(spec)[order] >= KEY_TOKENS]
    assert len(set(got.tolist())) == got.shape[0]
    # starts within the last KEY_TOKENS - 1 positions of a block are cut: a few are missed
    assert got.shape[0] >= 0.9 * identifiable.shape[0]
    pos = {d: i for i, d in enumerate(identifiable.tolist())}
    ranks = np.array([pos[d] for d in got.tolist()])
    assert (np.diff(ranks) > 0).all()  # delivery order is the shuffled order


def test_a_row_starting_mid_document_is_not_a_start():
    spec = CorpusSpec(docs=50, seed=1)
    index = doc_index(spec)
    row = np.full((1, 16), 7, dtype=np.int64)  # no EOS, and tokens no document starts with
    assert delivered_docs(row, index).shape == (0,)
    row[0, 5] = EOS_ID
    assert delivered_docs(row, index).shape == (0,)


def test_tokenloom_shuffle_measured_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from tokenloom.bench.loader_cases import CaseSpec
    from tokenloom.bench.loader_data import build_table
    from tokenloom.bench.loader_shuffle import measure_shuffle

    spec = CorpusSpec(docs=600, seed=0)
    table = build_table(str(tmp_path / "t.lance"), spec)
    case = CaseSpec(
        label="tokenloom", kind="tokenloom", path=table.path, workers=0, seq_len=256,
        batch_size=4, steps=1,
    )  # fmt: skip
    q = measure_shuffle(case, spec, shard_docs=64)
    assert q["error"] is None
    assert q["coverage"] > 0.9
    assert 0.0 < q["movement"] < 0.5
    assert q["batch_docs"] > 1


def test_shuffle_docs_is_validated():
    proc = run_cli("bench", "loader", "--shuffle-docs", "0")
    assert proc.returncode == 2
    assert "--shuffle-docs" in proc.stderr
