"""``tokenloom bench near-dedup``: planted signatures clustered, goals reported; bad sizes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.conftest import run_cli
from tokenloom.cli.main import cli


def test_near_dedup_bench_finds_the_planted_groups_small(tmp_path):
    res = CliRunner().invoke(
        cli,
        ["bench", "near-dedup", "--rows", "3000", "--workdir", str(tmp_path), "--json"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["planted"]["recall"] > 0.99 and out["planted"]["clusters_mixing_groups"] == 0
    assert out["goals"] == {"wall_under_600s": "PASS", "rss_at_most_4GB": "PASS"}
    assert out["peak_rss_bytes"] > 0 and out["stats"]["passed"] > 0


def test_near_dedup_bench_names_a_bad_stage_list():
    proc = run_cli("bench", "near-dedup", "--stage", "200k,2M")
    assert proc.returncode == 2
    assert "--stage" in proc.stderr and "200k,2M" in proc.stderr
