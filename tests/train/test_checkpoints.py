"""Kept checkpoints (``--keep-every/--keep-last/--keep-best``), ``RUN/step-N`` accepted by every
command that reads one, runs of the single-file layout, and atomic writes: ``kill -9`` at any
moment of a save leaves the previous checkpoint loadable (all through the real CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # training processes, killed and resumed

from tests.conftest import REPO, invoke, real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint  # noqa: E402
from tokenloom.train.layout import last_step, list_steps  # noqa: E402
from tokenloom.train.retention import best_step  # noqa: E402

SHAPE = ("--seq-len", "64", "--global-batch-size", "4", "--log-every", "100")
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("ckpt"), real_paragraphs(40))


@pytest.fixture(scope="module")
def kept(table, tmp_path_factory):
    """A run of 8 steps, a checkpoint every 2, keeping every 4th and the 2 most recent."""
    out = tmp_path_factory.mktemp("kept") / "run"
    invoke(
        "train", "--table", table, "--out", str(out), *SHAPE, "--steps", "8",
        "--checkpoint-every", "2", "--keep-every", "4", "--keep-last", "2",
    )  # fmt: skip
    return out


def test_keep_every_and_keep_last(kept):
    assert list_steps(kept) == [4, 6, 8]  # 2 deleted: neither a multiple of 4 nor among the last 2
    assert last_step(kept) == 8
    four = load_checkpoint(kept / "step-4")
    assert four.step == 4 and four.record.loader_state["step"] == 4
    assert len(four.history["train"]) == 4
    last = load_checkpoint(kept)
    assert last.step == 8 and not torch.equal(four.model["wte.weight"], last.model["wte.weight"])
    assert not [f for f in os.listdir(kept) if f.startswith(".")]  # no temporaries left


def test_every_reader_takes_run_slash_step(kept, tmp_path):
    trace = invoke("trace", "--run", str(kept / "step-4"), "--step", "3", "--json")
    assert json.loads(trace)["steps_done"] == 4
    hf = tmp_path / "hf"
    invoke("export", "--checkpoint", str(kept / "step-4"), "--out", str(hf), "--json")
    assert json.loads((hf / "tokenloom.json").read_text())["step"] == 4
    child = tmp_path / "child"
    init = invoke(
        "train", "--table", str(load_checkpoint(kept).record.loader.table), "--out", str(child),
        *SHAPE, "--steps", "1", "--init-from", str(kept / "step-4"),
    )  # fmt: skip
    assert "(step 4)" in init
    parent = json.loads((child / "last.json").read_text())["parent"]
    assert parent["step"] == 4 and parent["out"] == str(kept)


@pytest.mark.parametrize(
    "args",
    [
        ("sample", "--prompt", "x", "--run"),
        ("trace", "--step", "1", "--run"),
        ("export", "--out", "unused", "--checkpoint"),
        ("verify", "--run"),
        ("train", "--out", "unused", "--table", "unused.lance", "--init-from"),
    ],
    ids=["sample", "trace", "export", "verify", "init-from"],
)
def test_a_missing_step_lists_the_steps_kept(kept, tmp_path, args):
    done = run_cli(*args, str(kept / "step-5"), cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "no checkpoint at step 5" in done.stderr and "step-4, step-6, step-8" in done.stderr
    assert "Traceback" not in done.stderr


def test_keep_best_without_validation_is_a_usage_error(table, tmp_path):
    done = run_cli("train", "--table", table, "--out", str(tmp_path / "r"), "--keep-best")
    assert done.returncode == 2, done.stderr
    assert "--keep-best" in done.stderr and "--val-filter" in done.stderr
    assert not (tmp_path / "r").exists()


def test_keep_best_keeps_the_lowest_validation_loss(table, tmp_path):
    out = tmp_path / "best"
    common = ("--val-filter", "id % 10 = 0", "--eval-every", "1", "--eval-batches", "1")
    invoke(
        "train", "--table", table, "--out", str(out), *SHAPE, *common, "--filter",
        "id % 10 != 0", "--steps", "4", "--checkpoint-every", "100", "--keep-best",
    )  # fmt: skip
    # a learning rate far too high: the loss climbs, so the best stays behind the latest
    invoke(
        "train", "--out", str(out), "--resume", "--reschedule", "--steps", "8", "--lr", "3",
        "--warmup-steps", "0",
    )  # fmt: skip
    state = load_checkpoint(out)
    best = best_step(state.history["val"])
    assert best is not None and state.step == 8
    assert list_steps(out) == sorted({best, 8})
    assert load_checkpoint(out / f"step-{best}").record.val_loss == min(
        v for s, v in state.history["val"] if s > 0
    )


def test_a_run_of_the_single_file_layout_loads_and_resumes(table, tmp_path):
    out = tmp_path / "old"
    invoke("train", "--table", table, "--out", str(out), *SHAPE, "--steps", "4", "--stop-at", "2")
    new = load_checkpoint(out)
    # the layout written before step directories: one last.pt beside last.json
    torch.save(
        {
            "model": new.model,
            "optimizer": new.optimizer,
            "step": new.step,
            "rng": new.rng,
            "loader": new.record.loader_state,
            "config": new.config,
            "history": new.history,
            "world_size": 1,
            "parent": None,
            "fed": new.fed,
        },
        out / "last.pt",
    )
    for step in list_steps(out):
        import shutil

        shutil.rmtree(out / f"step-{step}")
    old = load_checkpoint(out)
    assert old.step == 2 and torch.equal(old.model["wte.weight"], new.model["wte.weight"])
    invoke("train", "--out", str(out), "--resume")
    assert list_steps(out) == [4] and not (out / "last.pt").exists()


def _moment(out) -> str | None:
    """Which moment of a save ``out`` shows now (``None``: between saves)."""
    try:
        names = os.listdir(out)
    except FileNotFoundError:
        return None
    if any(n.startswith(".step-") and ".tmp-" in n for n in names):
        return "temporary directory"
    if any(n.startswith("last.json.tmp-") for n in names):
        return "record switching"
    last = last_step(out) or 0
    if any(n.startswith("step-") and int(n[5:]) > last for n in names if n[5:].isdigit()):
        return "renamed, record not yet switched"
    if any(".trash-" in n for n in names):
        return "deleting an older checkpoint"
    return None


MOMENTS = (
    "temporary directory",
    "renamed, record not yet switched",
    "record switching",
    "deleting an older checkpoint",
)


def test_kill_9_at_any_moment_of_a_save_leaves_a_loadable_checkpoint(table, tmp_path):
    out = tmp_path / "killed"
    start = [
        sys.executable, "-m", "tokenloom.cli.main", "train", "--table", table, "--out", str(out),
        *SHAPE, "--steps", "100000", "--checkpoint-every", "1", "--keep-every", "5",
    ]  # fmt: skip
    env = {
        **os.environ,
        **ENV,
        "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    }
    caught = []
    for attempt in range(len(MOMENTS)):
        args = start if attempt == 0 else [*start[:4], "--out", str(out), "--resume"]
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen = last_step(out) or 0
        deadline = time.time() + 120
        moment = None
        wanted, settle = MOMENTS[attempt], None
        while time.time() < deadline and proc.poll() is None:
            # from the second checkpoint of this invocation on: kill at the moment this attempt
            # wants, or (the narrow ones may slip by) at any moment of a save after 10 s
            if (last_step(out) or 0) > seen + 1:
                settle = settle or time.time() + 10
                moment = _moment(out)
                if moment == wanted or (moment and time.time() > settle):
                    break
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        stderr = proc.communicate()[1].decode()
        assert proc.returncode == -signal.SIGKILL, stderr
        caught.append(moment)
        state = load_checkpoint(out)  # the last complete checkpoint loads ...
        assert state.step == last_step(out) > seen and len(state.history["train"]) == state.step
        assert state.record.loader_state["step"] == state.step
    assert any(caught), caught  # at least one kill landed inside a save
    step = last_step(out)
    done = run_cli("train", "--out", str(out), "--resume", "--stop-at", str(step + 2), env=ENV)
    assert done.returncode == 0, done.stderr  # ... and --resume continues it
    assert load_checkpoint(out).step == step + 2
    assert not [n for n in os.listdir(out) if ".tmp-" in n or ".trash-" in n]
    kept = list_steps(out)
    assert kept[-1] == step + 2 and all(s % 5 == 0 for s in kept[:-1])


def test_a_kept_step_survives_a_resume_with_other_rules(table, tmp_path):
    from tokenloom.loader import LoaderSpec
    from tokenloom.train.loop import TrainConfig, train

    spec = LoaderSpec(table=table, seq_len=64, global_batch=4)
    cfg = TrainConfig(loader=spec, out=str(tmp_path / "r"), steps=4, log_every=100,
                      checkpoint_every=1, keep_every=2)  # fmt: skip
    train(cfg, log=lambda *_: None)
    assert list_steps(tmp_path / "r") == [2, 4]
    longer = TrainConfig(loader=spec, out=str(tmp_path / "r"), steps=7, log_every=100,
                         checkpoint_every=1)  # fmt: skip
    train(longer, resume=True, reschedule=True, log=lambda *_: None)
    assert list_steps(tmp_path / "r") == [2, 4, 7]  # immutable, whatever the later rules
