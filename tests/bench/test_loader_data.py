"""The loader benchmark's synthetic corpus and baselines, checked against slow references."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tokenloom.bench.loader_data import (
    EOS_ID,
    CorpusSpec,
    build_parquet,
    build_table,
    corpus_chunks,
    doc_lengths,
    packed_stream,
)


def _naive_stream(spec: CorpusSpec) -> np.ndarray:
    """Every document in id order, each followed by EOS, with a Python loop."""
    out: list[int] = []
    for _first, lens, values in corpus_chunks(spec):
        at = 0
        for n in lens:
            out += [*values[at : at + n].tolist(), EOS_ID]
            at += n
    return np.asarray(out, dtype=np.int64)


def test_lengths_follow_the_recipe():
    lens = doc_lengths(CorpusSpec(docs=200_000, seed=3))
    assert lens.min() >= 1 and lens.max() <= 50_000
    assert abs(np.median(lens) - 450) < 10
    assert abs(lens.mean() - 800) < 25
    assert np.array_equal(lens, doc_lengths(CorpusSpec(docs=200_000, seed=3)))
    assert not np.array_equal(lens, doc_lengths(CorpusSpec(docs=200_000, seed=4)))


def test_chunks_are_deterministic_and_never_hold_eos():
    spec = CorpusSpec(docs=300, seed=1)
    a = list(corpus_chunks(spec, chunk_docs=64))
    b = list(corpus_chunks(spec, chunk_docs=64))
    assert [x[0] for x in a] == [0, 64, 128, 192, 256]
    for (f1, l1, v1), (f2, l2, v2) in zip(a, b, strict=True):
        assert f1 == f2 and np.array_equal(l1, l2) and np.array_equal(v1, v2)
        assert v1.dtype == np.uint16 and int(v1.max()) < EOS_ID and len(v1) == l1.sum()


def test_packed_stream_matches_a_loop():
    spec = CorpusSpec(docs=50, seed=0)
    ((_, lens, values),) = corpus_chunks(spec)
    assert np.array_equal(packed_stream(values, lens, eos_id=EOS_ID), _naive_stream(spec))


def test_table_holds_the_corpus(tmp_path):
    from tokenloom.table import Table

    spec = CorpusSpec(docs=120, seed=5)
    built = build_table(str(tmp_path / "t.lance"), spec)
    t = Table.open(built.path)
    rows = t.dataset.to_table(columns=["id", "input_ids", "n_tokens"])
    assert rows.column("id").to_pylist() == list(range(120))
    assert rows.column("n_tokens").to_pylist() == doc_lengths(spec).tolist()
    flat = [x for ids in rows.column("input_ids").to_pylist() for x in [*ids, EOS_ID]]
    assert np.array_equal(np.asarray(flat), _naive_stream(spec))
    assert t.versions()[-1].operation == "bench"
    assert t.next_id() == 120
    assert build_table(built.path, spec).cached


def test_parquet_blocks_are_the_row_groups_in_permuted_order(tmp_path):
    pytest.importorskip("torch")
    import pyarrow.parquet as pq

    from tokenloom.bench.loader_parquet import ParquetBlocks

    spec = CorpusSpec(docs=5000, seed=2)
    built = build_parquet(str(tmp_path / "c.parquet"), spec)
    pf = pq.ParquetFile(built.path)
    assert pf.num_row_groups == 5
    blocks = list(ParquetBlocks(built.path, seq_len=64, batch_size=4, eos_id=EOS_ID, seed=9))
    got = np.concatenate([b.numpy().reshape(-1) for b in blocks])
    order = np.random.default_rng([9, 0]).permutation(pf.num_row_groups)
    want = []
    for rg in order:
        for ids in pf.read_row_group(int(rg)).column("input_ids").to_pylist():
            want += [*ids, EOS_ID]
    assert blocks[0].shape == (4, 64) and str(blocks[0].dtype) == "torch.int64"
    assert np.array_equal(got, np.asarray(want[: len(got)]))
    assert len(want) - len(got) < 4 * 64  # only the last partial batch is left out


def test_mds_copy_is_the_shuffled_stream(tmp_path):
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed (see tokenloom.bench.loader_mds)")
    pytest.importorskip("torch")
    from tokenloom.bench.loader_data import build_mds
    from tokenloom.bench.loader_mds import MDSBlocks

    spec = CorpusSpec(docs=300, seed=4)
    built = build_mds(str(tmp_path / "c.mds"), spec, seq_len=128)
    lens = doc_lengths(spec)
    docs = np.split(next(iter(corpus_chunks(spec)))[2], np.cumsum(lens)[:-1])
    order = np.random.default_rng([4, 2]).permutation(300)
    want = np.concatenate([np.append(docs[i], EOS_ID) for i in order])
    got = np.stack([s["input_ids"] for s in MDSBlocks(built.path, batch_size=2)])
    assert got.shape == (len(want) // 128, 128)
    assert np.array_equal(got.reshape(-1), want[: got.size])


def _docs(spec: CorpusSpec) -> list[np.ndarray]:
    lens = doc_lengths(spec)
    values = np.concatenate([v for _f, _l, v in corpus_chunks(spec)])
    return np.split(values, np.cumsum(lens)[:-1])


def _stream(docs: list[np.ndarray], order) -> np.ndarray:
    """Documents in ``order``, each followed by EOS, with a Python loop."""
    return np.concatenate([np.append(docs[i], EOS_ID) for i in order])


def test_packed_blocks_cut_the_stream_in_either_order():
    from tokenloom.bench.loader_data import packed_blocks, shuffled_order

    spec = CorpusSpec(docs=300, seed=6)
    docs = _docs(spec)
    for shuffled, order in ((False, range(300)), (True, shuffled_order(spec))):
        blocks = np.concatenate(list(packed_blocks(spec, seq_len=100, shuffled=shuffled)))
        want = _stream(docs, order)
        assert blocks.shape == (len(want) // 100, 100) and blocks.dtype == np.uint16
        assert np.array_equal(blocks.reshape(-1), want[: blocks.size])


def test_parquet_in_order_preshuffled_and_single_rows(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import pyarrow.parquet as pq

    from tokenloom.bench import loader_data
    from tokenloom.bench.loader_data import shuffled_order
    from tokenloom.bench.loader_parquet import ParquetBlocks, ParquetRows

    # ParquetRows reads a document's whole row group: small groups keep that quick, and 300
    # documents still span three of them
    monkeypatch.setattr(loader_data, "_PARQUET_ROW_GROUP", 128)
    spec = CorpusSpec(docs=300, seed=7)
    docs = _docs(spec)
    plain = build_parquet(str(tmp_path / "c.parquet"), spec)
    shuffled = build_parquet(str(tmp_path / "s.parquet"), spec, shuffled=True)
    order = shuffled_order(spec)
    stored = pq.read_table(shuffled.path)
    assert stored.column("id").to_pylist() == order.tolist()
    assert shuffled.tokens == plain.tokens and shuffled.docs == plain.docs
    assert pq.ParquetFile(shuffled.path).num_row_groups == 3

    def flat(ds) -> np.ndarray:
        batches = list(ds)
        assert batches[0].shape == (2, 64) and str(batches[0].dtype) == "torch.int64"
        return np.concatenate([b.numpy().reshape(-1) for b in batches])

    kw = {"seq_len": 64, "batch_size": 2, "eos_id": EOS_ID}
    for path, want in ((plain.path, _stream(docs, range(300))), (shuffled.path, None)):
        want = _stream(docs, order) if want is None else want
        got = flat(ParquetBlocks(path, order="sequential", **kw))
        assert np.array_equal(got, want[: got.size]) and len(want) - got.size < 128

    rows = np.random.default_rng([3, 1]).permutation(300)  # ParquetRows' order: [seed, epoch]
    want = _stream(docs, rows)
    for threads in (1, 4):  # documents fetched at once: the same stream
        got = flat(ParquetRows(plain.path, seed=3, epoch=1, threads=threads, **kw))
        assert np.array_equal(got, want[: got.size]) and len(want) - got.size < 128
    with pytest.raises(ValueError, match="order must be one of"):
        ParquetBlocks(plain.path, order="reverse", **kw)


def test_webdataset_shards_hold_the_shuffled_blocks(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("webdataset")
    from tokenloom.bench import loader_webdataset
    from tokenloom.bench.loader_data import build_webdataset, packed_blocks

    monkeypatch.setattr(loader_webdataset, "BLOCKS_PER_SHARD", 100)  # several shards
    spec = CorpusSpec(docs=400, seed=8)
    built = build_webdataset(str(tmp_path / "c.wds"), spec, seq_len=128)
    want = np.concatenate(list(packed_blocks(spec, seq_len=128, shuffled=True)))
    assert len(loader_webdataset.shard_urls(built.path)) == -(-len(want) // 100)
    assert built.tokens == want.size
    got = [b.numpy() for b in loader_webdataset.wds_blocks(built.path, batch_size=4)]
    assert all(b.shape == (4, 128) and b.dtype == np.int64 for b in got)
    assert np.array_equal(np.concatenate(got), want[: 4 * len(got)])
    assert len(want) - 4 * len(got) < 4


def test_mds_own_shuffle_permutes_the_ordered_blocks(tmp_path):
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed (see tokenloom.bench.loader_mds)")
    pytest.importorskip("torch")
    from tokenloom.bench.loader_data import build_mds, packed_blocks
    from tokenloom.bench.loader_mds import MDSBlocks

    spec = CorpusSpec(docs=300, seed=4)
    built = build_mds(str(tmp_path / "o.mds"), spec, seq_len=128, shuffled=False)
    want = np.concatenate(list(packed_blocks(spec, seq_len=128, shuffled=False)))
    plain = np.stack([s["input_ids"] for s in MDSBlocks(built.path, batch_size=2)])
    assert np.array_equal(plain, want)  # stored in document order
    mixed = np.stack(
        [s["input_ids"] for s in MDSBlocks(built.path, batch_size=2, shuffle_algo="py1e")]
    )
    assert mixed.shape == want.shape and not np.array_equal(mixed, want)
    key = lambda a: sorted(map(bytes, a))  # noqa: E731 - blocks as a multiset
    assert key(mixed) == key(want)
