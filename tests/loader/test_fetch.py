"""Fetch spans (loader/pipeline/fetch.py) on a local table: rows fetched ahead give exactly the
token ranges a plain read gives, a fetch that lacks rows is completed by a take, spans are cut from
consecutive read groups, and a pipeline finds the spans its predecessor fetched ahead for it.
The object-store pipeline built on them is tested in tests/s3/test_fetch_s3.py."""

from __future__ import annotations

import pickle
import threading

import lance
import numpy as np

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.loader.pipeline.fetch import FetchAhead, SpanKey, cut_spans
from tokenloom.loader.pipeline.read import TokenReader
from tokenloom.loader.pipeline.readahead import (
    FETCH_AHEAD_BYTES,
    FETCH_BYTES,
    FETCH_FRACTION,
    MAX_FETCH_BYTES,
    ROW_FETCH_BYTES,
    per_row_reads,
    resident_reads,
    rows_per_fetch,
)


def _reader(tmp_path):
    uri = token_table(tmp_path, real_paragraphs(40))
    ds = lance.dataset(uri)
    t = ds.to_table(columns=["n_tokens"], with_row_id=True)
    rowids = t.column("_rowid").to_numpy().astype(np.uint64)
    counts = t.column("n_tokens").to_numpy().astype(np.int64)
    return TokenReader(uri, ds.version, "input_ids"), rowids, counts


def test_fetched_rows_read_the_same_ranges_as_a_take(tmp_path):
    reader, rowids, counts = _reader(tmp_path)
    rng = np.random.default_rng(0)
    pick = rng.choice(len(rowids), 30)  # repeats: a document cut into several stretches
    starts = rng.integers(0, np.maximum(counts[pick] // 2, 1))
    stops = np.maximum(starts, counts[pick] - rng.integers(0, 3, len(pick)))
    want, want_off, _ = reader.read_ranges(rowids[pick], starts, stops, counts[pick])
    # the whole set fetched ahead, then only part of it (the rest is taken when reading)
    for held in (rowids[pick], rowids[pick[:10]]):
        fetched = reader.fetch(held, parts=3)
        assert np.all(np.diff(fetched.rowids.astype(np.int64)) > 0)  # distinct, ascending
        fresh = TokenReader(reader.uri, reader.version, "input_ids")
        got, off, _ = fresh.read_ranges(rowids[pick], starts, stops, counts[pick], fetched)
        np.testing.assert_array_equal(off, want_off)
        np.testing.assert_array_equal(got, want)


def test_spans_cut_consecutive_groups():
    assert cut_spans(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert cut_spans(2, 5) == [range(0, 2)]
    assert cut_spans(0, 4) == []
    assert cut_spans(3, 0) == [range(0, 1), range(1, 2), range(2, 3)]


def test_a_span_key_is_hashed_once_and_compares_by_value():
    groups = tuple((i * 4, i * 4 + 4) for i in range(5000))  # an epoch's read groups
    key = SpanKey(epoch=3, groups=groups, per_span=2)
    same = SpanKey(epoch=3, groups=tuple(list(groups)), per_span=2)
    assert key == same and hash(key) == hash(same) and {(key, 7): 1}[(same, 7)] == 1
    assert key != SpanKey(epoch=4, groups=groups, per_span=2)
    assert key != SpanKey(epoch=3, groups=groups[:-1], per_span=2)
    assert key != SpanKey(epoch=3, groups=groups, per_span=3)
    assert "_hash" not in repr(key)
    assert pickle.loads(pickle.dumps(key)) == key  # (sent to workers with their stream)
    assert hash(pickle.loads(pickle.dumps(key))) == hash(key)


def test_rows_per_fetch_holds_a_share_of_the_epoch_within_bounds():
    mean = 1600.0  # bytes per row
    assert rows_per_fetch(mean * 1_000, 1_000) == 1_000  # a small table: all of it
    assert rows_per_fetch(mean * 20_000, 20_000) == int(FETCH_BYTES / mean)  # 16 MB of 32 MB
    mid = 100_000  # 160 MB: a quarter of the rows is more than FETCH_BYTES
    assert rows_per_fetch(mean * mid, mid) == mid // FETCH_FRACTION > FETCH_BYTES / mean
    edge = int(FETCH_FRACTION * MAX_FETCH_BYTES / mean)  # spans of a quarter at the cap
    assert not per_row_reads(mean * edge)
    assert rows_per_fetch(mean * edge, edge) == int(MAX_FETCH_BYTES / mean)  # the memory cap
    # past it, per-row reads: the same span whatever the table's size (memory stays flat)
    for big in (edge + 1_000, 10 * edge, 1_000_000_000):
        assert per_row_reads(mean * big)
        assert rows_per_fetch(mean * big, big) == int(ROW_FETCH_BYTES / mean)


def test_a_pipeline_finds_the_spans_fetched_ahead_for_it(tmp_path):
    reader, rowids, _ = _reader(tmp_path)
    groups = [range(i, i + 1) for i in range(10)]  # a "group" here: one row of the table
    rows = lambda g: rowids[[g]]  # noqa: E731
    key0 = SpanKey(epoch=0, groups=tuple((g.start, g.stop) for g in groups), per_span=3)
    key1 = SpanKey(epoch=1, groups=key0.groups, per_span=3)
    fetcher = FetchAhead(reader, depth=2, parts=1)
    try:
        fetcher.start(key0, rows, following=lambda: (key1, rows))
        got = []
        for g in range(len(groups)):
            fetched = fetcher.get(g)[0].result()
            assert rowids[g] in fetched.rowids
            got.append(fetched)
            fetcher.done(g)
        assert got[0] is got[2] and got[3] is not got[2]  # one fetch per span of 3 groups
        fetcher.start(key1, rows)  # the next epoch: its first span was fetched ahead
        assert fetcher.carried == 1
        fetcher.start(SpanKey(epoch=5, groups=key0.groups, per_span=3), rows)  # elsewhere
        assert fetcher.carried == 1  # nothing kept for a pipeline nobody fetched ahead for
        assert fetcher.get(0)[0].result().rowids.tolist() == rowids[:3].tolist()
    finally:
        fetcher.close()


def test_a_table_within_the_fetch_budget_is_held_for_every_epoch(tmp_path, monkeypatch):
    """The first group asked for while the held fetch runs (held back here until released) is
    served from its own rows; the others wait for the held rows, which then serve every group
    of every epoch and count only the rows the lead did not."""
    assert resident_reads(FETCH_AHEAD_BYTES) and not resident_reads(FETCH_AHEAD_BYTES + 1)
    assert not resident_reads(FETCH_AHEAD_BYTES * 0.6, processes=2)  # a copy per worker
    assert not resident_reads(FETCH_AHEAD_BYTES * 4) and per_row_reads(FETCH_AHEAD_BYTES * 4)
    reader, rowids, _ = _reader(tmp_path)
    released, plain = threading.Event(), reader.fetch

    def fetch(ids, **kw):
        if len(ids) == len(rowids):  # the whole selection: held back until released
            assert released.wait(60)
        return plain(ids, **kw)

    monkeypatch.setattr(reader, "fetch", fetch)
    groups = tuple((g, g + 2) for g in range(0, 20, 2))
    rows = lambda g: rowids[[2 * g, 2 * g + 1]]  # noqa: E731
    fetcher = FetchAhead(reader, depth=2, parts=2)
    try:
        fetcher.start(SpanKey(epoch=0, groups=groups, per_span=3), rows, held=lambda: rowids)
        assert fetcher.holding and fetcher.span_rows(4).tolist() == rowids[[8, 9]].tolist()
        fetcher.hold()
        asked = [fetcher.get(g) for g in range(len(groups))]
        # the lead: the first group's own rows, in while the held fetch waits; it carries them
        assert asked[0][0].result(timeout=60).rowids.tolist() == rowids[[0, 1]].tolist()
        assert asked[0][1] and fetcher.leads == 1 and fetcher.lead_rows == 2
        assert not asked[1][0].done() and all(asked[g][0] is asked[1][0] for g in range(1, 10))
        assert [c for _, c in asked[1:]] == [True] + [False] * 8  # the held read counted once
        released.set()
        held = asked[1][0].result(timeout=60)
        assert held.rowids.tolist() == sorted(rowids.tolist())
        assert held.read[0] == len(rowids) - 2  # the lead's rows counted by its group
        for g in range(10):
            fetcher.done(g)
        fetcher.start(SpanKey(epoch=1, groups=groups, per_span=3), rows, held=lambda: rowids)
        again = [fetcher.get(g) for g in range(len(groups))]
        assert all(f is asked[1][0] and not c for f, c in again)  # held: no lead, counted once
        assert fetcher.carried == 1 and fetcher.leads == 1
        assert reader.rows_read == len(rowids) + 2  # the lead's rows fetched twice, no more
        fetcher.start(SpanKey(epoch=2, groups=groups, per_span=3), rows)  # not held any more
        future, first = fetcher.get(3)  # the first group of span 1 (groups 3-5)
        assert not fetcher.holding and first
        assert future.result().rowids.tolist() == rowids[6:12].tolist()
    finally:
        released.set()
        fetcher.close()


def test_a_fetch_leaves_out_documents_the_cache_holds(tmp_path):
    reader, rowids, counts = _reader(tmp_path)
    long = int(np.argmax(counts))
    half = int(counts[long] // 2)
    ids, n = rowids[[long]], counts[[long]]
    want, _, _ = TokenReader(reader.uri, reader.version, "input_ids").read_ranges(
        ids, np.array([half]), n, n
    )
    reader.read_ranges(ids, np.array([0]), np.array([half]), n)  # goes on: kept in the cache
    others = [i for i in range(3) if i != long][:2]
    fetched = reader.fetch(rowids[[long, *others]])
    assert rowids[long] not in fetched.rowids and len(fetched.rowids) == 2
    got, _, _ = reader.read_ranges(ids, np.array([half]), n, n, fetched)
    np.testing.assert_array_equal(got, want)
