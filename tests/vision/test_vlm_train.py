"""``tokenloom train`` trains the tiny VLM from an image+text table: the same run record, a
resume equal to the uninterrupted run (losses and weights), metrics to CSV, and the failure
paths through a real subprocess (exit status and message)."""

from __future__ import annotations

import json
import os

import lance
import pytest
import torch
from click.testing import CliRunner

from tests.conftest import invoke, run_cli
from tests.vision.tables import image_table
from tokenloom.cli.main import cli
from tokenloom.train.checkpoint import load_checkpoint
from tokenloom.train.record import read_record
from tokenloom.vision.spec import ImageTextSpec

ARGS = ["--image-column", "image", "--seq-len", "96", "--max-side", "32", "--global-batch-size",
        "2", "--on-error", "skip", "--model", "tiny", "--lr", "1e-2", "--steps", "6",
        "--checkpoint-every", "2", "--log-every", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return image_table(tmp_path_factory.mktemp("vlm"), bad_images=2, max_side=48, vocab=300)


@pytest.fixture(scope="module")
def whole(table, tmp_path_factory):
    """One uninterrupted 6-step run: the resume's reference and the trace's run."""
    out = str(tmp_path_factory.mktemp("vlm_whole") / "whole")
    got = json.loads(invoke("train", "--table", table, "--out", out, *ARGS, "--log-to", "csv",
                            "--json"))  # fmt: skip
    assert got["step"] == 6 and os.path.exists(os.path.join(out, "metrics.csv"))
    return out


def test_resume_equals_the_uninterrupted_run(table, whole, tmp_path):
    part = str(tmp_path / "part")
    invoke("train", "--table", table, "--out", part, *ARGS, "--stop-at", "3")
    assert read_record(part).step == 3
    invoke("train", "--out", part, "--resume")
    a, b = load_checkpoint(whole), load_checkpoint(part)
    assert a.history["train"] == b.history["train"]  # every step's loss, bit for bit
    assert a.history["train"][-1][1] < a.history["train"][0][1]
    for k, v in a.model.items():
        assert torch.equal(v, b.model[k]), k
    rec = read_record(part)
    meta = lance.dataset(table).schema.field("prompt_ids").metadata
    assert meta[b"tokenloom.text_column"] == b"prompt"  # the column says what it encodes
    assert isinstance(rec.loader, ImageTextSpec) and rec.loader.budget == 96
    assert [p["version"] for p in rec.pins] == [rec.loader.version]  # pinned, as a token run
    assert rec.tokenizer["vocab_size"] == 300 and [t["from_step"] for t in rec.topology] == [1, 4]
    delivered = rec.loader_state["ledger"]
    assert delivered["blocks"] == 12 and delivered["image_tokens"] > 0


def test_failures_exit_with_status_and_message(table, tmp_path):
    out = str(tmp_path / "r")
    res = run_cli("train", "--table", table, "--out", out, *ARGS[2:], "--image-column", "picture")
    assert res.returncode == 1 and "no image_column 'picture'" in res.stderr, res.stderr
    res = run_cli("train", "--table", table, "--out", out, *ARGS, "--prompt-column", "prompt")
    assert res.returncode == 1, res.stderr
    assert "tokenloom tokenize --table" in res.stderr and "--text-column prompt" in res.stderr
    res = run_cli("tokenize", "--table", table, "--tokenizer", "gpt2", "--text-column", "caption",
                  "--column", "caption_ids", "--workers", "0")  # fmt: skip
    assert res.returncode == 1 and "no text column 'caption'" in res.stderr, res.stderr
    res = run_cli("train", "--table", table, "--out", out, *ARGS, "--packing", "best_fit")
    assert res.returncode == 2 and "--packing belong to token tables" in res.stderr, res.stderr
    res = CliRunner().invoke(cli, ["train", "--table", table, "--out", out, "--image-cap", "2"])
    assert res.exit_code == 2 and "--image-cap applies to image+text runs" in res.output


def test_trace_names_the_rows_of_a_step_and_the_steps_of_a_row(whole):
    out = whole  # traced as it was trained (one run serves both tests)
    got = json.loads(invoke("trace", "--run", out, "--step", "2", "--json"))
    rows = got["rows"]
    assert {r["step"] for r in rows} == {2} and rows and got["loader"]["kind"] == "image_text"
    from tokenloom.vision import ImageTextDataset

    ds = ImageTextDataset(read_record(out).loader, world_size=1)
    want = [i for b in ds.build_step(1)["row_ids"] for i in b.tolist()]
    assert [r["row_id"] for r in rows] == want
    row = rows[0]["row_id"]
    seen = json.loads(invoke("trace", "--run", out, "--row", str(row), "--json"))["rows"]
    assert 2 in {r["step"] for r in seen} and all(r["row_id"] == row for r in seen)


def test_demo_vlm_runs_end_to_end(tmp_path):
    res = CliRunner().invoke(cli, ["demo", "--vlm", "--workdir", str(tmp_path), "--vlm-steps", "4"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "vlm" / "summary.json").read_text())
    assert summary["resume_equal"] is True and len(summary["losses"]) == 4
    pad = {k: v["padding"] for k, v in summary["padding"].items()}
    assert summary["knapsack_saves_positions"] == pad["pad_to_longest"] - pad["knapsack"] > 0
    assert "knapsack saves" in res.output and "trace of step 4" in res.output
