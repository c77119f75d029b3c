"""Runs that last, through the real CLI: a child run carries its parent's per-pool counts, a
total token budget caps the lineage, the record holds the compute, ``tokenloom runs`` lists the
lineage, every run pins its table version with a Lance tag and ``runs rm`` releases it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # a lineage of training processes

import lance  # noqa: E402

from tests.conftest import invoke, real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.table.tags import RUN_KEY, run_tag  # noqa: E402
from tokenloom.train.config import BudgetError, TrainConfig  # noqa: E402
from tokenloom.train.lineage import lineage_pools, own_pools, plan_budget  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402

SHAPE = ["--seq-len", "32", "--global-batch-size", "2", "--log-every", "1"]
STEP_TOKENS = 2 * 32
ENV = {"OMP_NUM_THREADS": "1"}


def _train(*args: str):  # noqa: ANN202
    return run_cli("train", *SHAPE, *args, env=ENV)


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """Run ``a`` (3 steps over two invocations), then ``b`` from it under a 330-token budget.
    Byte tokens: a 258-id vocabulary keeps the tiny model and its checkpoints small."""
    root = tmp_path_factory.mktemp("runs")
    table = token_table(root, real_paragraphs(40))
    a, b = str(root / "runs" / "a"), str(root / "runs" / "b")
    val = ["--val-filter", "id % 10 = 0", "--eval-every", "2", "--eval-batches", "1"]
    invoke("train", *SHAPE, "--table", table, "--out", a, "--steps", "3", "--stop-at", "2", *val)
    invoke("train", "--out", a, "--resume")
    child = invoke("train", *SHAPE, "--table", table, "--out", b, "--init-from", a,
                   "--total-budget-tokens", "330")  # fmt: skip
    return {"root": str(root), "table": table, "a": a, "b": b, "child": child}


def test_a_child_carries_its_parents_counts_and_plans_what_the_budget_leaves(lineage):
    a, b = read_record(lineage["a"]), read_record(lineage["b"])
    assert a.step == 3 and sum(p["blocks"] for p in a.pools) == 3 * 2
    assert b.parent["carried"] == own_pools(a)  # the parent's counts, carried
    assert [p["tokens"] for p in b.parent["carried"]] == [3 * STEP_TOKENS]
    assert b.config["steps"] == b.step == 2  # (330 - 192) // 64
    assert [p["tokens"] for p in lineage_pools(b)] == [5 * STEP_TOKENS]
    assert (
        "budget: 330 tokens for the lineage, 192 spent before this run, 138 remain: "
        "2 steps of 64 tokens" in lineage["child"]
    )


def test_an_exhausted_budget_is_refused_with_the_numbers(lineage, tmp_path):
    out = str(tmp_path / "c")
    done = _train("--table", lineage["table"], "--out", out, "--init-from", lineage["b"],
                  "--total-budget-tokens", "330")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        f"--total-budget-tokens 330: the lineage up to {lineage['b']} has trained on 320 "
        "tokens, 10 remain, less than one step of 2 x 32 = 64 tokens; raise "
        "--total-budget-tokens" in done.stderr
    )
    assert not os.path.exists(out)  # refused before anything was written
    bad = _train("--table", lineage["table"], "--out", out, "--epochs", "1",
                 "--total-budget-tokens", "1000")  # fmt: skip
    assert bad.returncode == 2 and "--total-budget-tokens" in bad.stderr, bad.stderr
    assert "drop epochs" in bad.stderr


def test_the_budget_plan_derives_or_lowers_the_steps(lineage, tmp_path):
    record = read_record(lineage["a"])  # 192 tokens spent
    cfg = TrainConfig.from_record(record, out=str(tmp_path / "x"), init_from=lineage["a"],
                                  steps=None, total_budget_tokens=192 + 5 * 64 + 63)  # fmt: skip
    assert plan_budget(cfg).steps == 5
    assert plan_budget(dataclasses.replace(cfg, steps=2)).steps == 2  # --steps only lowers
    assert plan_budget(dataclasses.replace(cfg, steps=9)).steps == 5
    alone = dataclasses.replace(cfg, init_from=None, total_budget_tokens=128)
    assert plan_budget(alone).steps == 2  # no parent: the run alone
    with pytest.raises(BudgetError, match=r"trained on 192 tokens, nothing remains \(1 over\)"):
        plan_budget(dataclasses.replace(cfg, total_budget_tokens=191))


def test_the_record_holds_wall_time_process_hours_devices_and_tokens_per_second(lineage):
    record = read_record(lineage["a"])
    assert [(t["from_step"], t["to_step"]) for t in record.topology] == [(1, 2), (3, 3)]
    c = json.loads(open(os.path.join(lineage["a"], "last.json")).read())["compute"]
    walls = [t["wall_seconds"] for t in record.topology]
    assert c["wall_seconds"] == pytest.approx(sum(walls), abs=1e-3) and c["wall_seconds"] > 0
    assert c["process_hours"] == pytest.approx(sum(walls) / 3600, abs=1e-6)
    assert (c["device_type"], c["device_name"], c["device_count"]) == ("cpu", "cpu", 1)
    assert c["tokens"] == 3 * STEP_TOKENS
    assert c["tokens_per_second"] == pytest.approx(c["tokens"] / c["wall_seconds"], rel=1e-2)


def test_runs_lists_the_lineage_with_spec_table_spent_and_losses(lineage):
    out = invoke("runs", lineage["root"])
    a, b = read_record(lineage["a"]), read_record(lineage["b"])
    assert out.startswith(f"2 run(s) under {lineage['root']}\n")
    assert "runs/a  tiny, step 3/3\n" in out and "   └─ runs/b  tiny, step 2/2" in out
    assert out.index("runs/a  tiny") < out.index("└─ runs/b")
    assert f"data     {lineage['table']} v{a.loader.version} (pinned), input_ids" in out
    assert f"train {a.train_loss:.4f}, val {a.val_loss:.4f}" in out
    assert "spent    all 192\n" in out and "lineage  all 320 of a 330 budget" in out
    assert "process-hours on 1 x cpu" in out
    runs = {r["run"]: r for r in json.loads(invoke("runs", lineage["root"], "--json"))["runs"]}
    ra, rb = runs[lineage["a"]], runs[lineage["b"]]
    assert ra["children"] == [lineage["b"]] and rb["parent"] == lineage["a"]
    assert (rb["parent_step"], rb["tokens"], rb["lineage_tokens"]) == (3, 128, 320)
    assert (ra["table"], ra["table_version"], ra["pinned"]) == (lineage["table"], 3, True)
    assert (rb["train_loss"], rb["val_loss"]) == (b.train_loss, None)
    assert ra["spec"] == a.loader.describe() and ra["compute"] == a.compute
    cwd = run_cli("runs", "--json", cwd=os.path.join(lineage["root"], "runs"))  # default: .
    assert {r["run"] for r in json.loads(cwd.stdout)["runs"]} == set(runs)
    missing = run_cli("runs", os.path.join(lineage["root"], "nothing"))
    assert missing.returncode == 2 and "'DIR'" in missing.stderr


def test_ledger_of_a_run_shows_its_lineage_totals(lineage):
    led = json.loads(invoke("ledger", "--run", lineage["b"], "--steps", "1", "--json"))["lineage"]
    assert (led["step"], led["tokens"]) == (2, 320)
    text = invoke("ledger", "--run", lineage["b"], "--steps", "1")
    assert "(the runs it started from included): 320 tokens: all 320" in text


def test_every_run_pins_its_version_once_and_info_lists_them(lineage):
    ds = lance.dataset(lineage["table"])
    version = read_record(lineage["a"]).loader.version
    tags = ds.tags.list()
    assert sorted(tags) == sorted(run_tag(lineage[r], version) for r in ("a", "b"))
    assert {t["metadata"][RUN_KEY] for t in tags.values()} == {lineage["a"], lineage["b"]}
    assert all(t["version"] == version for t in tags.values())
    assert [p["tag"] for p in read_record(lineage["a"]).pins] == [run_tag(lineage["a"], version)]
    info = invoke("info", "--table", lineage["table"])
    for run in ("a", "b"):
        assert f"   {version}  run {lineage[run]}  ({run_tag(lineage[run], version)})" in info


def test_a_tag_held_by_another_run_is_refused(lineage, tmp_path):
    out = str(tmp_path / "c")
    version = read_record(lineage["a"]).loader.version
    ds = lance.dataset(lineage["table"])
    ds.tags.create(run_tag(out, version), version)
    ds.tags.replace_metadata(run_tag(out, version), {RUN_KEY: lineage["a"]})
    try:
        done = _train("--table", lineage["table"], "--out", out, "--steps", "1")
    finally:
        ds.tags.delete(run_tag(out, version))
    assert done.returncode == 1, done.stderr
    assert f"keeps version {version} for run {lineage['a']}; this run ({out})" in done.stderr
    assert f"tokenloom runs rm {lineage['a']}`, or train into another --out" in done.stderr
    assert not os.path.exists(os.path.join(out, "last.json"))


def test_overwrite_releases_the_replaced_runs_pin_on_its_own_table(lineage, tmp_path):
    other = token_table(tmp_path, real_paragraphs(12))
    out = str(tmp_path / "over")
    invoke("train", *SHAPE, "--table", other, "--out", out, "--steps", "1")
    assert [t["metadata"][RUN_KEY] for t in lance.dataset(other).tags.list().values()] == [out]
    invoke("train", *SHAPE, "--table", lineage["table"], "--out", out, "--steps", "1",
           "--overwrite")  # fmt: skip
    assert lance.dataset(other).tags.list() == {}  # the replaced run's pin, on its table
    held = [t["metadata"][RUN_KEY] for t in lance.dataset(lineage["table"]).tags.list().values()]
    assert out in held
    assert run_cli("runs", "rm", out).returncode == 0  # (the module's later tests count tags)
    assert out not in [
        t["metadata"][RUN_KEY] for t in lance.dataset(lineage["table"]).tags.list().values()
    ]


def test_unreadable_records_are_listed_and_a_gone_table_is_reported(lineage, tmp_path):
    record = json.loads(open(os.path.join(lineage["a"], "last.json")).read())
    gone = str(tmp_path / "gone.lance")
    record["loader"]["table"] = gone
    record["pins"] = [{**p, "table": gone} for p in record["pins"]]
    os.makedirs(tmp_path / "runs" / "moved")
    (tmp_path / "runs" / "moved" / "last.json").write_text(json.dumps(record))
    os.makedirs(tmp_path / "runs" / "bad")
    (tmp_path / "runs" / "bad" / "last.json").write_text("{")
    listed = run_cli("runs", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("1 run(s)") and "runs/moved  tiny, step 3/3" in listed.stdout
    assert f"not a readable run: {tmp_path / 'runs' / 'bad'}: " in listed.stdout
    done = run_cli("runs", "rm", str(tmp_path / "runs" / "moved"))
    assert done.returncode == 0, done.stderr
    assert f"table {gone} is gone: nothing to release there" in done.stdout
    bad = run_cli("runs", "rm", str(tmp_path / "runs" / "bad"))
    assert bad.returncode == 1 and "last.json" in bad.stderr


def test_runs_rm_releases_the_pins_and_delete_removes_the_run(lineage, tmp_path):
    """(Last: it changes the module's runs.)"""
    unknown = run_cli("runs", "rm", str(tmp_path / "nope"))
    assert unknown.returncode == 2 and "Invalid value for 'RUN'" in unknown.stderr
    assert "does not exist" in unknown.stderr
    version = read_record(lineage["a"]).loader.version
    done = run_cli("runs", "rm", lineage["a"])
    assert done.returncode == 0, done.stderr
    tag_a = run_tag(lineage["a"], version)
    assert done.stdout == f"released {tag_a} (version {version} of {lineage['table']})\n"
    assert tag_a not in lance.dataset(lineage["table"]).tags.list()
    assert read_record(lineage["a"]).pins == []  # the record says so
    listed = run_cli("runs", lineage["root"]).stdout
    assert f"v{version} (NOT pinned)" in listed and f"v{version} (pinned)" in listed  # b keeps
    again = json.loads(run_cli("runs", "rm", lineage["a"], "--json").stdout)
    assert again["released"] == [] and os.path.isdir(lineage["a"])
    keep = shutil.copytree(lineage["b"], str(tmp_path / "b-copy"))  # a copy keeps b's record
    gone = run_cli("runs", "rm", lineage["b"], "--delete")
    assert gone.returncode == 0, gone.stderr
    assert f"deleted {lineage['b']}" in gone.stdout and not os.path.exists(lineage["b"])
    assert lance.dataset(lineage["table"]).tags.list() == {}
    assert read_record(keep).pins  # (a copy's record is its own; nothing else was touched)
