"""Smoke test of ``tokenloom bench plan``: the result's structure on small sizes, not timing.

Benchmarks print ratios measured side by side; they are never timed assertions in the suite.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


def test_plan_bench_smoke(tmp_path) -> None:
    out = run_cli(
        "bench", "plan", "--docs", "30000", "--node-processes", "2", "--recipe-docs", "3000",
        "--workdir", str(tmp_path), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cases = {c["name"]: c for c in doc["cases"]}
    assert list(cases) == [
        "reference (int64 arrays)",
        "memory",
        "memory x2",
        "shared x1",
        "shared x2",
    ]
    for c in cases.values():
        assert c["docs"] == 30000 and c["seconds_per_epoch"] > 0 and c["node_bytes"] > 0
        assert len(c["runs"]) == c["procs"] and isinstance(c["passed"], bool)
    # The reference holds int64 row ids, lengths and starts for each of the 2 epochs.
    assert cases["reference (int64 arrays)"]["runs"][0]["heap_bytes"] >= 48 * 30000
    # Plan inputs: three int64 arrays per process before; now bit-packed columns (id, n_tokens,
    # _rowid) in each process, or once per node.
    assert cases["reference (int64 arrays)"]["inputs_bytes_per_doc"] == 24
    own = cases["memory"]["inputs_bytes_per_doc"]
    assert 1 < own < 3.5
    assert cases["memory x2"]["inputs_bytes_per_doc"] == 2 * own
    # Each epoch's layout was built by one process and mapped by the other; files count once.
    shared = cases["shared x2"]
    assert sum(r["built"] for r in shared["runs"]) == 2
    assert shared["file_bytes"] == cases["shared x1"]["file_bytes"] > (2 * 4 + own) * 29000
    assert own <= shared["inputs_bytes_per_doc"] < own + 0.2  # the files once (npy headers)
    assert [r["inputs_bytes"] for r in shared["runs"]] == [0, 0]
    recipes = {r["name"].split(" (")[0]: r for r in doc["recipes"]}
    assert list(recipes) == ["concat", "window", "window table", "best_fit", "mixture", "rows"]
    for r in recipes.values():
        assert r["docs"] == 3000 and r["seconds"] > 0 and isinstance(r["passed"], bool)
        assert r["peak_bytes_per_doc"] >= r["inputs_bytes"] / 3000 > 0
    # Bit-packed plan inputs (and the row loader's selection), not int64 arrays.
    assert recipes["concat"]["inputs_bytes"] < 4 * 3000
    assert recipes["rows"]["inputs_bytes"] < 4 * 3000
    assert not list(tmp_path.iterdir())  # the stores are removed after the run


def test_plan_bench_recipes_only(tmp_path) -> None:
    out = run_cli(
        "bench", "plan", "--docs", "0", "--recipe-docs", "2000", "--recipes", "rows,window",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("  rows") or x.startswith("  win")]
    assert len(lines) == 2 and all(("PASS" in x) != ("MISS" in x) for x in lines)
    assert "<= 12 B/doc" in lines[0]


def test_plan_bench_rejects_an_unknown_recipe() -> None:
    out = run_cli("bench", "plan", "--docs", "0", "--recipe-docs", "100", "--recipes", "bestfit")
    assert out.returncode == 2, out.stderr
    assert "--recipes" in out.stderr and "bestfit" in out.stderr
    assert "Traceback" not in out.stderr


def test_plan_bench_rejects_bad_sizes() -> None:
    out = run_cli("bench", "plan", "--docs", "12,abc")
    assert out.returncode != 0
    assert "--docs" in out.stderr and "abc" in out.stderr


@pytest.mark.parametrize("keep", ["0", "1.5", "-0.2", "half"])
def test_plan_bench_rejects_bad_keep(keep) -> None:
    out = run_cli("bench", "plan", "--docs", "1000", "--keep", keep)
    assert out.returncode == 2, out.stderr  # a usage error, before anything is built
    assert "--keep" in out.stderr
    assert "Traceback" not in out.stderr
