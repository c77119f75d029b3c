"""What ``tokenloom train`` tells while it runs: progress on stderr, a warning when the
vocabulary dominates a small model, ``--json`` on stdout, and metrics in ``metrics.csv`` and
TensorBoard event files (``--log-to csv,tensorboard``)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402
from tokenloom.loader import LoaderSpec  # noqa: E402
from tokenloom.train.loop import TrainConfig, train  # noqa: E402
from tokenloom.train.metrics import CSV_COLUMNS  # noqa: E402


def _csv(path) -> list[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows == [] or list(rows[0]) == list(CSV_COLUMNS)
    return rows


def test_train_json_progress_vocab_warning_csv_and_tensorboard(tmp_path):
    table = gpt2_table(tmp_path, real_paragraphs(40))  # GPT-2's 50,257 ids on the tiny model
    out = tmp_path / "run"
    proc = run_cli(
        "train", "--table", table, "--out", str(out), "--seq-len", "32",
        "--global-batch-size", "2", "--steps", "4", "--log-every", "2",
        "--val-filter", "id % 10 = 0", "--eval-every", "4", "--eval-batches", "1",
        "--log-to", "csv,tensorboard", "--json",
        env={"TOKENLOOM_PROGRESS_SECONDS": "0.01", "TOKENLOOM_QUIET": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout holds the JSON only
    assert result["step"] == 4 and len(result["losses"]) == 4
    assert result["files"]["metrics_csv"] == str(out / "metrics.csv")
    assert result["out"] == str(out) and result["tokens"] == 4 * 2 * 32

    # progress: plain lines on stderr (not a terminal), steps with an ETA, the last one done
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train: ")]
    assert lines and all("\r" not in ln for ln in lines), proc.stderr
    assert "4/4 steps (100%)" in lines[-1]
    assert any("eta" in ln and "loss" in ln for ln in lines), lines
    assert "step      4  loss" in proc.stderr  # the log lines moved to stderr with --json

    # the vocabulary is ~89% of the tiny model: a warning naming the smaller tokenizer
    warning = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: the vocab")]
    assert len(warning) == 1, proc.stderr
    assert "50,257 ids of tokenizer gpt2" in warning[0]
    assert "`tokenloom tokenizer train --table" in warning[0] and "--vocab-size 2048" in warning[0]

    # metrics.csv: one row per logged step with its loss, and the validation rows
    rows = _csv(out / "metrics.csv")
    train_rows = [r for r in rows if r["loss"]]
    assert [int(r["step"]) for r in train_rows] == [2, 4]
    assert [float(r["loss"]) for r in train_rows] == [result["losses"][1], result["losses"][3]]
    assert all(float(r["lr"]) > 0 and float(r["tokens_per_second"]) > 0 for r in train_rows)
    val_rows = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    assert val_rows == [tuple(v) for v in result["val_losses"]]

    # TensorBoard: an event file that tensorboard itself reads back
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [f for f in os.listdir(out / "tensorboard") if f.startswith("events.out.tfevents")]
    assert len(events) == 1
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "train/lr", "train/tokens_per_second", "val/loss"} <= set(
        acc.Tags()["scalars"]
    )
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [2, 4]
    assert [e.value for e in loss] == pytest.approx([result["losses"][1], result["losses"][3]])


def test_no_warning_for_a_small_vocabulary_and_one_csv_row_per_step_across_a_resume(tmp_path):
    table = token_table(tmp_path, real_paragraphs(40))  # 257 byte ids: ~4% of the tiny model
    spec = LoaderSpec(table=table, seq_len=32, global_batch=2)
    cfg = TrainConfig(loader=spec, out=str(tmp_path / "run"), steps=4, log_every=1, log_to=("csv",))
    warned: list[str] = []
    first = train(dataclasses.replace(cfg, stop_at=2), log=lambda *_: None, warn=warned.append)
    assert warned == [] and first.step == 2
    path = tmp_path / "run" / "metrics.csv"
    assert [r["step"] for r in _csv(path)] == ["1", "2"]
    with open(path, "a") as fh:  # what an invocation killed after step 3's log line leaves
        fh.write("3,9.99,,,,,\n")
    rest = train(cfg, resume=True, log=lambda *_: None, warn=warned.append)
    rows = _csv(path)
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]  # step 3 once: the resumed run's
    assert [float(r["loss"]) for r in rows[2:]] == rest.losses
    assert warned == []


def test_an_unknown_log_sink_is_a_usage_error():
    proc = run_cli("train", "--table", "t.lance", "--log-to", "csv,wandb")
    assert proc.returncode == 2
    assert "unknown log sink 'wandb'; one of csv, tensorboard" in proc.stderr
