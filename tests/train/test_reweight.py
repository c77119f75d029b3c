"""``tokenloom train --resume --mixture new.json --reweight``: each pool keeps the quota it spent,
the rest of the epoch's budget goes by the new shares (per step, as the mixture contract says);
the ledger and ``runs`` show both phases; a kill -9 after the change resumes exactly; shares the
remaining budget cannot meet, other pools, or a changed mixture without --reweight are refused
(exit 2, with the numbers). Through real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # kill/resume through real training processes: minutes

from tests.conftest import REPO, invoke, real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.train.torchrun import step_on_disk  # noqa: E402

L, G, BUDGET, AT = 32, 4, 4096, 6  # 128 blocks: 32 steps an epoch; the change after step 6
LOADER = ["--seq-len", str(L), "--global-batch-size", str(G), "--seed", "5"]
TRAIN = ["--model", "tiny", "--log-every", "100"]
MIX1 = {"even": ["id % 2 = 0", 1], "odd": ["id % 2 = 1", 1]}
MIX2 = {"even": ["id % 2 = 0", 3], "odd": ["id % 2 = 1", 1]}


def _ok(res):  # noqa: ANN001, ANN202
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-step mixture run (1:1) and the files of two other mixtures. Byte tokens (a 258-id
    vocabulary: a tiny model, small checkpoints) of 40 short paragraphs: ~1,200 tokens in each
    pool, fewer than a budget of 4,096 asks of either (pools repeat rows; a capped one cannot)."""
    tmp = tmp_path_factory.mktemp("reweight")
    uri = token_table(tmp, [p for p in real_paragraphs(200) if len(p.encode()) < 100][:40])
    files = {}
    for name, mix in (("mix1", MIX1), ("mix2", MIX2)):
        files[name] = str(tmp / f"{name}.json")
        with open(files[name], "w") as fh:
            json.dump(mix, fh)
    out = str(tmp / "run")
    invoke("train", "--table", uri, "--out", out, *TRAIN, *LOADER, "--mixture", files["mix1"],
           "--budget-tokens", str(BUDGET), "--steps", str(AT), "--checkpoint-every",
           str(AT))  # fmt: skip
    return tmp, uri, out, files


def _blocks(out: str, epoch: int = 0) -> dict[str, int]:
    led = json.loads(invoke("ledger", "--run", out, "--epoch", str(epoch), "--json"))
    return {p["name"]: p["blocks"] for p in led["pools"]}


def test_reweight_keeps_the_spent_quota_and_replans_the_rest(run):
    tmp, _, out, files = run
    spent = _blocks(out)  # the whole epoch as planned: read only its first AT steps below
    from tokenloom.search.trace import open_run

    head = open_run(out)
    before: dict[str, int] = {}
    for s in range(1, AT + 1):
        for pool in {(x.pool, x.rank, x.block) for x in head.step(s)}:
            before[pool[0]] = before.get(pool[0], 0) + 1
    assert before == {"even": AT * G // 2, "odd": AT * G // 2}
    cont = str(tmp / "cont")
    shutil.copytree(out, cont)
    said = invoke("train", "--out", cont, "--resume", "--mixture", files["mix2"], "--reweight",
                  "--steps", "32", "--reschedule")  # fmt: skip
    assert "reweighted from step 7" in said
    after = _blocks(cont)
    remaining = BUDGET // L - AT * G  # 104 blocks
    for name, share in (("even", 0.75), ("odd", 0.25)):
        # within one block per remaining step of share x remaining (the per-step contract)
        got = after[name] - before[name]
        assert abs(got - share * remaining) <= 1, (name, got)
    assert sum(after.values()) == BUDGET // L and after != spent
    # per step of the tail: floor or ceil of G x share
    trace = open_run(cont)
    for s in range(AT + 1, 33):
        n = len({(x.rank, x.block) for x in trace.step(s) if x.pool == "even"})
        assert n == 3, (s, n)
    led = invoke("ledger", "--run", cont)
    assert "reweight even 1, odd 1 -> even 3, odd 1" in led
    assert f"before it: even {before['even']}, odd {before['odd']}" in led
    runs = invoke("runs", "list", str(tmp))
    assert "from step 7 (epoch 0, its step 7): reweight even 1, odd 1 -> even 3, odd 1" in runs
    # later epochs plan the new shares from their start
    assert _blocks(cont, 1) == {"even": 96, "odd": 32}


def test_kill_9_after_the_reweight_resumes_exactly(run):
    tmp, _, out, files = run
    args = ["--mixture", files["mix2"], "--reweight", "--steps", "16", "--reschedule"]
    once, killed = str(tmp / "once"), str(tmp / "killed")
    shutil.copytree(out, once)
    shutil.copytree(out, killed)
    _ok(run_cli("train", "--out", once, "--resume", *args, "--checkpoint-every", "16"))
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenloom.cli.main", "--quiet", "train", "--out", killed,
         "--resume", *args, "--checkpoint-every", "2"],
        env={**os.environ, "PYTHONPATH": path}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 240
    while step_on_disk(killed) < AT + 4 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and step_on_disk(killed) < 16
    _ok(run_cli("train", "--out", killed, "--resume", "--checkpoint-every", "16"))
    a = json.loads(open(os.path.join(once, "last.json")).read())
    b = json.loads(open(os.path.join(killed, "last.json")).read())
    assert a["loader_state"] == b["loader_state"] and a["pools"] == b["pools"]
    assert np.isclose(a["train_loss"], b["train_loss"], rtol=0, atol=0)


def test_refusals_name_the_option_and_the_numbers(run, tmp_path):
    tmp, _, out, files = run
    res = run_cli("train", "--out", out, "--resume", "--mixture", files["mix2"])
    assert res.returncode == 2 and "--mixture" in res.stderr and "--reweight" in res.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"even": ["id % 2 = 0", 1], "three": ["id % 3 = 0", 1]}))
    res = run_cli("train", "--out", out, "--resume", "--mixture", str(other), "--reweight")
    assert res.returncode == 2, res.stderr
    assert "added three" in res.stderr and "removed odd" in res.stderr
    # odd capped at one pass over its rows not yet delivered, at 9/10 of the rest: too few rows
    capped = tmp_path / "capped.json"
    capped.write_text(json.dumps({"even": ["id % 2 = 0", 1], "odd": ["id % 2 = 1", 9, 1]}))
    res = run_cli("train", "--out", out, "--resume", "--mixture", str(capped), "--reweight")
    assert res.returncode == 2, res.stderr
    assert "--mixture" in res.stderr and "pool 'odd' runs out of rows" in res.stderr
    assert "104 blocks (3,328 positions) left" in res.stderr and "odd: share 0.9000" in res.stderr
    res = run_cli("train", "--out", out, "--resume", "--reweight")
    assert res.returncode == 2 and "--mixture new.json" in res.stderr
