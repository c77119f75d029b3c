"""A curriculum run through the real CLI: ``train --order-by/--order-jitter``, killed with
SIGKILL and resumed to the same weights as an uninterrupted run; ``trace`` and ``ledger`` on it;
a resume with another order refused; bad options refused as usage errors (exit 2); two stages
chained with ``--init-from`` and a filter on the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import lance
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # kill/resume through real training processes: minutes

from tests.conftest import REPO, invoke, real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.loader.test_order import quality, reference  # noqa: E402
from tests.train.torchrun import step_on_disk  # noqa: E402
from tokenloom.backfill import add_column  # noqa: E402
from tokenloom.search.trace import open_run  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402

BASE = ("--model", "tiny", "--device", "cpu", "--seq-len", "32", "--global-batch-size", "4")
ORDER = ("--order-by", "quality DESC", "--order-jitter", "3")
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    uri = token_table(tmp_path_factory.mktemp("curriculum"), real_paragraphs(40))
    add_column(uri, None, quality, workers=0)
    return uri


def _quality(uri: str) -> dict[int, float | None]:
    t = lance.dataset(uri).to_table(columns=["id", "quality"]).to_pydict()
    return dict(zip(t["id"], t["quality"], strict=True))


def _trace_rows(out: str, step: int) -> list[int]:
    rows = json.loads(invoke("trace", "--run", out, "--step", str(step), "--json"))["rows"]
    return [r["row_id"] for r in sorted(rows, key=lambda r: (r["block"], r["position"]))]


@pytest.mark.parametrize(
    ("command", "args", "words"),
    [
        ("train", ("--order-by", "nope DESC"), ("'--order-by'", "no column 'nope'", "quality")),
        ("ledger", ("--order-by", "text"), ("'--order-by'", "column 'text'", "n_chars")),
        ("ledger", ("--order-by", "quality DOWN"), ("--order-by", "does not parse")),
        ("ledger", ("--order-jitter", "3"), ("--order-jitter", "order_by")),
        ("ledger", ("--order-jitter", "0"), ("--order-jitter",)),
        ("ledger", ("--order-by", "quality", "--block-order", "interleave"), ("--block-order",)),
    ],
)
def test_bad_order_options_are_usage_errors(table, tmp_path, command, args, words):
    extra = ("--out", str(tmp_path / "run"), "--steps", "2") if command == "train" else ()
    res = run_cli(command, "--table", table, *(BASE if command == "train" else ()), *extra, *args)
    assert res.returncode == 2, res.stderr + res.stdout
    for word in words:
        assert word in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    if "nope" in args[1]:
        assert "its columns: id, text, source, n_chars" in res.stderr


def _train(out, *args: str, background: bool = False):  # noqa: ANN202
    cmd = [sys.executable, "-m", "tokenloom.cli.main", "train", "--out", str(out), *args]
    env = {
        **os.environ,
        **ENV,
        "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    }
    if background:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def test_kill_9_and_resume_gives_the_uninterrupted_run(table, tmp_path):
    steps = ("--steps", "12", "--checkpoint-every", "1", "--log-every", "1")
    full, killed = tmp_path / "full", tmp_path / "killed"
    res = _train(full, "--table", table, *BASE, *ORDER, *steps)
    assert res.returncode == 0, res.stderr
    proc = _train(killed, "--table", table, *BASE, *ORDER, *steps, background=True)
    deadline = time.time() + 240
    while step_on_disk(killed) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()
    assert 3 <= step_on_disk(killed) < 12

    other = _train(killed, "--resume", "--order-by", "quality ASC")
    assert other.returncode == 1, other.stderr
    assert "--order-by" in other.stderr and "'quality DESC NULLS LAST'" in other.stderr
    done = _train(killed, "--resume")
    assert done.returncode == 0, done.stderr

    a, b = load_checkpoint(full), load_checkpoint(killed)
    assert a.model.keys() == b.model.keys()
    for name, tensor in a.model.items():
        assert torch.equal(tensor, b.model[name]), name  # the same batches, bit for bit
    assert read_record(full).pools == read_record(killed).pools

    want = reference(table, jitter=3, seed=0)  # the curriculum, from the stored values
    seen = _trace_rows(str(killed), 1)
    assert seen and seen[0] == want[0] and set(seen) <= set(want[: len(seen) + 3])
    led = json.loads(invoke("ledger", "--run", str(killed), "--json"))
    assert led["pools"][0]["body_tokens"] > 0


def test_two_stages_chain_filters_on_the_key(table, tmp_path):
    values = _quality(table)
    s1, s2 = str(tmp_path / "stage1"), str(tmp_path / "stage2")
    invoke(
        "train", "--out", s1, "--table", table, *BASE, "--filter", "quality >= 5",
        "--order-by", "quality DESC", "--steps", "3",
    )  # fmt: skip
    invoke(
        "train", "--out", s2, "--table", table, *BASE, "--init-from", s1, "--filter",
        "quality < 5", "--order-by", "quality DESC", "--order-jitter", "2", "--steps", "3",
    )  # fmt: skip
    record = read_record(s2)
    assert record.parent["out"] == os.path.abspath(s1) and record.parent["step"] == 3
    assert record.loader.order_by == "quality DESC NULLS LAST" and record.loader.order_jitter == 2
    one, two = open_run(s1), open_run(s2)
    top = sorted(one.step(1), key=lambda s: (s.block, s.position))
    assert top[0].row_id == reference(table, flt="quality >= 5")[0]
    assert values[top[0].row_id] == 10.0  # the best rows first
    for step in (1, 2, 3):
        assert all(values[s.row_id] >= 5 for s in one.step(step))
        assert all(values[s.row_id] < 5 for s in two.step(step))
