"""Tests of the held-out split filters, evaluated by a real SQL engine (sqlite3)."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tokenloom.curate import CurateError, heldout_filter, heldout_mask, train_filter


@pytest.fixture(scope="module")
def db() -> sqlite3.Connection:
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (id INTEGER, row_id INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, i) for i in range(20_000)])
    return con


def _select(db: sqlite3.Connection, where: str) -> np.ndarray:
    return np.array([r[0] for r in db.execute(f"SELECT id FROM t WHERE {where} ORDER BY id")])


def test_filters_read_as_documented():
    assert heldout_filter() == "id % 100 = 0" and train_filter() == "id % 100 != 0"
    assert heldout_filter(5) == "id % 100 < 5" and train_filter(5) == "id % 100 >= 5"
    assert heldout_filter(0.5, column="row_id") == "row_id % 1000 < 5"
    assert heldout_filter(12.25) == "id % 10000 < 1225"


@pytest.mark.parametrize("percent", [1, 2, 5, 0.5, 0.01, 33.3, 99])
def test_sql_and_numpy_agree_exactly_and_split_every_row_once(db, percent):
    ids = np.arange(20_000)
    held, train = _select(db, heldout_filter(percent)), _select(db, train_filter(percent))
    np.testing.assert_array_equal(held, ids[heldout_mask(ids, percent)])
    assert np.intersect1d(held, train).size == 0 and held.size + train.size == ids.size
    assert held.size == round(ids.size * percent / 100)  # exact over whole periods


def test_a_larger_heldout_set_contains_the_smaller(db):
    one, two = _select(db, heldout_filter(1)), _select(db, heldout_filter(2))
    assert np.isin(one, two).all()


def test_membership_never_depends_on_other_rows():
    ids = np.arange(1_000)
    grown = np.arange(5_000)  # more rows ingested later keep their split
    np.testing.assert_array_equal(heldout_mask(ids), heldout_mask(grown)[:1_000])


@pytest.mark.parametrize("percent", [0, 100, -1, 0.001, True, "1", float("nan")])
def test_bad_percent_is_refused(percent):
    with pytest.raises(CurateError, match="percent"):
        heldout_filter(percent)


def test_bad_column_is_refused():
    with pytest.raises(CurateError, match="column"):
        train_filter(column="id; DROP TABLE t")
