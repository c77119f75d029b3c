"""The main job, end to end on a small slice of the bundled corpus."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tokenloom.cli.main import cli
from tokenloom.table import Table


@pytest.mark.slow  # every stage of the demo, twice
def test_demo_runs_end_to_end_and_is_rerunnable(tmp_path):
    workdir = tmp_path / "demo"
    for _ in range(2):  # a second run recreates its own workdir
        result = CliRunner().invoke(
            cli,
            ["demo", "--workdir", str(workdir), "--max-docs", "5", "--workers", "0",
             "--train-steps", "3"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    table = Table.open(workdir / "corpus.lance")
    assert table.count_rows() == 7 * 5
    assert set(table.rows_per_source().values()) == {5}
    names = set(table.schema().names)
    assert {
        "is_dup",
        "dup_of",
        "near_dup_cluster",
        "is_near_dup",
        "quality",
        "quality_reasons",
        "input_ids",
        "n_tokens",
    } <= names
    ops = [v.operation for v in table.versions()]
    assert ops == ["create", "ingest"] + ["backfill"] * 7 + ["createindex"]  # one per stage
    assert table.count_rows("n_tokens IS NULL") == 0
    assert "table versions" in result.output and "done in" in result.output
    assert "packing keeps 100%" in result.output
    assert "validation loss" in result.output and "trace: the rows in step 3" in result.output


def test_demo_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["demo", "--workdir", str(tmp_path / "mine")])
    assert result.exit_code != 0 and "not made by `tokenloom demo`" in result.output
    assert (tmp_path / "mine" / "precious.txt").exists()
