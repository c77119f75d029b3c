"""``--run DIR``: ledger, stats, verify, trace and sample read the loader spec from a training
run's record instead of retyped flags; through real processes, exit status and output asserted."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")

from tests.conftest import invoke, real_paragraphs, run_cli  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402

LOADER = ["--filter", "id % 7 != 0", "--seq-len", "32", "--global-batch-size", "2", "--seed", "3"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step run of the smallest model on a tiny gpt2 table: (run dir, table)."""
    tmp = tmp_path_factory.mktemp("runopt")
    uri = gpt2_table(tmp, real_paragraphs(30))
    out = str(tmp / "run")
    res = run_cli(
        "train", "--table", uri, "--out", out, "--model", "tiny", *LOADER, "--steps", "2",
        "--checkpoint-every", "2", "--log-every", "1",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out, uri


def _json(res) -> dict:  # noqa: ANN001
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_ledger_and_stats_read_the_runs_spec(run):
    out, uri = run
    record = json.loads(open(f"{out}/last.json", encoding="utf-8").read())
    by_run = _json(run_cli("ledger", "--run", out, "--json"))
    assert by_run.pop("lineage")["tokens"] == 2 * 2 * 32  # what the run's lineage was fed
    retyped = [*LOADER, "--version", str(record["loader"]["version"])]
    by_flags = _json(run_cli("ledger", "--table", uri, *retyped, "--json"))
    assert by_run == by_flags and by_run["seq_len"] == 32 and by_run["global_batch"] == 2
    # the same flags beside --run only confirm the record
    again = _json(run_cli("ledger", "--run", out, "--table", uri, *retyped, "--json"))
    assert again.pop("lineage") and again == by_run
    stats = _json(run_cli("stats", "--run", out, "--json"))
    assert stats["loader"] == record["loader"]
    assert stats["documents"] == sum(1 for i in range(30) if i % 7 != 0)


def test_verify_trace_and_sample_take_run(run, tmp_path):
    out, _ = run
    res = run_cli("verify", "--run", out, "--steps", "1")
    assert res.returncode == 0, res.stderr
    assert "6 of 6 checks passed" in res.stdout and "2 x 32 per step" in res.stdout
    assert "seed 3" in res.stdout
    # a run whose data changed: verify says which change it does not verify (its record is
    # what verify reads; the change's tail is not in the stream the run started with)
    changed = tmp_path / "changed"
    shutil.copytree(out, changed)
    record = json.loads((changed / "last.json").read_text())
    v = record["loader"]["version"]
    change = {"kind": "continue", "epoch": 0, "step": 1, "global_step": 1,
              "version_before": v, "version_after": v, "params": {}}  # fmt: skip
    record["loader_state"].setdefault("inputs", {})["changes"] = [change]
    (changed / "last.json").write_text(json.dumps(record))
    note = json.loads(invoke("verify", "--run", str(changed), "--steps", "1", "--json"))
    assert note["changes_not_verified"] == [f"continue from global step 1 (version {v})"]
    assert note["passed"] and "not verified" not in res.stdout  # the unchanged run: no note
    trace = _json(run_cli("trace", "--run", out, "--step", "2", "--json"))
    assert trace["loader"]["filter"] == "id % 7 != 0" and trace["rows"]
    assert all(r["row_id"] % 7 for r in trace["rows"])
    res = run_cli("sample", "--run", out, "--prompt", "The", "--max-new-tokens", "2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("The")


@pytest.mark.parametrize(
    ("flags", "named", "recorded"),
    [
        (["--seq-len", "64"], "--seq-len 64", "seq_len = 32"),
        (["--no-lookahead"], "--no-lookahead", "lookahead = true"),
        (["--filter", "id > 3"], "--filter id > 3", 'filter = "id % 7 != 0"'),
        (["--version", "1"], "--version 1", "version = "),
    ],
)
def test_a_flag_that_contradicts_the_record_is_a_usage_error(run, flags, named, recorded):
    out, _ = run
    res = run_cli("ledger", "--run", out, *flags)
    assert res.returncode == 2, res.stderr
    assert named in res.stderr and recorded in res.stderr and "last.json" in res.stderr
    assert res.stdout == ""


def test_another_table_beside_run_is_a_usage_error(run, tmp_path):
    out, _ = run
    res = run_cli("stats", "--run", out, "--table", str(tmp_path / "other.lance"))
    assert res.returncode == 2
    assert "--table" in res.stderr and "table = " in res.stderr


def test_missing_and_corrupt_runs(run, tmp_path):
    res = run_cli("verify", "--run", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert "'--run'" in res.stderr and "does not exist" in res.stderr
    (tmp_path / "empty").mkdir()
    res = run_cli("trace", "--run", str(tmp_path / "empty"), "--step", "1")
    assert res.returncode == 2
    assert "'--run'" in res.stderr and "holds no run record" in res.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "last.json").write_text("{not json")
    res = run_cli("ledger", "--run", str(bad))
    assert res.returncode == 1
    assert str(bad / "last.json") in res.stderr and "cannot be read" in res.stderr
    res = run_cli("ledger", "--seq-len", "32")
    assert res.returncode == 2
    assert "--table is required" in res.stderr and "--run DIR" in res.stderr
