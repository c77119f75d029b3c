"""``tokenloom bench scale``: every stage through the real commands, one line each; bad values."""

from __future__ import annotations

import json
import re

from tests.conftest import run_cli
from tokenloom.bench.scale import STAGES, write_scale_corpus
from tokenloom.cli import bench as bench_cli


def test_bench_scale_runs_every_pipeline_stage_and_compares_sizes(tmp_path):
    proc = run_cli(
        "bench", "scale", "--docs", "60,240", "--mean-tokens", "30", "--workers", "1",
        "--stages", "ingest,dedup,dedup-near,tokenize,stats", "--workdir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "short documents: the document COUNT grows" in out
    for stage in ("ingest", "dedup", "dedup-near", "tokenize", "stats"):
        for docs in ("60", "240"):
            assert re.search(rf"^  {re.escape(stage)}\s+{docs}\s+[\d.]+\s+[\d.]+\s", out, re.M), (
                stage,
                docs,
                out,
            )
        assert re.search(
            rf"^peak RSS {re.escape(stage)}\s+240 / 60 docs: [\d.]+x .*(PASS|MISS)", out, re.M
        )
    assert list(tmp_path.iterdir()) == []  # the run's folder is removed


def test_bench_scale_plan_and_loader_stages_json(tmp_path):
    proc = run_cli(
        "bench", "scale", "--stages", "plan,loader", "--plan-docs", "3000", "--loader-docs",
        "300", "--seconds", "0.5", "--workdir", str(tmp_path), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    runs = {r["stage"]: r for r in res["runs"]}
    assert set(runs) == {"plan", "loader"}
    assert runs["plan"]["docs"] == 3000 and runs["loader"]["docs"] == 300
    assert set(runs["plan"]["detail"]) == {"concat", "window", "best_fit", "mixture", "rows"}
    for r in runs.values():
        assert r["peak_rss_bytes"] > 0 and r["wall_seconds"] > 0 and r["cpu_seconds"] > 0
    assert res["rss_ratios"] == {}


def test_bench_scale_corpus_lengths_and_planted_copies(tmp_path):
    meta = write_scale_corpus(str(tmp_path), 2000, mean_tokens=40, seed=1)
    texts = [json.loads(line)["text"] for line in open(tmp_path / "part-00000.jsonl")]
    assert meta["docs"] == len(texts) == 2000 and meta["files"] == 1
    words = [len(t.split()) for t in texts]
    assert sum(words) == meta["words"] and 20 < sum(words) / len(words) < 40
    assert len(set(texts)) < len(texts)  # planted exact copies


def test_bench_scale_stage_names_are_one_list():
    assert bench_cli._SCALE_STAGES == STAGES


def test_bench_scale_bad_values_are_usage_errors():
    proc = run_cli("bench", "scale", "--docs", "2M")
    assert proc.returncode == 2 and "--docs" in proc.stderr and "2M" in proc.stderr
    proc = run_cli("bench", "scale", "--stages", "tokenize,stats")
    assert proc.returncode == 2 and "--stages" in proc.stderr
    assert "add ingest,dedup,dedup-near" in proc.stderr
    proc = run_cli("bench", "scale", "--stages", "ingest,shuffle")
    assert proc.returncode == 2 and "shuffle" in proc.stderr
