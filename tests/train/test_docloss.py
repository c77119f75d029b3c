"""``tokenloom doc-loss`` through the real CLI on a tiny table and a tiny trained run.

The column's values equal a direct computation (one document at a time, window by window), rows
outside ``--filter`` are null, the column filters (``stats --filter``), a backfill killed after
some units resumes without recomputing them, and a missing run is a usage error (exit 2, as
``export`` and ``sample``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.conftest import REPO, invoke, real_paragraphs, run_cli  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402
from tokenloom.backfill import default_checkpoint_root  # noqa: E402
from tokenloom.train.checkpoint import load_run_model  # noqa: E402
from tokenloom.train.docloss import document_losses  # noqa: E402

SEQ = 32  # the model's context: most paragraphs are longer, so they are windowed
TEXTS = ["Hello there.", "A short one, well under the context."] + real_paragraphs(28)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step run of the smallest model on a tiny gpt2 table: (run dir, table)."""
    tmp = tmp_path_factory.mktemp("docloss")
    uri = gpt2_table(tmp, TEXTS)
    out = str(tmp / "run")
    invoke(
        "train", "--table", uri, "--out", out, "--model", "tiny", "--seq-len", str(SEQ),
        "--global-batch-size", "2", "--steps", "2", "--device", "cpu",
    )  # fmt: skip
    return out, uri


def _column(uri: str, name: str) -> dict[int, float | None]:
    import lance

    t = lance.dataset(uri).to_table(columns=["id", name])
    return dict(zip(t.column("id").to_pylist(), t.column(name).to_pylist(), strict=True))


def _tokens(uri: str) -> dict[int, list[int]]:
    import lance

    t = lance.dataset(uri).to_table(columns=["id", "input_ids"])
    return dict(zip(t.column("id").to_pylist(), t.column("input_ids").to_pylist(), strict=True))


def _direct(model, ids: list[int], eos: int) -> float:  # noqa: ANN001
    """One document alone, window by window: sum of next-token losses / number of targets."""
    seq = [*ids, eos]
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(ids), SEQ):
            n = min(SEQ, len(ids) - s)
            x = torch.tensor([seq[s : s + n]])  # (1, n)
            y = torch.tensor([seq[s + 1 : s + 1 + n]])  # the next tokens, EOS last
            _, loss = model(x, doc_ids=torch.zeros_like(x), labels=y, reduction="sum")
            total += float(loss)
    return total / len(ids)


def test_values_equal_a_direct_computation_and_the_filter_leaves_nulls(run):
    out, uri = run
    summary = json.loads(invoke(
        "doc-loss", "--table", uri, "--checkpoint", out, "--column", "loss_tiny",
        "--filter", "id % 3 != 2", "--workers", "2", "--batch-size", "3", "--json",
    ))  # fmt: skip
    assert summary["window"] == SEQ and summary["rows"] == 30  # the filtered-out ones null
    values, tokens = _column(uri, "loss_tiny"), _tokens(uri)
    assert [i for i, v in values.items() if v is None] == [i for i in range(30) if i % 3 == 2]
    model, record = load_run_model(out)
    eos = int(record.tokenizer["eos_id"])
    assert len(tokens[0]) < SEQ < max(len(t) for t in tokens.values())
    long = next(i for i in range(3, 30) if i % 3 != 2 and len(tokens[i]) > 2 * SEQ)
    for i in (0, 1, long):
        assert values[i] == pytest.approx(_direct(model, tokens[i], eos), rel=1e-5), i
    # the batched computation (padding, windows of several documents together) agrees too
    batched = document_losses(model, [np.array(tokens[i]) for i in range(30)], eos_id=eos)
    for i, v in values.items():
        if v is not None:
            assert v == pytest.approx(batched[i], rel=1e-5)

    threshold = float(np.median([v for v in values.values() if v is not None]))
    stats = invoke("stats", "--table", uri, "--filter", f"loss_tiny > {threshold}", "--json")
    above = sum(1 for v in values.values() if v is not None and v > threshold)
    assert json.loads(stats)["documents"] == above > 0

    invoke("index", "--table", uri)
    found = invoke("search", "--table", uri, "the", "--where", f"loss_tiny > {threshold}", "--json")
    hits = [h["id"] for h in json.loads(found)["hits"]]
    assert hits and all(values[i] is not None and values[i] > threshold for i in hits)

    again = invoke("doc-loss", "--table", uri, "--checkpoint", out, "--column", "loss_tiny")
    assert "nothing to do" in again or "reused" in again  # rows outside the filter stay null


def _units(uri: str, column: str) -> list[str]:
    root = default_checkpoint_root(uri)
    return [
        os.path.join(d, f)
        for d, _, files in os.walk(root)
        if os.path.basename(d).startswith(column) or column in d
        for f in files
        if f.endswith(".arrow")
    ]


def test_a_killed_backfill_resumes_without_recomputing_finished_units(run):
    out, uri = run
    args = [
        "-m", "tokenloom.cli.main", "doc-loss", "--table", uri, "--checkpoint", out,
        "--column", "loss_resumed", "--workers", "0", "--unit-rows", "1", "--batch-size", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, *args], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(_units(uri, "loss_resumed")) < 3:
        assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
        assert time.time() < deadline, "no unit finished in time"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(_units(uri, "loss_resumed"))
    assert "loss_resumed" not in _column_names(uri)  # nothing committed
    summary = json.loads(invoke(
        "doc-loss", "--table", uri, "--checkpoint", out, "--column", "loss_resumed",
        "--workers", "0", "--unit-rows", "1", "--json",
    ))  # fmt: skip
    assert summary["units_reused"] >= done >= 3 and summary["units"] > summary["units_reused"]
    resumed = _column(uri, "loss_resumed")
    full = _column(uri, "loss_tiny") if "loss_tiny" in _column_names(uri) else None
    model, record = load_run_model(out)
    eos = int(record.tokenizer["eos_id"])
    tokens = _tokens(uri)
    for i in (0, 5, 29):
        assert resumed[i] == pytest.approx(_direct(model, tokens[i], eos), rel=1e-5)
    if full is not None:
        assert all(full[i] is None or full[i] == pytest.approx(resumed[i]) for i in full)


def _column_names(uri: str) -> list[str]:
    import lance

    return lance.dataset(uri).schema.names


@pytest.mark.parametrize("missing", ["nowhere", "empty-dir"])
def test_an_unknown_checkpoint_is_a_clear_error(run, tmp_path, missing):
    _, uri = run
    path = tmp_path / missing
    if missing == "empty-dir":
        path.mkdir()
    res = run_cli("doc-loss", "--table", uri, "--checkpoint", str(path), "--column", "x")
    assert res.returncode == 2, res.stderr  # as export and sample: the option names no run
    assert "--checkpoint" in res.stderr and str(path) in res.stderr
    assert "tokenloom train" in res.stderr and "Traceback" not in res.stderr
    assert "x" not in _column_names(uri)


def test_a_bad_column_name_is_a_usage_error(run):
    out, uri = run
    res = run_cli("doc-loss", "--table", uri, "--checkpoint", out, "--column", "bad name")
    assert res.returncode == 2 and "--column" in res.stderr
