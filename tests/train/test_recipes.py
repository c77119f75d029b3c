"""Training on every data recipe: concat, best-fit, windows with cut points, a 3-pool mixture.

One shared table (real text in three sources, GPT-2 ids, stored cut points). For each recipe a run
is stopped, resumed bit-identically, traced (block -> pool, context ranges), and its per-pool
counts equal the ledger of the same spec. A stage-2 run starts from the mixture run's weights with
a longer block and another mixture.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs, write_jsonl  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.loader import LoaderSpec, Planner, ledger  # noqa: E402
from tokenloom.search.trace import open_run  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint  # noqa: E402
from tokenloom.train.loop import TrainConfig, train  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402

MIX = {
    "prose": ["source = 'prose'", 0.5],
    "long": ["source = 'long'", 0.3],
    "code": ["source = 'code'", 0.2, 3],
}
RECIPES = {
    "concat": {},
    "best_fit": {"packing": "best_fit", "fit_window": 8},
    "window": {"long_docs": "window", "window": 48, "overlap": 8, "cut_column": "cut_points"},
    "mixture": {"mixture": MIX, "budget_tokens": 64 * 8 * 12},
}
STEPS = 6


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Short docstrings, long multi-paragraph documents and stdlib source, GPT-2 tokens with
    stored cut points."""
    tmp = tmp_path_factory.mktemp("recipes")
    paras = real_paragraphs(160)
    import json as json_mod
    import textwrap

    code = [inspect.getsource(m) for m in (textwrap, json_mod.decoder, json_mod.encoder)]
    code = [chunk for src in code for chunk in src.split("\n\n\n") if len(chunk) > 200][:30]
    records = (
        [{"text": p, "source": "prose"} for p in paras[:100]]
        + [{"text": "\n\n".join(paras[i : i + 6]), "source": "long"} for i in range(100, 160, 6)]
        + [{"text": c, "source": "code"} for c in code]
    )
    write_jsonl(tmp / "docs.jsonl", records)
    uri = str(tmp / "t.lance")
    ingest([tmp / "docs.jsonl"], uri, progress=False)
    out = CliRunner().invoke(
        cli,
        ["tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0", "--boundaries"],
    )
    assert out.exit_code == 0, out.output
    return uri


def _cfg(table, out, recipe: dict, **kw) -> TrainConfig:
    spec = LoaderSpec.from_options(
        table=table, seq_len=64, global_batch=4, seed=1, filter="id % 10 != 3", **recipe
    )
    options = dict(steps=STEPS, checkpoint_every=3, log_every=2, eval_every=1000)
    return TrainConfig(loader=spec, out=str(out), **{**options, **kw})


def _quiet(*_):
    return None


@pytest.fixture(scope="module")
def runs(table, tmp_path_factory):
    """Per recipe: an uninterrupted run and a stopped-then-resumed one."""
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for name, recipe in RECIPES.items():
        full = train(_cfg(table, tmp / f"{name}-full", recipe), log=_quiet)
        first = train(_cfg(table, tmp / name, recipe, stop_at=3), log=_quiet)
        rest = train(_cfg(table, tmp / name, recipe), resume=True, log=_quiet)
        out[name] = (full, first, rest, str(tmp / name))
    return out


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_trains_and_resumes_exactly(runs, name):
    full, first, rest, _ = runs[name]
    assert len(full.losses) == STEPS
    assert first.losses + rest.losses == full.losses  # bit-identical on CPU fp32
    assert all(x == x and x < 20 for x in full.losses)


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_runs_pool_counts_equal_the_ledger(runs, name):
    full, _, rest, out = runs[name]
    record = read_record(out)
    led = ledger(Planner(record.loader), steps=STEPS)
    expected = [dataclasses.replace(p, passes=1) for p in led.pools]
    assert [dataclasses.asdict(p) for p in expected] == record.pools == full.pools
    assert rest.pools == full.pools  # counted across the resume
    names = [p["name"] for p in record.pools]
    assert names == (list(MIX) if name == "mixture" else ["all"])
    assert all(p["body_tokens"] > 0 for p in record.pools)


@pytest.mark.parametrize("name", list(RECIPES))
def test_trace_answers_for_every_recipe(runs, name):
    _, _, _, out = runs[name]
    run = open_run(out)
    seen = [s for step in range(1, STEPS + 1) for s in run.step(step)]
    assert seen and {s.step for s in seen} == set(range(1, STEPS + 1))
    pools = {s.pool for s in seen}
    if name == "mixture":
        assert pools <= set(MIX) and len(pools) >= 2
    else:
        assert pools == {"all"}
    if name == "window":
        assert any(s.context_end is not None and s.context_end > s.token_start for s in seen)
    row = seen[0].row_id
    assert any(s.step == seen[0].step for s in run.row(row))


def test_stage_two_starts_from_the_parents_weights(table, runs, tmp_path):
    parent = runs["mixture"][3]
    stage2 = {"mixture": {"prose": ["source = 'prose'", 0.2], "long": ["source = 'long'", 0.8]}}
    stage2["budget_tokens"] = 128 * 4 * 8
    cfg = _cfg(table, tmp_path / "s2", stage2, steps=3, init_from=parent)
    cfg = dataclasses.replace(cfg, loader=cfg.loader.replace(seq_len=128))
    res = train(cfg, log=_quiet)
    fresh = train(dataclasses.replace(cfg, out=str(tmp_path / "fresh"), init_from=None), log=_quiet)
    assert res.step == 3 and res.losses[0] < fresh.losses[0]  # it starts from trained weights
    record = read_record(tmp_path / "s2")
    assert record.parent["out"] == os.path.abspath(parent) and record.parent["step"] == STEPS
    assert record.loader.seq_len == 128 and [p["name"] for p in record.pools] == ["prose", "long"]
    state = load_checkpoint(tmp_path / "s2")
    assert state.model["wpe.weight"].shape[0] == 128  # positions grown for the longer block


def test_resume_from_the_record_alone_through_the_cli(table, tmp_path):
    """`train --out D --resume` takes every option from the record; a changed schedule or loader
    option is refused (exit 1, naming the override); a second start into D is refused."""
    import subprocess
    import sys

    out = str(tmp_path / "cli")

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "tokenloom.cli.main", "train", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

    first = run(
        "--table", table, "--out", out, "--seq-len", "64", "--global-batch-size", "4",
        "--packing", "best_fit", "--fit-window", "8", "--steps", "4", "--stop-at", "2",
        "--log-every", "1",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr + first.stdout
    assert "fed: all" in first.stdout
    again = run("--table", table, "--out", out, "--steps", "4")
    assert again.returncode == 1 and "--overwrite" in again.stderr
    resched = run("--out", out, "--resume", "--steps", "9")
    assert resched.returncode == 1 and "--reschedule" in resched.stderr
    other = run("--out", out, "--resume", "--seq-len", "32")
    assert other.returncode == 1 and "seq_len" in other.stderr
    done = run("--out", out, "--resume")
    assert done.returncode == 0, done.stderr + done.stdout
    record = read_record(out)
    assert record.step == 4 and record.loader.recipe.packing == "best_fit"
    missing = run("--out", str(tmp_path / "nothing"), "--resume")
    assert missing.returncode == 1 and "record" in missing.stderr or "last.json" in missing.stderr

    led = CliRunner().invoke(
        cli,
        ["ledger", "--table", table, "--seq-len", "64", "--global-batch-size", "4",
         "--packing", "best_fit", "--fit-window", "8", "--steps", "4", "--json"],
    )  # fmt: skip
    assert led.exit_code == 0, led.output
    pools = json.loads(led.output)["pools"]
    for p in pools:
        p["passes"] = 1
    assert pools == record.pools


def test_a_crafted_checkpoint_is_refused_without_running_code(table, runs, tmp_path):
    import pickle
    import shutil
    import subprocess
    import sys

    out = tmp_path / "crafted"
    shutil.copytree(runs["concat"][3], out)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(out / f"step-{STEPS}" / "state.pt", "wb") as fh:
        pickle.dump({"model": Evil()}, fh)
    res = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", "train", "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "loads safely" in res.stderr, res.stderr
    assert not marker.exists()
    assert "Traceback" not in res.stderr
