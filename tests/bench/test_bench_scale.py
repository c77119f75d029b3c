"""``tokenloom bench scale``: every stage through the real commands, one line each; bad values."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_cli
from tokenloom.bench.scale import (
    STAGES,
    ScaleBench,
    ScaleConfig,
    StageRun,
    format_scale_report,
    write_scale_corpus,
)
from tokenloom.cli import bench as bench_cli


def test_bench_scale_runs_every_pipeline_stage(tmp_path):
    proc = run_cli(
        "bench", "scale", "--docs", "80", "--mean-tokens", "30", "--workers", "0",
        "--stages", "ingest,dedup,dedup-near,tokenize,stats", "--workdir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "short documents: the document COUNT grows" in out
    for stage in ("ingest", "dedup", "dedup-near", "tokenize", "stats"):
        line = rf"^  {re.escape(stage)}\s+80\s+[\d.]+\s+[\d.]+\s+[\d,]+\s+[\d,]+ MiB\s+[\d,]+\s"
        assert re.search(line, out, re.M), (stage, out)
    assert re.search(r"^      documents 80, tokens [\d,]+, tokens/doc [\d.]+$", out, re.M), out
    assert list(tmp_path.iterdir()) == []  # the run's folder is removed


def _run(stage: str, docs: int, peak_mib: int) -> StageRun:
    return StageRun(
        stage=stage, docs=docs, wall_seconds=1.0, cpu_seconds=2.0, peak_rss_bytes=peak_mib << 20,
        peak_processes=1, written_bytes=0, disk_read_bytes=0, load_average=(1.0, 1.0, 1.0),
    )  # fmt: skip


def test_bench_scale_compares_each_stage_smallest_to_largest():
    bench = ScaleBench(config=ScaleConfig(docs=(200, 2000), stages=("ingest", "dedup")))
    bench.runs = [_run("ingest", 2000, 300), _run("dedup", 200, 100), _run("ingest", 200, 200),
                  _run("dedup", 2000, 151)]  # fmt: skip
    assert bench.ratios() == {"ingest": (200, 2000, 1.5), "dedup": (200, 2000, 1.51)}
    out = format_scale_report(bench)
    assert "peak RSS ingest      2,000 / 200 docs: 1.50x  (<= 1.5x PASS)" in out
    assert "peak RSS dedup       2,000 / 200 docs: 1.51x  (<= 1.5x MISS)" in out
    assert bench.to_json()["rss_ratios"]["dedup"]["status"] == "MISS"


@pytest.mark.slow
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
    recipes = sorted(name.split()[0] for name in runs["plan"]["detail"])
    assert recipes == ["best_fit", "concat", "mixture", "rows", "window"]
    assert all(d["status"] in ("PASS", "MISS") for d in runs["plan"]["detail"].values())
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
