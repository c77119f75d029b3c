"""Loss by provenance through the real CLI: a 2-pool mixture run with two ``--loss-slice``s.

The per-group losses are checked against a reference computed here by hand from per-token
losses (the model run on the same batches, each position's document found by walking the spans,
each document's pools and slices by plain SQL scans), and the per-pool target counts against the
ledger. Malformed, invalid and unknown-column slices are usage errors naming the option.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import json
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # training processes

from click.testing import CliRunner  # noqa: E402

from tests.conftest import invoke, real_paragraphs, run_cli, write_jsonl  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.loader import Planner, ledger  # noqa: E402
from tokenloom.loader.pipeline.dataloader import PackedDataset  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint, load_run_model  # noqa: E402
from tokenloom.train.model import GPT  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402
from tokenloom.train.slices import membership_of, resolve_slices  # noqa: E402

MIX = {"prose": ["source = 'prose'", 0.6], "code": ["source = 'code'", 0.4]}
SLICES = {"even": "id % 2 = 0", "shortdoc": "length(text) < 400", "none": "id < 0"}
STEPS = 4
VAL = "id % 5 = 3"


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Docstrings (prose) and standard-library source chunks (code), GPT-2 tokens."""
    import json as json_mod
    import textwrap

    tmp = tmp_path_factory.mktemp("provloss")
    code = [inspect.getsource(m) for m in (textwrap, json_mod.decoder)]
    code = [c for src in code for c in src.split("\n\n\n") if len(c) > 200][:20]
    records = [{"text": p, "source": "prose"} for p in real_paragraphs(60)] + [
        {"text": c, "source": "code"} for c in code
    ]
    write_jsonl(tmp / "docs.jsonl", records)
    uri = str(tmp / "t.lance")
    ingest([tmp / "docs.jsonl"], uri, progress=False)
    out = CliRunner().invoke(
        cli, ["tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0"]
    )
    assert out.exit_code == 0, out.output
    return uri


def _train(table: str, out: str, *extra: str):  # noqa: ANN202
    """The run, in this process (click's runner: its exit code, stdout and stderr)."""
    slices = [a for name, sql in SLICES.items() for a in ("--loss-slice", f"{name}={sql}")]
    return CliRunner().invoke(cli, [
        "train", "--table", table, "--out", out, "--model", "tiny", "--seq-len", "64",
        "--global-batch-size", "4", "--seed", "1", "--filter", f"NOT ({VAL})",
        "--mixture", json.dumps(MIX), "--budget-tokens", str(64 * 4 * 6),
        "--val-filter", VAL, "--eval-batches", "2", "--eval-every", "1000",
        "--steps", str(STEPS), "--log-every", "1", "--log-to", "csv,tensorboard", "--device", "cpu",
        *slices, *extra,
    ], catch_exceptions=False)  # fmt: skip


@pytest.fixture(scope="module")
def run(table, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("provrun") / "run")
    res = _train(table, out, "--json")
    assert res.exit_code == 0, res.stderr
    return out, res


def _members(table: str, sql: str) -> set[int]:
    import lance

    ds = lance.dataset(table)
    return set(ds.to_table(columns=["id"], filter=sql).column("id").to_pylist())


def _reference(model, batches, groups: dict[str, set[int]]) -> dict[str, tuple[float, int]]:  # noqa: ANN001
    """Per group: (mean loss, target count) from per-token losses, the document of each position
    found by walking the spans (each stretch runs from its position to the next one's)."""
    sums = {g: 0.0 for g in groups}
    counts = {g: 0 for g in groups}
    with torch.no_grad():
        for batch in batches:
            _, tok = model(
                torch.as_tensor(np.asarray(batch["input_ids"])),
                position_ids=torch.as_tensor(np.asarray(batch["position_ids"])),
                doc_ids=torch.as_tensor(np.asarray(batch["doc_ids"])),
                labels=torch.as_tensor(np.asarray(batch["labels"])),
                reduction="none",
            )
            labels = np.asarray(batch["labels"])
            B, T = labels.shape
            tok = tok.view(B, T).double().numpy()
            spans = np.asarray(batch["spans"]).tolist()
            for i, (b, pos, row, _, _) in enumerate(spans):
                nxt = spans[i + 1] if i + 1 < len(spans) else None
                end = nxt[1] if nxt is not None and nxt[0] == b else T
                for t in range(pos, end):
                    if labels[b, t] == -100:
                        continue
                    for g, rows in groups.items():
                        if row in rows:
                            sums[g] += float(tok[b, t])
                            counts[g] += 1
    return {g: (sums[g] / counts[g] if counts[g] else math.nan, counts[g]) for g in groups}


def _groups(table: str) -> dict[str, set[int]]:
    pools = {f"pool/{name}": _members(table, sql) for name, (sql, _) in MIX.items()}
    return {**pools, **{f"slice/{n}": _members(table, sql) for n, sql in SLICES.items()}}


def test_val_loss_by_group_equals_a_reference_from_per_token_losses(run, table):
    out, res = run
    record = read_record(out)
    model, _ = load_run_model(out)
    spec = record.loader.replace(filter=VAL, seed=0, mixture=(), budget_tokens=None)
    ds = PackedDataset(spec)
    batches = [b for _, b in zip(range(2), ds, strict=False)]
    expected = _reference(model, batches, _groups(table))
    got = record.val_loss_by
    assert set(got) == set(expected)
    for name, (loss, tokens) in expected.items():
        assert got[name]["tokens"] == tokens, name
        if tokens:
            assert got[name]["loss"] == pytest.approx(loss, rel=1e-5), name
        else:
            assert got[name]["loss"] is None, name
    assert expected["slice/even"][1] > 0 and expected["slice/shortdoc"][1] > 0
    assert json.loads(res.stdout)["loss_by"]["val"] == got


def test_train_loss_by_group_at_step_one_equals_the_reference(run, table):
    """Step 1 runs on the initial weights (seeded as the trainer seeds them)."""
    out, _ = run
    record = read_record(out)
    state = load_checkpoint(out)
    torch.manual_seed(record.loader.seed)
    model = GPT.preset(
        "tiny",
        vocab_size=int(state.model["wte.weight"].shape[0]),
        block_size=int(state.model["wpe.weight"].shape[0]),
    )
    model.eval()
    first = next(iter(PackedDataset(record.loader)))
    expected = _reference(model, [first], _groups(table))
    logged = dict(state.history["train_by"])[1]
    all_tokens = sum(expected[f"pool/{p}"][1] for p in MIX)
    total = sum(expected[f"pool/{p}"][0] * expected[f"pool/{p}"][1] for p in MIX) / all_tokens
    assert total == pytest.approx(dict(state.history["train"])[1], rel=1e-5)  # same weights
    for name, (loss, tokens) in expected.items():
        assert logged[name]["tokens"] == tokens, name
        if tokens:
            assert logged[name]["loss"] == pytest.approx(loss, rel=1e-5), name


def test_per_pool_counts_equal_the_ledger_and_the_csv_has_every_group(run):
    out, res = run
    with open(os.path.join(out, "metrics-by-group.csv"), newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    train = [r for r in rows if r["split"] == "train"]
    assert sorted({int(r["step"]) for r in train}) == list(range(1, STEPS + 1))
    led = ledger(Planner(read_record(out).loader), steps=STEPS)
    for pool in led.pools:
        fed = sum(int(r["tokens"]) for r in train if r["group"] == f"pool/{pool.name}")
        assert fed == pool.loss_positions > 0
    val = {r["group"] for r in rows if r["split"] == "val"}
    assert val == {"pool/prose", "pool/code", *(f"slice/{n}" for n in SLICES)}
    assert "train loss by: pool/prose" in res.stderr or "train loss by: pool/prose" in res.stdout
    assert "--loss-slice none=id < 0 matches no row" in res.stderr

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(out, "tensorboard"))
    acc.Reload()
    code = acc.Scalars("train/loss/pool/code")
    assert [e.step for e in code] == list(range(1, STEPS + 1))
    want = [float(r["loss"]) for r in train if r["group"] == "pool/code"]
    assert [e.value for e in code] == pytest.approx(want, rel=1e-6)
    assert "val/loss/slice/even" in acc.Tags()["scalars"]
    assert "val/loss/slice/none" not in acc.Tags()["scalars"]  # no target: nothing to plot


def test_membership_forms_agree(table):
    """The bitmap (dense ids) and the bit-packed sorted ids (sparse ids) answer the same."""
    from tokenloom.loader.plan.compact import encode

    (dense,) = resolve_slices(table, [("even", "id % 2 = 0")])
    rows = sorted(_members(table, "id % 2 = 0"))
    assert dense.bits is not None and dense.rows == len(rows)
    ids = np.arange(-3, 200)
    assert (dense.contains(ids) == np.isin(ids, rows)).all()
    far = membership_of("far", "id = 5 OR id = 1000000000000", encode(np.array([5, 10**12])))
    assert far.bits is None  # a bitmap would take 125 GB
    assert far.contains(np.array([5, 6, 10**12, -1])).tolist() == [True, False, True, False]


@pytest.mark.parametrize(
    ("slice_", "message"),
    [
        ("x=nope = 1", "nope"),
        ("x=id >", "x"),
        ("noequals", "NAME=SQL"),
        ("1bad=id > 1", "name"),
    ],
)
def test_bad_slices_are_usage_errors_naming_the_option(table, tmp_path, slice_, message):
    res = run_cli(
        "train", "--table", table, "--out", str(tmp_path / "r"), "--steps", "1",
        "--seq-len", "64", "--global-batch-size", "4", "--loss-slice", slice_,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "--loss-slice" in res.stderr and message in res.stderr
    assert not os.path.exists(tmp_path / "r" / "last.json")


def test_two_processes_report_the_same_groups_as_one(tmp_path):
    """Sums and counts are all-reduced: 2 gloo ranks (torchrun) give one process's values."""
    import subprocess
    import sys

    from tests.loader.tables import token_table

    table = token_table(tmp_path, real_paragraphs(40))
    mix = {"even": ["source = 'even'", 0.5], "odd": ["source = 'odd'", 0.5]}
    args = [
        "train", "--table", table, "--seq-len", "32", "--global-batch-size", "4",
        "--steps", "3", "--log-every", "1", "--eval-every", "3", "--eval-batches", "1",
        "--mixture", json.dumps(mix), "--budget-tokens", str(32 * 4 * 4),
        "--filter", "id % 5 != 0", "--val-filter", "id % 5 = 0", "--device", "cpu",
        "--loss-slice", "long=length(text) > 300",
    ]  # fmt: skip
    invoke(*args, "--out", str(tmp_path / "one"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tokenloom.cli.main", *args, "--out", str(tmp_path / "two")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    a = load_checkpoint(str(tmp_path / "one")).history
    b = load_checkpoint(str(tmp_path / "two")).history
    for key in ("train_by", "val_by"):
        assert [s for s, _ in a[key]] == [s for s, _ in b[key]] and a[key]
        for (_, x), (_, y) in zip(a[key], b[key], strict=True):
            assert {k: v["tokens"] for k, v in x.items()} == {k: v["tokens"] for k, v in y.items()}
            for name, v in x.items():
                if v["loss"] is not None:
                    assert y[name]["loss"] == pytest.approx(v["loss"], rel=1e-4), (key, name)


def test_a_resumed_run_logs_each_step_once_and_keeps_the_groups(tmp_path):
    from tests.loader.tables import token_table
    from tokenloom.loader import LoaderSpec
    from tokenloom.train.loop import TrainConfig, train

    table = token_table(tmp_path, real_paragraphs(40))
    spec = LoaderSpec(
        table=table,
        seq_len=32,
        global_batch=2,
        mixture={"even": ["source = 'even'", 0.5], "odd": ["source = 'odd'", 0.5]},
        budget_tokens=32 * 2 * 6,
    )
    cfg = TrainConfig(
        loader=spec, out=str(tmp_path / "run"), steps=4, log_every=1, log_to=("csv",),
        loss_slices=(("short", "length(text) < 300"),), checkpoint_every=2,
    )  # fmt: skip
    quiet = lambda *_: None  # noqa: E731
    full = train(dataclasses.replace(cfg, out=str(tmp_path / "full")), log=quiet)
    train(dataclasses.replace(cfg, stop_at=2), log=quiet)
    rest = train(cfg, resume=True, log=quiet)
    with open(tmp_path / "run" / "metrics-by-group.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == [s for s in range(1, 5) for _ in range(3)]
    assert {r["group"] for r in rows} == {"pool/even", "pool/odd", "slice/short"}
    assert rest.loss_by["train"] == full.loss_by["train"]  # bit-identical on CPU fp32
    history = load_checkpoint(str(tmp_path / "run")).history["train_by"]
    assert [s for s, _ in history] == [1, 2, 3, 4]
