"""`tokenloom images build` / `pack-stats` and the rows benchmark's contenders, through the CLI
and on one copy of the bundled set (no timing is asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tokenloom.bench.rows import prepare, run_case
from tokenloom.cli.main import cli


def _ok(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_build_ingest_and_pack_stats(tmp_path):
    out = _ok("images", "build", "--out", str(tmp_path), "--bad-images", "1")
    assert "55 samples (18 images)" in out
    uri = str(tmp_path / "img.lance")
    _ok(
        "ingest",
        str(tmp_path / "images.parquet"),
        "--table",
        uri,
        "--columns",
        "width,height,prompt,response",
    )
    for text in ("prompt", "response"):
        _ok("tokenize", "--table", uri, "--tokenizer", "gpt2", "--text-column", text,
            "--column", f"{text}_ids", "--workers", "0")  # fmt: skip
    png = tmp_path / "padding.png"
    ledgers = json.loads(
        _ok("images", "pack-stats", "--table", uri, "--budget", "96", "--plot", str(png), "--json")
    )
    assert png.stat().st_size > 1000
    share = {k: v["padding_share"] for k, v in ledgers.items()}
    assert share["knapsack"] < share["greedy"] < share["pad_to_longest"]
    assert len({(v["image_tokens"], v["text_tokens"]) for v in ledgers.values()}) == 1


def test_rows_bench_contenders_read_the_same_samples(tmp_path):
    """Every loader delivers each sample once per epoch, in batches of exactly B, each in its
    own order."""
    paths = prepare(str(tmp_path), copies=1, shard_rows=16)
    decoded = {}
    for case in ("tokenloom", "tar shards", "parquet"):
        run = run_case(case, paths, workload="image-text", threads=2, batch=6, epochs=2)
        assert [sorted(i for b in e["ids"] for i in b) for e in run["epochs"]] == [
            list(range(54))
        ] * 2, case
        assert all(len(b) == 6 for e in run["epochs"] for b in e["ids"])
        decoded[case] = run
    assert len({tuple(r["epochs"][0]["ids"][0]) for r in decoded.values()}) > 1  # own orders
    blocks = run_case("tokenloom blocks", paths, workload="image-text", threads=2, batch=16)
    held = [i for e in blocks["epochs"][:1] for b in e["ids"] for i in b]
    assert 0 < len(held) <= 54 and len(set(held)) == len(held)  # each sample at most once
    assert "padding" in blocks["notes"]
