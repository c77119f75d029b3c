"""Loss masks through the real CLI: ``backfill run --udf tokenloom.backfill.builtin:LossMask``,
``verify``/``ledger``/``train --loss-mask-column``, a recomputed mask (a new version, no new
tokens), ``kill -9`` and ``--resume``, and the usage errors (exit 2 naming the option)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import lance
import numpy as np
import pytest

from tests.conftest import REPO, invoke, real_paragraphs, run_cli, write_jsonl
from tokenloom.loader import PackedDataset

pytestmark = pytest.mark.slow  # kill/resume through real training processes: minutes

MASK_UDF = "tokenloom.backfill.builtin:LossMask"
SHAPE = ("--seq-len", "64", "--global-batch-size", "4")


def _texts() -> list[str]:
    out = []
    for i, p in enumerate(real_paragraphs(40)):
        if i % 3 == 0:
            p += f" Mail user{i}@example.org or call +44 20 7946 {i:04d}."
        if i % 5 == 0:
            p = f"# Copyright {2000 + i} The Authors\n# Licensed under the MIT license\n{p}"
        out.append(p)
    return out


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Ingested, tokenized with gpt2 once, and masked (e-mail + phone) by the builtin UDF."""
    tmp = tmp_path_factory.mktemp("lossmask_cli")
    write_jsonl(tmp / "docs.jsonl", [{"text": t} for t in _texts()])
    uri = str(tmp / "t.lance")
    invoke("ingest", str(tmp / "docs.jsonl"), "--table", uri)
    invoke("tokenize", "--table", uri, "--tokenizer", "gpt2")
    invoke("backfill", "run", "--table", uri, "--udf", MASK_UDF, "--workers", "0")
    invoke(
        "backfill", "run", "--table", uri, "--udf", MASK_UDF, "--column", "license_mask",
        "--arg", "patterns=license", "--workers", "0",
    )  # fmt: skip
    return uri


def _spans_of(uri: str, column: str, version: int | None = None) -> dict:
    t = lance.dataset(uri, version=version).to_table(columns=["id", column])
    return {
        i: [(v[k], v[k + 1]) for k in range(0, len(v), 2)]
        for i, v in zip(t["id"].to_pylist(), t[column].to_pylist(), strict=True)
    }


def test_the_builtin_udf_masks_the_tokens_of_each_match(table):
    from tokenloom.tokenize.registry import load_tokenizer

    tok = load_tokenizer("gpt2")
    t = lance.dataset(table).to_table(columns=["id", "text", "input_ids", "loss_mask"]).to_pylist()
    for row in t:
        pairs = row["loss_mask"]
        spans = list(zip(pairs[::2], pairs[1::2], strict=True))
        pieces = [tok.decode(row["input_ids"][a:b]) for a, b in spans]
        if row["id"] % 3 == 0:
            rid = row["id"]
            assert any(f"user{rid}@example.org" in p for p in pieces), pieces
            assert any(f"+44 20 7946 {rid:04d}" in p for p in pieces), pieces
        else:
            assert pairs == []  # no match: an empty list
        for a, b in spans:
            assert 0 <= a < b <= len(row["input_ids"])


def test_verify_and_ledger_count_the_masked_tokens(table):
    done = invoke("verify", "--table", table, *SHAPE, "--loss-mask-column", "loss_mask", "--json")
    report = json.loads(done)
    loss = next(c for c in report["checks"] if c["name"] == "loss_positions")
    assert loss["passed"] and "stats.masked_tokens" in loss["detail"], loss
    led = json.loads(
        invoke("ledger", "--table", table, *SHAPE, "--loss-mask-column", "loss_mask", "--json")
    )
    ds = PackedDataset(table, seq_len=64, global_batch=4, loss_mask_column="loss_mask")
    sum(1 for _ in ds.batches())
    assert led["pools"][0]["masked_tokens"] == ds.stats.masked_tokens > 0
    assert led["pools"][0]["loss_positions"] == ds.stats.loss_positions
    text = invoke("ledger", "--table", table, *SHAPE, "--loss-mask-column", "loss_mask")
    assert "masked" in text and f"{ds.stats.masked_tokens:,}" in text
    stats = json.loads(
        invoke("stats", "--table", table, *SHAPE, "--loss-mask-column", "loss_mask", "--json")
    )["loss_mask"]
    spans = _spans_of(table, "loss_mask")
    assert stats["rows"] == len(spans) and stats["rows_masked"] == sum(map(bool, spans.values()))
    assert stats["masked_tokens"] == sum(b - a for v in spans.values() for a, b in v)  # disjoint


def _token_files(uri: str, version: int) -> set[str]:
    """The data files holding the token column at ``version``."""
    ds = lance.dataset(uri, version=version)
    fid = ds.schema.get_field_index("input_ids")
    field_id = ds.lance_schema.field("input_ids").id() if fid >= 0 else None
    out = set()
    for frag in ds.get_fragments():
        meta = frag.metadata
        for f in meta.files if hasattr(meta, "files") else meta.data_files():
            if field_id in f.fields:
                out.add(f.path)
    return out


def test_a_recomputed_mask_changes_the_labels_without_retokenizing(tmp_path, table):
    import shutil

    uri = str(tmp_path / "copy.lance")
    shutil.copytree(table, uri)
    before = lance.dataset(uri).version
    lance.dataset(uri).drop_columns(["loss_mask"])  # a column made by another definition goes
    args = ("--udf", MASK_UDF, "--arg", 'patterns=["license"]', "--workers", "0")
    invoke("backfill", "run", "--table", uri, *args)
    after = lance.dataset(uri).version
    assert after > before
    assert _token_files(uri, after) == _token_files(uri, before)  # no token rewritten
    opts = {"seq_len": 64, "global_batch": 4, "loss_mask_column": "loss_mask"}
    old = list(PackedDataset(uri, version=before, **opts).batches())
    new = list(PackedDataset(uri, version=after, **opts).batches())
    plain = list(PackedDataset(uri, version=after, seq_len=64, global_batch=4).batches())
    for o, n in zip(old, new, strict=True):
        np.testing.assert_array_equal(o["input_ids"], n["input_ids"])
    assert any((o["labels"] != n["labels"]).any() for o, n in zip(old, new, strict=True))
    spans = _spans_of(uri, "loss_mask")
    assert any(spans.values()) and all(spans[i] for i in range(0, 40, 5))
    for p, n in zip(plain, new, strict=True):  # the new labels: the plain ones, masked by hand
        want = p["labels"].copy()
        for blk, pos, rid, s, e in p["spans"].tolist():
            for j in range(e - s):
                if any(a <= s + j + 1 < b for a, b in spans[rid]):
                    want[blk, pos + j] = -100
        np.testing.assert_array_equal(n["labels"], want)
    # a cursor taken on the old mask continues onto the new one (--version NEW
    # --allow-data-change): the same plan, the new labels
    first = PackedDataset(uri, version=before, **opts)
    it = first.batches()
    next(it), next(it)
    moved = PackedDataset(uri, version=after, allow_data_change=True, **opts)
    moved.load_state_dict(first.state_dict())
    rest = list(moved.batches())
    assert len(rest) == len(new) - 2
    for got, want_batch in zip(rest, new[2:], strict=True):
        for key in ("input_ids", "labels", "spans"):
            np.testing.assert_array_equal(got[key], want_batch[key])


def _train_cmd(table: str, out, every: int) -> list[str]:
    """7 steps, a checkpoint each ``every`` (1 for the run to kill; the reference only needs
    its last: each of these gpt2-vocabulary checkpoints is ~83 MB written and fsynced)."""
    return [
        sys.executable, "-m", "tokenloom.cli.main", "train", "--table", table, "--out", str(out),
        *SHAPE, "--steps", "7", "--checkpoint-every", str(every), "--log-every", "100",
        "--loss-mask-column", "loss_mask",
    ]  # fmt: skip


def test_kill_9_and_resume_give_the_same_batches(table, tmp_path):
    pytest.importorskip("torch")
    from tokenloom.train.checkpoint import load_checkpoint
    from tokenloom.train.layout import last_step
    from tokenloom.train.record import read_record

    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    }
    full = subprocess.run(_train_cmd(table, tmp_path / "full", 7), env=env, capture_output=True)
    assert full.returncode == 0, full.stderr.decode()
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        _train_cmd(table, out, 1), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and (last_step(out) or 0) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    err = proc.communicate()[1].decode()
    assert proc.returncode == -signal.SIGKILL, err
    killed_at = load_checkpoint(out).step
    assert 3 <= killed_at < 7
    resumed = run_cli("train", "--out", str(out), "--resume", env={"OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(out)
    assert b.step == a.step == 7
    assert b.history["train"] == a.history["train"]  # bit-identical on CPU: the same labels
    pools_a, pools_b = read_record(tmp_path / "full").pools, read_record(out).pools
    assert pools_b[0]["masked_tokens"] == pools_a[0]["masked_tokens"] > 0
    assert pools_b[0]["loss_positions"] == pools_a[0]["loss_positions"]
    for column, status in (("license_mask", 1), ("nope", 2)):  # another mask; no such column
        other = run_cli("train", "--out", str(out), "--resume", "--steps", "9", "--reschedule",
                        "--loss-mask-column", column)  # fmt: skip
        assert other.returncode == status, other.stderr
        assert ("loss_mask_column" if status == 1 else "--loss-mask-column") in other.stderr


@pytest.mark.parametrize(
    ("command", "column", "match"),
    [
        ("train", "text", "has type large_string"),
        ("train", "n_chars", "has type int"),
        ("ledger", "nope", "no such column"),
        ("verify", "meta", "has type"),
        ("train", "input_ids", "holds the token ids or their counts"),
        ("ledger", "n_tokens", "holds the token ids or their counts"),
    ],
)
def test_a_bad_mask_column_is_a_usage_error_naming_the_option(
    table, tmp_path, command, column, match
):
    extra = ("--out", str(tmp_path / "run"), "--steps", "1") if command == "train" else ()
    done = run_cli(command, "--table", table, *SHAPE, *extra, "--loss-mask-column", column)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--loss-mask-column" in done.stderr and match in done.stderr, done.stderr
