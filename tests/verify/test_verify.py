"""``verify`` on real GPT-2 tables: every check passes on a faithful loader, and each check fails
when the thing it guards is broken (stored ids, provenance, masks, labels, resume)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import REPO, real_paragraphs, run_cli  # noqa: E402
from tests.verify.tables import FLIPPED_TOKEN, corrupt_table, gpt2_table  # noqa: E402
from tokenloom.cli.verify import command  # noqa: E402
from tokenloom.loader import EmptyEpochError, LoaderSpec, PackedDataset  # noqa: E402
from tokenloom.tokenize import load_tokenizer  # noqa: E402
from tokenloom.verify import CHECKS, VerifyError, verify  # noqa: E402
from tokenloom.verify.isolation import attention_leak, check_isolation, segment_starts  # noqa: E402
from tokenloom.verify.loss import check_loss  # noqa: E402
from tokenloom.verify.sample import (  # noqa: E402
    fixed_rows,
    read_sample,
    sample_steps,
)
from tokenloom.verify.text import check_text, check_token_ids  # noqa: E402

SMALL = {"seq_len": 64, "global_batch": 4, "steps": 2}  # many blocks, partial sample


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return real_paragraphs(60)


@pytest.fixture(scope="module")
def longest(texts) -> int:
    tok = load_tokenizer("gpt2")
    return int(np.argmax([len(tok.encode(t)) for t in texts]))


@pytest.fixture(scope="module")
def good(tmp_path_factory, texts) -> str:
    return gpt2_table(tmp_path_factory.mktemp("verify"), texts)


@pytest.fixture(scope="module")
def bad(tmp_path_factory, texts, longest) -> str:
    return corrupt_table(tmp_path_factory.mktemp("verify-bad"), texts, row=longest)


def _sample(uri: str, **options):
    return read_sample(LoaderSpec.from_options(table=uri, **options), steps=2)


# -- the whole run -----------------------------------------------------------------------------


def test_every_check_passes_on_a_faithful_loader(good, longest):
    report = verify(good, **SMALL)
    assert [c.name for c in report.checks] == list(CHECKS)
    assert report.passed, [c.detail for c in report.checks if not c.passed]
    assert report.fixed_rows[1] == longest
    assert {0, 1} <= set(report.steps_read) and report.total_steps > 2 * SMALL["steps"]
    assert report.to_json()["passed"] is True


@pytest.mark.parametrize(
    "options",
    [
        {"packing": "best_fit", "fit_window": 8},
        {"long_docs": "window", "window": 48, "overlap": 8, "filter": "id % 3 != 1"},
        {"long_docs": "window", "window": 48, "overlap": 8, "overlap_loss": True},
        {"mixture": {"a": ("id % 2 = 0", 0.5), "b": ("id % 2 = 1", 0.5)}, "budget_tokens": 6000},
    ],
    ids=["best_fit", "windows", "overlap_loss", "mixture"],
)
def test_every_check_passes_with_data_recipes(good, options):
    report = verify(good, **{**SMALL, **options})
    assert report.passed, [c.detail for c in report.checks if not c.passed]


def test_a_flipped_stored_id_fails_token_ids_and_text(bad, longest):
    report = verify(bad, **SMALL)
    ids = report.check("token_ids")
    assert not ids.passed
    assert ids.detail.startswith(f"row {longest}: stored id ")
    assert f"at token {FLIPPED_TOKEN} but gpt2 gives" in ids.detail
    assert "1 of " in ids.detail
    assert not report.check("text_reconstruction").passed  # the model would read other text
    assert [c.name for c in report.checks if c.passed] == [
        "document_isolation",
        "loss_positions",
        "resume",
        "pool_shares",
    ]


def test_verify_refuses_what_it_cannot_check(good, tmp_path):
    with pytest.raises(EmptyEpochError, match="selects 0 rows and no token"):
        verify(good, filter="id < 0")
    with pytest.raises(VerifyError, match="steps must be"):
        verify(good, steps=0)


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_prints_pass_per_check_and_exits_zero(good):
    result = CliRunner().invoke(command, ["--table", good, "--seq-len", "64", "--steps", "2"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert [ln.split()[:2] for ln in lines] == [["PASS", name] for name in CHECKS]
    assert "6 of 6 checks passed" in result.output


def test_cli_exits_one_on_a_failed_check(bad):
    runner = CliRunner()
    result = runner.invoke(command, ["--table", bad, "--seq-len", "64", "--steps", "2"])
    assert result.exit_code == 1
    assert "FAIL  token_ids" in result.output
    assert "verify failed: text_reconstruction, token_ids" in result.stderr
    result = runner.invoke(command, ["--table", bad, "--seq-len", "64", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["passed"] is False
    assert {c["name"]: c["passed"] for c in report["checks"]}["token_ids"] is False


# -- each check can fail -----------------------------------------------------------------------


def test_text_check_fails_when_a_fixed_document_loses_a_stretch(good):
    sample = _sample(good, seq_len=64, global_batch=4)
    long = sample.fixed_rows[1]
    for batch in sample.batches:  # change one delivered token of the long fixed row
        spans = batch.arrays["spans"]
        hit = np.flatnonzero(spans[:, 2] == long)
        if hit.size:
            blk, pos = spans[hit[0], :2]
            batch.arrays["input_ids"][blk, pos] += 1
            break
    result = check_text(sample)
    assert not result.passed and result.detail.startswith(f"row {long}: ")
    assert check_token_ids(sample).passed  # the stored ids are still right


def test_isolation_fails_when_cu_seqlens_merges_two_documents(good):
    sample = _sample(good, seq_len=64, global_batch=4)
    batch = next(b for b in sample.batches if np.any(b.arrays["spans"][:, 1] > 0))
    cu = batch.arrays["cu_seqlens"]
    inner = [i for i, c in enumerate(cu.tolist()) if c % 64 != 0][0]  # a boundary inside a block
    batch.arrays["cu_seqlens"] = np.delete(cu, inner)
    result = check_isolation(sample)
    assert not result.passed and "cu_seqlens" in result.detail


def test_attention_probe_sees_a_leaking_mask():
    ref = np.array([0] * 5 + [1] * 4 + [-1] * 3)
    assert attention_leak(ref, ref, [0, 1, -1], seed=0) is None
    merged = np.where(ref == 1, 0, ref)  # document 1 may attend to document 0
    assert "changes other documents' outputs" in attention_leak(merged, ref, [0], seed=0)
    gap = np.array([0] * 5 + [-1] * 3 + [1] * 4)
    pad_seen = np.where(gap == -1, 1, gap)  # document 1 may attend to the padding before it
    assert attention_leak(gap, gap, [0, 1, -1], seed=0) is None
    assert "the padding" in attention_leak(pad_seen, gap, [-1], seed=0)


def test_loss_check_fails_on_a_wrong_label_or_a_miscount(good):
    sample = _sample(good, seq_len=64, global_batch=4)
    eos_at = np.argwhere(sample.batches[0].arrays["input_ids"] == sample.eos_id)[0]
    sample.batches[0].arrays["labels"][tuple(eos_at)] = 5  # an EOS predicting the next document
    result = check_loss(sample)
    assert not result.passed and "expected -100" in result.detail

    sample = _sample(good, seq_len=64, global_batch=4)
    object.__setattr__(sample.batches[0], "loss_positions", sample.batches[0].loss_positions + 1)
    result = check_loss(sample)
    assert not result.passed and "stats counted" in result.detail


def test_resume_check_fails_when_the_state_is_ignored(good, monkeypatch):
    monkeypatch.setattr(PackedDataset, "load_state_dict", lambda self, state: None)
    report = verify(good, **SMALL)
    resume = report.check("resume")
    assert not resume.passed and "differs from the uninterrupted run" in resume.detail


# -- the sample --------------------------------------------------------------------------------


def test_sample_steps_and_fixed_rows():
    assert sample_steps(5, 3, seed=0) == [0, 1, 2, 3, 4]
    steps = sample_steps(100, 4, seed=7)
    assert steps[:4] == [0, 1, 2, 3] and len(steps) == 8 and steps == sorted(set(steps))
    assert steps == sample_steps(100, 4, seed=7) and 4 <= steps[4] <= 96
    ids, counts = np.array([2, 5, 7, 9]), np.array([0, 3, 9, 3])
    assert fixed_rows(ids, counts) == [5, 7]
    assert fixed_rows(ids[:2], np.array([0, 4])) == [5]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"packing": "best_fit", "fit_window": 4},
        {"long_docs": "window", "window": 24, "overlap": 4},
    ],
)
def test_steps_holding_matches_a_scan_of_every_block(good, options):
    for order in ("sequential", "interleave"):
        spec = LoaderSpec.from_options(
            table=good, seq_len=32, global_batch=3, block_order=order, **options
        )
        ds = PackedDataset(spec)
        view = ds.view(0)
        rows = fixed_rows(ds.inputs.row_ids, ds.inputs.n_tokens)
        want = sorted(  # every step's layout, scanned
            s for s in range(view.steps) if np.isin(view.layout(s).spans.row_id, rows).any()
        )
        assert view.steps_holding(np.asarray(rows)) == want


def test_segment_starts_compare_masks():
    a = np.array([[0, 0, 1, 1, -1], [3, 3, 3, 4, 4]])
    b = np.array([[7, 7, 2, 2, -1], [0, 0, 0, 9, 9]])  # the same segments, other names
    assert np.array_equal(segment_starts(a), segment_starts(b))
    assert np.array_equal(segment_starts(a)[0], [0, 0, 2, 2, -1])
    c = np.array([[0, 0, 0, 1, -1], [3, 3, 3, 4, 4]])
    assert not np.array_equal(segment_starts(a), segment_starts(c))


# -- pool shares per step ----------------------------------------------------------------------

MIX3 = {"prose": ("id % 3 = 0", 0.5), "code": ("id % 3 = 1", 0.3), "verse": ("id % 3 = 2", 0.2)}


def _mixture_file(tmp_path) -> str:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps({k: list(v) for k, v in MIX3.items()}))
    return str(path)


@pytest.mark.parametrize("budget", [61_440, 62_464])  # 60 steps (a multiple of 10) and 61
@pytest.mark.parametrize("order", ["interleave", "sequential"])
def test_every_step_of_a_mixture_holds_its_shares(good, budget, order):
    """3 pools 50/30/20, 128 positions, global batch 8: each step has 4 prose blocks, 2-3 code
    and 1-2 verse, whatever the epoch's step count or the block order."""
    ds = PackedDataset(
        good, seq_len=128, global_batch=8, mixture=MIX3, budget_tokens=budget, block_order=order
    )
    steps = [b["block_pool"].numpy() for b in ds]
    assert len(steps) == budget // (128 * 8)
    for pools in steps:
        counts = np.bincount(pools, minlength=3).tolist()
        assert counts[0] == 4 and counts[1] in (2, 3) and counts[2] in (1, 2), counts
    report = verify(
        good, seq_len=128, global_batch=8, mixture=MIX3, budget_tokens=budget, block_order=order
    )
    assert report.passed, [c.detail for c in report.checks if not c.passed]
    assert "hold every pool's share" in report.checks[-1].detail


def test_verify_fails_a_run_whose_steps_each_come_from_one_pool(good, tmp_path):
    """The earlier layout (one pool sequence over blocks, interleaved into steps) on 60 steps:
    every step from one pool; ``verify`` exits 1 naming the first step and pool that is off."""
    args = ["--table", good, "--seq-len", "128", "--global-batch-size", "8"]
    args += ["--mixture", _mixture_file(tmp_path), "--budget-tokens", "61440", "--steps", "2"]
    proc = run_cli("verify", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS  pool_shares" in proc.stdout
    broken = subprocess.run(
        [sys.executable, "-m", "tests.verify.single_pool", "verify", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
        timeout=300,
        cwd=REPO,
    )
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "FAIL  pool_shares" in broken.stdout
    assert "step 0: pool 'prose' has 8 of the step's 8 blocks" in broken.stdout
    assert "verify failed: pool_shares" in broken.stderr


def test_verify_of_very_long_blocks_keeps_memory_proportional_to_tokens(good):
    import subprocess
    import sys

    from tests.conftest import REPO

    # a wrapper process, so the peak is this verify's alone (RUSAGE_CHILDREN keeps the max)
    wrapper = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run([sys.executable, '-m', 'tokenloom.cli.main', 'verify', '--table',"
        f" {good!r}, '--filter', 'id < 5', '--seq-len', '100000'], capture_output=True,"
        " text=True)\n"
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(done.stdout + done.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=300, env=env
    )
    status, peak_kib = run.stdout.split("\n", 1)[0].split()
    assert status == "0", run.stdout + run.stderr
    assert "6 of 6 checks passed" in run.stdout
    assert int(peak_kib) < 3 * 1024 * 1024, f"peak RSS {int(peak_kib) / 1024:.0f} MiB"
