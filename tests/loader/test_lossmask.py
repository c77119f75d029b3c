"""Loss masks as a column: the loader's labels against a hand reference for every recipe, the
ledger's and the stats' masked counts, bad spans refused, and the mask's name fingerprinted."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.backfill import add_column, udf
from tokenloom.loader import PackedDataset, ResumeMismatchError, naive_pack, step_blocks
from tokenloom.loader.observe.ledger import ledger
from tokenloom.loader.pipeline.lossmask import (
    LossMaskColumnError,
    LossMaskDataError,
    naive_stretch_mask,
    stretch_mask,
)
from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.table import Table

L = 32
MASK = pa.list_(pa.int32())


def _byte_spans(text: str, pattern: str) -> list[tuple[int, int]]:
    """Byte-token spans of the pattern's matches (the test tables' tokens are UTF-8 bytes)."""
    return [
        (len(text[: m.start()].encode()), len(text[: m.end()].encode()))
        for m in re.finditer(pattern, text)
    ]


@udf(inputs=["id", "text"], output=pa.field("mask", MASK), version="1")
def messy_mask(batch: pa.RecordBatch) -> pa.Array:
    """Capitalised words, and on every third row the awkward cases: a span over token 0, one
    ending at the last token, an overlapping duplicate, an empty span, pairs in reverse order."""
    out = []
    for rid, text in zip(batch["id"].to_pylist(), batch["text"].to_pylist(), strict=True):
        pairs = _byte_spans(text, r"[A-Z]\w*")
        n = len(text.encode())
        if rid % 3 == 0 and n >= 4:
            pairs += [(0, 3), (n - 2, n), (1, 1)]
            if pairs[0][1] > pairs[0][0] + 1:
                pairs.append((pairs[0][0] + 1, pairs[0][1] + 2))
            pairs.reverse()
        out.append([v for p in pairs for v in p])
    return pa.array(out, type=MASK)


@udf(inputs=["text"], output=pa.field("digits", MASK), version="1")
def digit_mask(batch: pa.RecordBatch) -> pa.Array:
    """Another mask: runs of lower-case vowels."""
    out = [[v for p in _byte_spans(t, r"[aeiou]+") for v in p] for t in batch["text"].to_pylist()]
    return pa.array(out, type=MASK)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    paras = real_paragraphs(60)
    long = " ".join(paras)
    texts = [long[:1], long[: L - 1], long[: 6 * L], *paras[:40]]  # edge and long documents
    uri = token_table(tmp_path_factory.mktemp("lossmask"), texts)
    add_column(uri, None, messy_mask, workers=0)
    add_column(uri, None, digit_mask, workers=0)
    return uri


def _spans_of(uri: str, column: str) -> dict[int, list[tuple[int, int]]]:
    t = Table.open(uri).dataset.to_table(columns=["id", column])
    return {
        i: [(v[k], v[k + 1]) for k in range(0, len(v), 2)]
        for i, v in zip(t["id"].to_pylist(), t[column].to_pylist(), strict=True)
    }


def _by_hand(labels: np.ndarray, provenance: np.ndarray, spans_of: dict) -> tuple[np.ndarray, int]:
    """The masked labels, position by position: the position holding token ``t`` of a row
    targets token ``t + 1``, which the mask takes out when a span of the row holds it."""
    out = labels.copy()
    for blk, pos, rid, start, end in provenance.tolist():
        for j in range(end - start):
            target = start + j + 1
            if out[blk, pos + j] != -100 and any(a <= target < b for a, b in spans_of[rid]):
                out[blk, pos + j] = -100
    return out, int((out != labels).sum())


RECIPES = {
    "concat": {},
    "concat-no-lookahead": {"lookahead": False},
    "best_fit": {"packing": "best_fit"},
    "windows-overlap": {"long_docs": "window", "window": 24, "overlap": 8},
    "best_fit-windows": {"packing": "best_fit", "long_docs": "window", "overlap": 6},
    "mixture": {"mixture": {"even": ("id % 2 = 0", 0.4), "odd": ("id % 2 = 1", 0.6, 2)}},
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_labels_equal_the_hand_reference(table, recipe):
    opts = {"seq_len": L, "global_batch": 4, "seed": 3, **RECIPES[recipe]}
    plain = PackedDataset(table, **opts)
    masked = PackedDataset(table, loss_mask_column="mask", **opts)
    spans_of = _spans_of(table, "mask")
    total = 0
    for a, b in zip(plain.batches(), masked.batches(), strict=True):
        for key in ("input_ids", "position_ids", "doc_ids", "cu_seqlens", "spans"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # only labels change
        want, n = _by_hand(a["labels"], a["spans"], spans_of)
        np.testing.assert_array_equal(b["labels"], want)
        total += n
    assert total > 0
    assert masked.stats.masked_tokens == total
    assert masked.stats.loss_positions == plain.stats.loss_positions - total
    led = ledger(masked.planner).total
    assert led["masked_tokens"] == total and led["loss_positions"] == masked.stats.loss_positions


def test_concat_equals_the_naive_stream_masked_by_hand(table):
    """Independent of the loader: the naive stream, packed by hand, then masked by hand."""
    ds = PackedDataset(
        table, seq_len=L, global_batch=4, seed=3, loss_mask_column="mask", block_order="sequential"
    )
    t = Table.open(table).dataset.to_table(columns=["id", "input_ids"])
    rows = dict(zip(t["id"].to_pylist(), t["input_ids"].to_pylist(), strict=True))
    spans_of = _spans_of(table, "mask")
    num_blocks = -(-sum(len(v) + 1 for v in rows.values() if v) // L)
    for s, got in enumerate(ds.batches()):
        blocks = step_blocks(
            s, rank=0, world_size=1, batch_size=4, num_blocks=num_blocks, drop_last=False
        )
        ref = naive_pack(
            rows, blocks, seed=3, epoch=0, seq_len=L, eos_id=256, pad_id=257, lookahead=True
        )
        want, _ = _by_hand(ref.labels, ref.spans, spans_of)
        np.testing.assert_array_equal(got["input_ids"], ref.input_ids)
        np.testing.assert_array_equal(got["labels"], want)


def test_another_mask_column_changes_only_the_labels(table):
    a = list(PackedDataset(table, seq_len=L, global_batch=4, loss_mask_column="mask").batches())
    b = list(PackedDataset(table, seq_len=L, global_batch=4, loss_mask_column="digits").batches())
    spans_of = _spans_of(table, "digits")
    plain = PackedDataset(table, seq_len=L, global_batch=4).batches()
    for x, y, p in zip(a, b, plain, strict=True):
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])
        np.testing.assert_array_equal(y["labels"], _by_hand(p["labels"], p["spans"], spans_of)[0])
    assert any((x["labels"] != y["labels"]).any() for x, y in zip(a, b, strict=True))


def test_resume_with_another_mask_column_is_refused(table):
    ds = PackedDataset(table, seq_len=L, global_batch=4, loss_mask_column="mask")
    it = ds.batches()
    next(it)
    state = ds.state_dict()
    for other in ({"loss_mask_column": "digits"}, {}):
        fresh = PackedDataset(table, seq_len=L, global_batch=4, allow_data_change=True, **other)
        with pytest.raises(ResumeMismatchError, match="loss_mask_column"):
            fresh.load_state_dict(state)
    same = PackedDataset(table, seq_len=L, global_batch=4, loss_mask_column="mask")
    same.load_state_dict(state)
    np.testing.assert_array_equal(next(same.batches())["labels"], next(it)["labels"])


def _with_column(tmp_path, values, typ=MASK):
    """Three rows (11, 3 and 11 tokens) and a column ``m`` of ``values`` by id (else null)."""
    import lance

    uri = token_table(tmp_path, ["Hello there", "abc", "Zed is here"])
    ds = lance.dataset(uri)
    ids = ds.to_table(columns=["id"])["id"]
    col = pa.array([values.get(i) for i in ids.to_pylist()], type=typ)
    ds.merge(pa.table({"id": ids, "m": col}), left_on="id")
    return uri


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({0: [0, 2, 3]}, "holds 3 values"),
        ({0: [2, 1]}, r"span \[2, 1\)"),
        ({1: [0, 4]}, r"span \[0, 4\).*3 tokens"),
        ({2: [-1, 2]}, r"span \[-1, 2\)"),
    ],
)
def test_a_bad_span_is_refused_naming_the_row(tmp_path, values, match):
    uri = _with_column(tmp_path, {0: [], 1: [], 2: [], **values})
    ds = PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="m")
    with pytest.raises(LossMaskDataError, match=match):
        list(ds.batches())


def test_null_masks_are_refused_unless_missing_is_allowed(tmp_path):
    uri = _with_column(tmp_path, {0: [0, 2], 2: [1, 3]})  # row 1: null
    with pytest.raises(LoaderError, match="1 selected rows have no value.*tokenloom refresh"):
        PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="m")
    ds = PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="m", allow_missing=True)
    assert sum(1 for _ in ds.batches()) and ds.stats.masked_tokens > 0


@pytest.mark.parametrize("typ", [pa.list_(pa.string()), pa.int32(), pa.list_(pa.float32())])
def test_a_column_of_another_type_is_refused(tmp_path, typ):
    value = {pa.int32(): 1}.get(typ, [])
    uri = _with_column(tmp_path, {0: value, 1: value, 2: value}, typ)
    with pytest.raises(LossMaskColumnError, match="must be list<int32>"):
        PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="m")
    with pytest.raises(LossMaskColumnError, match="no such column"):
        PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="nope")


def test_a_token_column_is_not_a_mask(tmp_path):
    import lance

    from tokenloom.loader.plan.epoch import PlanError

    uri = _with_column(tmp_path, {})
    with pytest.raises(PlanError, match="holds the token ids or their counts"):
        PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="input_ids")
    ds = lance.dataset(uri)  # another token column (it records a tokenizer) is refused too
    t = ds.to_table(columns=["id", "input_ids"])
    field = t.schema.field("input_ids").with_name("copy")
    ds.merge(
        pa.table(
            {"id": t["id"], "copy": t["input_ids"]}, schema=pa.schema([t.schema.field("id"), field])
        ),
        left_on="id",
    )
    with pytest.raises(LossMaskColumnError, match="is a token column"):
        PackedDataset(uri, seq_len=8, global_batch=2, loss_mask_column="copy")


def test_stretch_mask_equals_the_naive_reference():
    rng = np.random.default_rng(0)
    for _ in range(200):
        R = int(rng.integers(1, 5))
        n = rng.integers(0, 30, size=R)
        spans_of = {}
        for r in range(R):
            k = int(rng.integers(0, 4))
            a = rng.integers(0, n[r] + 1, size=k)
            b = np.minimum(a + rng.integers(0, 8, size=k), n[r])
            spans_of[r] = list(zip(a.tolist(), b.tolist(), strict=True))
        S = int(rng.integers(0, 6))
        rows = rng.integers(0, R, size=S)
        starts = np.array([rng.integers(0, n[r] + 1) for r in rows], dtype=np.int64)
        ends = [rng.integers(s, n[r] + 1) for s, r in zip(starts, rows, strict=True)]
        stops = np.array(ends, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(stops - starts)]).astype(np.int64)
        ptr = np.concatenate([[0], np.cumsum([len(spans_of[r]) for r in range(R)])])
        pairs = np.array([p for r in range(R) for p in spans_of[r]], dtype=np.int64).reshape(-1, 2)
        got = stretch_mask(pairs, ptr.astype(np.int64), rows, starts, stops, offsets)
        want = naive_stretch_mask(spans_of, rows.tolist(), starts.tolist(), stops.tolist())
        np.testing.assert_array_equal(got, want)


def test_the_reader_gives_the_same_mask_from_a_take_a_fetch_and_its_cache(table):
    """Spans come with the rows whatever the source: one take, a fetch ahead (whole or partial),
    and the long-document cache across calls (a document read in pieces by several calls)."""
    import lance

    from tokenloom.loader.pipeline.read import TokenReader

    ds = lance.dataset(table)
    t = ds.to_table(columns=["id", "n_tokens"], with_row_id=True)
    rowids = t["_rowid"].to_numpy().astype(np.uint64)
    counts = t["n_tokens"].to_numpy().astype(np.int64)
    ids = t["id"].to_numpy()
    spans_of = _spans_of(table, "mask")
    rng = np.random.default_rng(2)
    pick = rng.choice(len(rowids), 40)
    starts = rng.integers(0, np.maximum(counts[pick] // 2, 1))
    stops = np.maximum(starts, counts[pick] - rng.integers(0, 3, len(pick)))
    want = naive_stretch_mask(spans_of, ids[pick].tolist(), starts.tolist(), stops.tolist())
    reader = TokenReader(table, ds.version, "input_ids", mask_column="mask")
    for held in (None, rowids[pick], rowids[pick[:10]]):
        fresh = TokenReader(table, ds.version, "input_ids", mask_column="mask")
        fetched = None if held is None else reader.fetch(held, parts=2)
        _, _, got, _ = fresh.read_masked(rowids[pick], starts, stops, counts[pick], fetched)
        np.testing.assert_array_equal(got, want)
    # the longest row in four calls, each a piece of it: later calls hit the cache
    j = int(np.argmax(counts))
    cached = TokenReader(table, ds.version, "input_ids", mask_column="mask")
    cuts = np.linspace(0, counts[j], 5).astype(np.int64)
    pieces = []
    for k in range(4):
        pieces.append(cached.read_masked(rowids[[j]], cuts[[k]], cuts[[k + 1]], counts[[j]])[2])
        assert (int(rowids[j]) in cached._masks) == (k < 3)  # kept with its tokens until done
    whole = naive_stretch_mask(spans_of, [int(ids[j])], [0], [int(counts[j])])
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


def test_dataloader_workers_deliver_the_same_masked_labels(table):
    torch = pytest.importorskip("torch")
    from tokenloom.loader import DataLoader

    opts = {"seq_len": L, "global_batch": 4, "seed": 3, "loss_mask_column": "mask"}
    inproc = PackedDataset(table, **opts)
    want = [b["labels"].copy() for b in inproc.batches()]
    dl = DataLoader(PackedDataset(table, **opts), num_workers=2)
    got = [b["labels"] for b in dl]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, torch.from_numpy(w))
    assert dl.stats.masked_tokens == inproc.stats.masked_tokens > 0
    assert dl.ledger.pools()[0].masked_tokens == inproc.stats.masked_tokens


def test_masked_token_count_counts_overlaps_once():
    from tokenloom.loader.pipeline.lossmask import masked_token_count

    rng = np.random.default_rng(4)
    for _ in range(200):
        R = int(rng.integers(1, 6))
        spans_of = {r: [] for r in range(R)}
        for r in range(R):
            for _ in range(int(rng.integers(0, 5))):
                a = int(rng.integers(0, 30))
                spans_of[r].append((a, a + int(rng.integers(0, 9))))
        ptr = np.concatenate([[0], np.cumsum([len(spans_of[r]) for r in range(R)])])
        pairs = np.array([p for r in range(R) for p in spans_of[r]], dtype=np.int64).reshape(-1, 2)
        want = [len({t for a, b in spans_of[r] for t in range(a, b)}) for r in range(R)]
        assert masked_token_count(pairs, ptr.astype(np.int64)).tolist() == want
