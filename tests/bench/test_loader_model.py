"""``bench loader --model``: every loader trains the same model the same steps; the figures'
structure on a tiny table (timings are never asserted)."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tokenloom.bench.loader_data import CorpusSpec, build_table

pytest.importorskip("torch")


def test_train_case_reports_steps_stall_and_loss(tmp_path):
    from tokenloom.bench.loader_cases import CaseSpec
    from tokenloom.bench.loader_model import ModelRun, train_case

    table = build_table(str(tmp_path / "t.lance"), CorpusSpec(docs=300, seed=0))
    spec = CaseSpec(
        label="tokenloom", kind="tokenloom", path=table.path, workers=0, seq_len=64,
        batch_size=2, steps=3,
    )  # fmt: skip
    small = {"n_layer": 1, "n_head": 2, "n_embd": 16}
    out = train_case(spec, "tiny-gpt", 3, small)
    run = ModelRun(**{k: v for k, v in out.items() if k not in ("samples_per_s", "stall_pct")})
    assert run.error is None and run.steps == 3 and run.samples == 6
    assert 0 < run.wait_s < run.total_s
    assert 0 < out["stall_pct"] < 100 and out["samples_per_s"] > 0
    assert run.loss_first == pytest.approx(train_case(spec, "tiny-gpt", 3, small)["loss_first"])
    assert run.loss_first > 5  # ~ln(50257) = 10.8 at initialisation


def test_model_option_is_validated():
    proc = run_cli("bench", "loader", "--model", "resnet", "--docs", "10")
    assert proc.returncode == 2
    assert "--model" in proc.stderr and "tiny-gpt" in proc.stderr
