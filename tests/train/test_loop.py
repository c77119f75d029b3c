"""The training loop: loss falls, checkpoints are atomic, and resume is exact (CPU, fp32)."""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import LoaderSpec, ResumeMismatchError  # noqa: E402
from tokenloom.train.loop import TrainConfig, load_checkpoint, train  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("train"), real_paragraphs(60))


def _cfg(table, out, loader=None, **kw):
    spec = LoaderSpec(
        **{
            "table": table,
            "seq_len": 64,
            "global_batch": 4,
            "filter": "id % 10 != 0",
            **(loader or {}),
        }
    )
    return TrainConfig(
        loader=spec,
        out=str(out),
        steps=6,
        checkpoint_every=3,
        eval_every=3,
        eval_batches=2,
        log_every=100,
        val_filter="id % 10 = 0",
        **kw,
    )


def test_resume_continues_exactly(table, tmp_path):
    full = train(_cfg(table, tmp_path / "a"), log=lambda *_: None)
    assert len(full.losses) == 6
    first = train(dataclasses.replace(_cfg(table, tmp_path / "b"), stop_at=3), log=lambda *_: None)
    assert first.losses == full.losses[:3]
    rest = train(_cfg(table, tmp_path / "b"), resume=True, log=lambda *_: None)
    assert rest.losses == full.losses[3:]  # bit-identical on CPU fp32
    ckpt = load_checkpoint(tmp_path / "b")
    assert ckpt.step == 6 and ckpt.record.loader_state["step"] == 6
    record = read_record(tmp_path / "b")
    assert record.tokenizer["eos_id"] == 256 and record.loader.table == os.path.abspath(table)
    assert record.pools == full.pools
    assert not [f for f in os.listdir(tmp_path / "b") if ".tmp" in f]  # atomic writes


def test_resume_with_another_filter_is_refused(table, tmp_path):
    train(dataclasses.replace(_cfg(table, tmp_path), stop_at=3), log=lambda *_: None)
    changed = _cfg(table, tmp_path, loader={"filter": "id % 10 != 1"})
    with pytest.raises(ResumeMismatchError, match="filter"):
        train(changed, resume=True, log=lambda *_: None)


def test_tiny_model_learns(table, tmp_path):
    res = train(
        dataclasses.replace(_cfg(table, tmp_path), steps=60, checkpoint_every=60, eval_every=60),
        log=lambda *_: None,
    )
    first, last = sum(res.losses[:5]) / 5, sum(res.losses[-5:]) / 5
    assert last < 0.8 * first and last < 4.0  # uniform over 258 byte ids would be 5.55
    assert res.val_losses and res.val_losses[-1][1] < res.losses[0]


def test_resume_reads_the_pinned_version_after_the_table_moves_on(tmp_path):
    from tokenloom.backfill import add_column
    from tokenloom.backfill.builtin import n_words
    from tokenloom.table import Table

    uri = token_table(tmp_path, real_paragraphs(40))
    full = train(_cfg(uri, tmp_path / "a"), log=lambda *_: None)
    train(dataclasses.replace(_cfg(uri, tmp_path / "b"), stop_at=3), log=lambda *_: None)
    before = Table.open(uri).version
    add_column(uri, None, n_words, workers=0)  # a later backfill: a new table version
    assert Table.open(uri).version > before
    rest = train(_cfg(uri, tmp_path / "b"), resume=True, log=lambda *_: None)
    assert rest.losses == full.losses[3:]


def test_flex_kernel_off_gpu_is_a_clear_error(table, tmp_path):
    from tokenloom.train.loop import TrainError

    with pytest.raises(TrainError, match="--kernel sdpa"):
        train(dataclasses.replace(_cfg(table, tmp_path), kernel="flex"), log=lambda *_: None)


def test_workers_are_started_once_for_a_run_of_several_epochs(table, tmp_path, monkeypatch):
    """With loader workers the run keeps them from one epoch to the next (starting them is ~1 s
    an epoch), trains as the run without workers does, and stops them when it ends."""
    from tokenloom.loader.pipeline.workers import WorkerPool

    pools: list[WorkerPool] = []
    start = WorkerPool.of_loader.__func__

    def counted(cls, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        pools.append(start(cls, *args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(WorkerPool, "of_loader", classmethod(counted))
    runs = {}
    for workers in (0, 2):
        cfg = dataclasses.replace(
            _cfg(table, tmp_path / str(workers)), steps=None, epochs=3, workers=workers
        )
        runs[workers] = train(cfg, log=lambda *_: None)
    assert len(runs[2].losses) == len(runs[0].losses) > 6  # three epochs of several steps
    assert runs[2].losses == pytest.approx(runs[0].losses, rel=1e-6)
    assert len(pools) == 1 and pools[0].persistent and pools[0].stopped
