"""DDP under torchrun (2 gloo processes on CPU): the same losses as one process with the same
global batch, and a run killed mid-way resumes on another number of processes with the same
data stream and losses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # torchrun with two ranks

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.train.torchrun import kill_launcher_at  # noqa: E402
from tokenloom.loader import LoaderSpec  # noqa: E402
from tokenloom.train.loop import TrainConfig, load_checkpoint, train  # noqa: E402

STEPS = 400  # the schedule's length; runs stop long before (kill / stop_at)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("ddp"), real_paragraphs(80))


def _cfg(table, out, loader=None, **kw) -> TrainConfig:
    spec = {"table": table, "seq_len": 64, "global_batch": 4, "filter": "id % 10 != 0"}
    base = dict(
        loader=LoaderSpec(**{**spec, **(loader or {})}),
        out=str(out),
        steps=STEPS,
        checkpoint_every=2,
        eval_every=1000,
        log_every=1000,
    )
    return TrainConfig(**{**base, **kw})


def _torchrun(table, out, *args: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tokenloom.cli.main", "train", "--table", table, "--out", str(out),
        "--seq-len", "64", "--global-batch-size", "4", "--micro-batch-size", "2",
        "--steps", str(STEPS), "--checkpoint-every", "2", "--log-every", "1000",
        "--filter", "id % 10 != 0", "--provenance-log", *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def test_two_processes_match_one_and_resume_elastically(table, tmp_path):
    out = tmp_path / "ddp"
    proc = _torchrun(table, out)
    kill_launcher_at(proc, out, step=6, timeout=120)
    state = load_checkpoint(out)
    k = state.step
    assert 6 <= k < STEPS and state.record.world_size == 2
    killed = [loss for _, loss in state.history["train"]]
    assert len(killed) == k

    # one process, the same global batch of 4 blocks (B=4, K=1): the same losses
    ref = train(_cfg(table, tmp_path / "ref", stop_at=k + 4), log=lambda *_: None)
    assert killed == pytest.approx(ref.losses[:k], rel=1e-5)

    # resume the killed 2-process run on 1 process (B=2, K=2): the same stream continues
    resumed = train(
        _cfg(table, out, micro_batch_size=2, stop_at=k + 4, provenance_log=True),
        resume=True,
        log=lambda *_: None,
    )
    assert resumed.world_size == 1 and resumed.step == k + 4
    assert resumed.losses == pytest.approx(ref.losses[k:], rel=1e-4)

    # the trace recomputes what each rank was fed, on both topologies of this run
    from tests.search.provenance import assert_trace_matches_log

    assert_trace_matches_log(out, steps=k + 4, world_at=lambda s: 2 if s <= k else 1)


def test_grad_accumulation_equals_the_larger_batch(table, tmp_path):
    whole = train(_cfg(table, tmp_path / "a", stop_at=4), log=lambda *_: None)
    accum = train(_cfg(table, tmp_path / "b", micro_batch_size=1, stop_at=4), log=lambda *_: None)
    assert accum.losses == pytest.approx(whole.losses, rel=1e-5)


def test_another_global_batch_is_refused_on_resume(table, tmp_path):
    from tokenloom.loader import ResumeMismatchError

    train(_cfg(table, tmp_path, stop_at=2), log=lambda *_: None)
    with pytest.raises(ResumeMismatchError, match="global_batch"):
        train(
            _cfg(table, tmp_path, loader={"global_batch": 2}, stop_at=4),
            resume=True,
            log=lambda *_: None,
        )


def test_epochs_are_exact(table, tmp_path):
    cfg = _cfg(table, tmp_path, loader={"global_batch": 8}, steps=None, epochs=2)
    res = train(cfg, log=lambda *_: None)
    from tokenloom.loader import PackedDataset

    ds = PackedDataset(cfg.loader)
    assert res.step == ds.epoch_info(0)["steps"] + ds.epoch_info(1)["steps"]
