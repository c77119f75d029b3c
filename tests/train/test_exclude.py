"""``tokenloom train --resume --exclude QUARANTINE`` (and a rewind to ``RUN/step-N``): the
quarantined rows never come back, the rest of the stream keeps the order it had; a kill -9 after
the change resumes to the same stream and weights. Through real processes."""

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

LOADER = ["--seq-len", "32", "--global-batch-size", "2", "--seed", "5"]
ORDER = ["--block-order", "sequential"]  # step order is stream order: the tail's order shows
TRAIN = ["--model", "tiny", "--log-every", "100"]


def _ok(res):  # noqa: ANN001, ANN202
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-step run (step-3 and step-6 kept) and a quarantine of its steps 5..6. Byte tokens
    (a 258-id vocabulary: a tiny model, small checkpoints) of 11 short paragraphs: ~800 tokens,
    an epoch of ~13 steps, so the continued runs cross into later epochs."""
    tmp = tmp_path_factory.mktemp("exclude")
    uri = token_table(tmp, real_paragraphs(16)[5:])
    out = str(tmp / "run")
    invoke("train", "--table", uri, "--out", out, *TRAIN, *LOADER, *ORDER, "--steps", "6",
           "--checkpoint-every", "3", "--keep-every", "3")  # fmt: skip
    q = json.loads(invoke("quarantine", "--run", out, "--steps", "5:6", "--name", "q", "--json"))
    return tmp, uri, out, q


def _stream(out: str, first: int, last: int, *, cli: bool = True) -> list[int]:
    """Row ids in stream order over steps ``first..last`` (consecutive stretches of one row
    merged), from the trace of the run (what ``tokenloom trace`` prints; with ``cli``, one CLI
    call checks they agree: once per test is enough)."""
    from tokenloom.search.trace import open_run

    trace = open_run(out)
    if cli:
        got = json.loads(invoke("trace", "--run", out, "--step", str(last), "--json"))
        want = [s.as_tuple() for s in trace.step(last)]
        assert [tuple(r["provenance"]) for r in got["rows"]] == want
    rows: list[int] = []
    for s in range(first, last + 1):
        for x in sorted(trace.step(s), key=lambda x: (x.block, x.position)):
            if not rows or rows[-1] != x.row_id:
                rows.append(x.row_id)
    return rows


def _expected(out: str, at: int, excluded: set[int]) -> list[int]:
    """What the run would have fed after step ``at`` without the change (its plan, pure), minus
    the rows delivered by then and the excluded ones: epoch by epoch, each in its order."""
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.loader.plan.change import delivered_rows
    from tokenloom.train.record import read_record

    planner = Planner(read_record(os.path.join(out, f"step-{at}")).loader)
    ids = np.asarray(planner.inputs.row_ids)
    done = delivered_rows(planner.view(0), at).row_ids.tolist()
    out_rows: list[int] = []
    for epoch in range(3):
        order = ids[np.asarray(planner.view(epoch).plan.order)].tolist()
        skip = excluded | (set(done) if epoch == 0 else set())
        out_rows += [r for r in order if r not in skip]
    return out_rows


def test_exclude_leaves_exactly_the_quarantined_rows_out_and_keeps_the_order(run):
    tmp, _, out, q = run
    cont = str(tmp / "cont")
    shutil.copytree(out, cont)
    said = invoke("train", "--out", cont, "--resume", "--exclude", "q", "--steps", "30",
                  "--reschedule", "--checkpoint-every", "30")  # fmt: skip
    assert f"excluding quarantine 'q' ({q['rows']} rows" in said
    record = json.loads(open(os.path.join(cont, "last.json")).read())
    (change,) = record["loader_state"]["inputs"]["changes"]
    assert change["kind"] == "exclude" and change["global_step"] == 6
    assert change["params"]["quarantine"] == "q" and change["params"]["rows"] == q["rows"]
    stream = _stream(cont, 7, 30)  # the continued run's own trace
    excluded = set(q["row_ids"])
    assert not excluded & set(stream)
    want = _expected(out, 6, excluded)
    assert stream == want[: len(stream)]
    from tokenloom.search.trace import open_run

    assert open_run(cont)._locate(30)[0] >= 1  # later epochs were checked too
    runs = invoke("runs", "list", str(tmp))
    assert "from step 7 (epoch 0, its step 7): exclude quarantine 'q'" in runs


def test_rewind_then_kill_9_resumes_to_the_same_stream_and_weights(run):
    tmp, _, out, q = run
    args = ["--exclude", "q", "--steps", "20", "--reschedule", "--checkpoint-every", "2"]
    once = str(tmp / "once")
    shutil.copytree(out, once)
    _ok(run_cli("train", "--out", os.path.join(once, "step-3"), "--resume", *args))
    assert os.path.isdir(os.path.join(once, "rewound-6-to-3", "step-6"))  # moved, not deleted
    killed = str(tmp / "killed")
    shutil.copytree(out, killed)
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenloom.cli.main", "--quiet", "train", "--out",
         os.path.join(killed, "step-3"), "--resume", *args],
        env={**os.environ, "PYTHONPATH": path}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 240
    # a checkpoint of the rewound run past the old latest (6): the kill lands after the change
    while step_on_disk(killed) < 8 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and 8 <= step_on_disk(killed) < 20
    _ok(run_cli("train", "--out", killed, "--resume"))
    a = json.loads(open(os.path.join(once, "last.json")).read())
    b = json.loads(open(os.path.join(killed, "last.json")).read())
    sa, sb = a["loader_state"], b["loader_state"]
    keys = set(sa["inputs"]) | set(sb["inputs"])
    diff = {k for k in keys if sa["inputs"].get(k) != sb["inputs"].get(k)}
    assert (sa["epoch"], sa["step"], diff) == (sb["epoch"], sb["step"], set()), (sa, sb)
    assert a["pools"] == b["pools"] and a["train_loss"] == b["train_loss"]
    # the rewound run's steps 4.. never hold a quarantined row; its steps 1..3 are the original's
    seen = _stream(once, 4, 20)
    assert not set(q["row_ids"]) & set(seen)
    assert _stream(once, 1, 3, cli=False) == _stream(out, 1, 3, cli=False)


def test_exclude_refusals(run, tmp_path):
    tmp, uri, out, _ = run
    res = run_cli("train", "--out", out, "--resume", "--exclude", "nope")
    assert res.returncode == 2, res.stderr
    assert "--exclude" in res.stderr and "no quarantine 'nope'" in res.stderr
    res = run_cli("train", "--table", uri, "--out", str(tmp_path / "x"), "--exclude", "q")
    assert res.returncode == 2 and "--exclude" in res.stderr and "needs --resume" in res.stderr
    res = run_cli("train", "--out", os.path.join(out, "step-4"), "--resume", "--exclude", "q")
    assert res.returncode == 2 and "no checkpoint at step 4" in res.stderr
    assert "step-3, step-6" in res.stderr
