"""``tokenloom bench components``: union-find vs scipy on the same pairs, labels compared."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tokenloom.cli.main import cli


def test_components_bench_runs_both_graphs_small():
    res = CliRunner().invoke(
        cli,
        ["bench", "components", "--nodes", "4000", "--pairs", "2000", "--repeats", "1", "--json"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["graphs"]) == {"random", "lsh"}
    lsh = out["graphs"]["lsh"]
    # a fifth of the ids in clusters, later bands repeating connections: fewer merges than pairs
    assert 4000 - 2000 < lsh["components"] < 4000 and lsh["largest"] > 1
    assert all(
        g["tokenloom_seconds"] > 0 and g["scipy_seconds"] > 0 for g in out["graphs"].values()
    )
