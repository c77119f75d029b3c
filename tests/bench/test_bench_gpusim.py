"""``tokenloom bench loader --gpu-sim``: the simulation's result and report on a tiny corpus
(structure, not timing), and the refusal of an unknown model through the real command."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import run_cli  # noqa: E402
from tokenloom.bench.loader import LoaderBenchConfig  # noqa: E402
from tokenloom.bench.loader_gpusim import format_gpu_sims, run_gpu_sims  # noqa: E402
from tokenloom.loader.observe.profile import parse_gpu_sims  # noqa: E402


def test_gpu_sim_feeds_each_model_and_reports_the_stall(tmp_path):
    config = LoaderBenchConfig(docs=2000, steps=4, workdir=str(tmp_path), only=("tokenloom",))
    sims = parse_gpu_sims("124M,354M", config.seq_len)
    results = run_gpu_sims(config, sims, workers=0)

    assert [r.model for r in results] == ["124M", "354M"]
    for r, sim in zip(results, sims, strict=True):
        assert (r.steps, r.tokens) == (4, 4 * 8 * 1024)
        # four simulated steps of 8 x 1024 tokens, slept in full
        assert r.compute_seconds >= 4 * sim.step_seconds(8 * 1024)
        assert 0 <= r.stall < 1 and r.tokens_per_s <= r.gpu_tokens_per_s
        assert "is the bottleneck" in r.verdict
    report = format_gpu_sims(results, sims, workers=0)
    assert "124M" in report and "354M" in report and "data stall" in report
    assert json.loads(json.dumps(results[0].to_json()))["stall"] == round(results[0].stall, 4)


def test_cli_refuses_an_unknown_model_before_measuring(tmp_path):
    done = run_cli("bench", "loader", "--gpu-sim", "124M,7B", "--workdir", str(tmp_path))
    assert done.returncode == 2
    assert "unknown GPT-2 size '7B'; choose from 124M, 354M" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing was built
