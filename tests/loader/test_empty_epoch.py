"""An epoch of zero steps is refused wherever it is read (the dataset, its workers, a resume, a
mixture), naming the cause and the fix, instead of an iteration that yields nothing forever."""

from __future__ import annotations

import multiprocessing

import pytest

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tokenloom.loader import DataLoader, EmptyEpochError, PackedDataset

L = 32


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("empty"), real_paragraphs(20))


def test_a_filter_selecting_nothing_is_refused_naming_the_filter(table):
    ds = PackedDataset(table, seq_len=L, global_batch=4, filter="id < 0")
    with pytest.raises(EmptyEpochError, match=r"--filter 'id < 0' selects 0 rows and no token"):
        len(ds)
    with pytest.raises(EmptyEpochError, match="widen the filter"):
        next(iter(ds))


def test_drop_last_with_less_than_one_global_batch_is_refused_naming_the_fix(table):
    blocks = PackedDataset(table, seq_len=L, global_batch=1).epoch_info()["blocks"]
    ds = PackedDataset(table, seq_len=L, global_batch=blocks + 1, drop_last=True)
    fix = rf"pass --global-batch-size {blocks} or less, or drop --drop-last"
    with pytest.raises(EmptyEpochError, match=fix):
        next(iter(ds))
    with pytest.raises(EmptyEpochError, match=fix):  # through the workers as well
        next(iter(DataLoader(ds, num_workers=2)))
    assert not multiprocessing.active_children()


def test_a_mixture_budget_under_one_global_batch_with_drop_last_is_refused(table):
    mix = {"even": ("id % 2 = 0", 0.5), "odd": ("id % 2 = 1", 0.5)}
    ds = PackedDataset(
        table, seq_len=L, global_batch=8, mixture=mix, budget_tokens=L, drop_last=True
    )
    with pytest.raises(EmptyEpochError, match="fewer than one global batch of 8 blocks"):
        next(iter(ds))


def test_a_resume_into_an_epoch_without_a_step_is_refused(table):
    ds = PackedDataset(table, seq_len=L, global_batch=2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    empty = PackedDataset(table, seq_len=L, global_batch=2, filter="id < 0", allow_data_change=True)
    with pytest.raises(EmptyEpochError, match="epoch 0 has no step"):
        empty.load_state_dict(state)
        next(iter(empty))
