"""The tiny VLM under torchrun (2 gloo processes on CPU): each rank builds half of every global
step's image+text blocks, and the run's losses and final weights equal one process's with the
same global batch; the run record and the trace name both ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # torchrun with two ranks

from tests.conftest import invoke, run_cli  # noqa: E402
from tests.vision.tables import image_table  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402

ARGS = ["--image-column", "image", "--seq-len", "96", "--max-side", "32", "--global-batch-size",
        "4", "--on-error", "skip", "--model", "tiny", "--lr", "1e-2", "--steps", "4",
        "--checkpoint-every", "2", "--log-every", "1"]  # fmt: skip


def _torchrun(*args: str) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tokenloom.cli.main", "train", *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _fed(run: str) -> dict:
    return read_record(run).loader_state["ledger"]


def test_two_ranks_train_the_vlm_as_one_process(tmp_path):
    table = image_table(tmp_path, bad_images=2, max_side=48, vocab=300)
    one = str(tmp_path / "one")
    invoke("train", "--table", table, "--out", one, *ARGS)
    two = str(tmp_path / "two")
    _torchrun("--table", table, "--out", two, *ARGS)

    a, b = load_checkpoint(one), load_checkpoint(two)
    assert a.step == b.step == 4
    assert [s for s, _ in b.history["train"]] == [s for s, _ in a.history["train"]]
    assert [x for _, x in b.history["train"]] == pytest.approx(
        [x for _, x in a.history["train"]], rel=1e-5
    )
    # the weights too, to float32's sums in another order: gradients are summed over ranks, and
    # Adam divides an element's step by its gradient's size, so where a gradient is near zero the
    # order of the sums moves the step (measured after 4 steps of lr 1e-2: 1.3e-5 at most on one
    # CPU, 7e-5 at 2 of 65,536 elements of an MLP weight on another). A rank left out of a sum
    # moves every element by ~lr a step: every element within 5e-4, and all but 0.1% of each
    # tensor's within float32's rounding of the sums
    for k, v in a.model.items():
        diff = (b.model[k] - v).abs()
        assert float(diff.max()) <= 5e-4, k
        loose = int((diff > 5e-5 + 1e-4 * v.abs()).sum())
        assert loose <= max(1, v.numel() // 1000), (k, loose, v.numel())
    assert read_record(two).topology[-1]["world_size"] == 2
    # the record counts what both ranks were fed: what the one process was fed
    assert _fed(two) == _fed(one) and _fed(one)["blocks"] == 16

    # stopped at step 2 and resumed, on two ranks or on one: the totals continue, once
    for resume_on in (2, 1):
        part = str(tmp_path / f"part{resume_on}")
        _torchrun("--table", table, "--out", part, *ARGS, "--stop-at", "2")
        assert read_record(part).step == 2 and _fed(part)["blocks"] == 8
        if resume_on == 2:
            _torchrun("--out", part, "--resume")
        else:
            invoke("train", "--out", part, "--resume")
        c = load_checkpoint(part)
        assert c.step == 4 and _fed(part) == _fed(one)
        assert [x for _, x in c.history["train"]] == pytest.approx(
            [x for _, x in a.history["train"]], rel=1e-5
        )

    # the trace of a step: the one process's rows, each block now on the rank that built it
    got = [
        json.loads(run_cli("trace", "--run", run, "--step", "3", "--json").stdout)
        for run in (one, two)
    ]

    def placed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "rank"} for r in rows]

    assert placed(got[0]["rows"]) == placed(got[1]["rows"])  # the same rows in the same blocks
    assert {r["rank"] for r in got[0]["rows"]} == {0}
    assert {r["rank"] for r in got[1]["rows"]} == {0, 1}  # each block named with its rank
