"""``verify`` tells a document's visits apart by the pass that delivers it: best-fit places a long
document's windows in any blocks of its fit window (not in token order), and a mixture of
source-filtered pools may never reach a selected row, or reach a row once in each of its pools."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import real_paragraphs, run_cli, write_jsonl  # noqa: E402
from tests.verify.tables import FLIPPED_TOKEN, flip_one_id  # noqa: E402
from tokenloom.backfill import add_column  # noqa: E402
from tokenloom.loader import LoaderSpec  # noqa: E402
from tokenloom.verify import verify  # noqa: E402
from tokenloom.verify.isolation import check_isolation  # noqa: E402
from tokenloom.verify.loss import check_loss  # noqa: E402
from tokenloom.verify.sample import read_sample  # noqa: E402
from tokenloom.verify.text import check_text, stretches, visits  # noqa: E402

BEST_FIT = {"seq_len": 128, "global_batch": 4, "packing": "best_fit", "long_docs": "window"}
SOURCES = ("web", "code", "books")


def _texts() -> list[str]:
    """Short paragraphs and a few long documents (several paragraphs, lines between them)."""
    p = real_paragraphs(60)
    return p[:48] + ["\n\n".join(p[i : i + 8]) for i in range(0, 48, 8)]


def _table(tmp_path, tokenize) -> str:
    """The texts ingested with sources cycling through ``SOURCES`` (row ``i``: ``i % 3``)."""
    from tokenloom.ingest import ingest

    src = tmp_path / "docs.jsonl"
    texts = _texts()
    write_jsonl(src, [{"text": t, "source": SOURCES[i % 3]} for i, t in enumerate(texts)])
    uri = str(tmp_path / "mixed.lance")
    ingest([src], uri, progress=False)
    tokenize(uri)
    return uri


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    from tokenloom.tokenize.boundaries import add_boundaries
    from tokenloom.tokenize.column import tokenize_table

    def tokenize(uri: str) -> None:
        tokenize_table(uri, "gpt2", workers=0, progress=False)
        add_boundaries(uri, workers=0, progress=False)  # the cut_points column

    return _table(tmp_path_factory.mktemp("visits"), tokenize)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):  # noqa: ANN201 - a function of the row
    """``bad(row)``: the same table, but ``row``'s stored ids differ from its text in one token."""
    made: dict[int, str] = {}

    def build(row: int) -> str:
        if row not in made:
            made[row] = _table(
                tmp_path_factory.mktemp(f"visits-bad-{row}"),
                lambda uri: add_column(uri, None, flip_one_id(row), workers=0),
            )
        return made[row]

    return build


def _long_visit(sample):
    """The stretches of the longest fixed row, in stream order."""
    long = sample.fixed_rows[-1]
    parts = [st for b in sample.batches for st in stretches(b) if st.row == long]
    return sorted(parts, key=lambda st: (st.order, st.pos))


@pytest.mark.parametrize(
    "options",
    [
        {"window": 80},
        {"window": 80, "overlap": 16},
        {"window": 80, "cut_column": "cut_points"},
        {"window": 80, "overlap": 16, "cut_column": "cut_points"},
        {"overlap": 16, "cut_column": "cut_points"},
    ],
    ids=["window", "overlap", "cut", "overlap-cut", "full-window-cut"],
)
def test_best_fit_windows_in_any_block_order_pass(good, options):
    report = verify(good, **BEST_FIT, **options, steps=2)
    assert report.passed, [c.detail for c in report.checks if not c.passed]
    assert "rebuilt exactly" in report.check("text_reconstruction").detail


def test_best_fit_delivers_the_plan_and_its_windows_out_of_token_order(good):
    """The loader is right (its batches are the plan's stretches, checked by document_isolation);
    the plan places windows of one document out of token order, which the old rule (a visit
    starts at token 0) read as a gap."""
    spec = LoaderSpec.from_options(table=good, **BEST_FIT, window=80, cut_column="cut_points")
    sample = read_sample(spec, steps=2)
    parts = _long_visit(sample)
    starts = [st.start for st in parts]
    assert starts != sorted(starts), starts  # the case the old rule got wrong
    assert len(visits(parts)) == 1
    assert check_isolation(sample).passed  # the batches are the plan's stretches
    assert check_text(sample).passed and check_loss(sample).passed


def test_best_fit_check_still_fails_a_missing_window(good):
    sample = read_sample(
        LoaderSpec.from_options(table=good, **BEST_FIT, window=80, cut_column="cut_points"),
        steps=2,
    )
    long = sample.fixed_rows[-1]
    victim = next(st for st in _long_visit(sample) if st.start > 0)
    for batch in sample.batches:  # the loader drops one window of the long fixed row
        if batch.step == victim.step:
            spans = batch.arrays["spans"]
            keep = ~((spans[:, 0] == victim.block) & (spans[:, 1] == victim.pos))
            batch.arrays["spans"] = spans[keep]
            if "context" in batch.arrays:
                batch.arrays["context"] = batch.arrays["context"][keep]
    result = check_text(sample)
    assert not result.passed
    assert result.detail.startswith(f"row {long}: tokens [") and "in no block" in result.detail


def _mixture(tmp_path, pools: dict) -> str:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(pools))
    return str(path)


MIXTURES = {
    # pool c gets 3 blocks of a pass: the union's longest row (52, code) is never delivered
    "budget": ({"w": ["source = 'web'", 0.9], "c": ["source = 'code'", 0.1]}, ["4000"], 48),
    # the epoch ends with w's one pass, inside c's first pass: row 52 is never delivered
    "max_passes": ({"w": ["source = 'web'", 0.9, 1], "c": ["source = 'code'", 0.1]}, [], 48),
    # one pass of each: row 52 is in both pools, delivered once in each
    "two_pools": (
        {"w": ["source = 'web' OR id = 52", 0.5, 1], "c": ["source = 'code'", 0.5, 1]},
        [],
        52,
    ),
}


@pytest.mark.parametrize(
    "windows", [[], ["--packing", "best_fit", "--long-docs", "window", "--window", "80"]]
)
@pytest.mark.parametrize("case", list(MIXTURES))
def test_mixture_of_source_filtered_pools_passes_and_catches_a_wrong_id(
    good, bad, tmp_path, case, windows
):
    pools, budget, longest = MIXTURES[case]
    args = ["--seq-len", "128", "--global-batch-size", "4", "--steps", "2", *windows]
    args += ["--mixture", _mixture(tmp_path, pools)]
    args += ["--budget-tokens", *budget] if budget else []
    proc = run_cli("verify", "--table", good, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 checks passed" in proc.stdout
    assert f", {longest}; " in proc.stdout  # the longest row the epoch delivers is fixed
    proc = run_cli("verify", "--table", bad(longest), *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  token_ids" in proc.stdout and "please report" not in proc.stderr
    assert f"row {longest}: stored id " in proc.stdout
    assert f"at token {FLIPPED_TOKEN} but gpt2 gives" in proc.stdout


def test_a_row_the_filter_does_not_select_fails_the_checks(good):
    sample = read_sample(LoaderSpec.from_options(table=good, seq_len=128), steps=2)
    stray = int(sample.batches[0].arrays["spans"][0, 2])
    del sample.rows[stray]  # as if the loader delivered a row outside the selection
    text = check_text(sample)
    assert not text.passed and f"row {stray} at step 0" in text.detail
    assert "not a row the loader's filter selects" in text.detail
    loss = check_loss(sample)
    assert not loss.passed and f"row {stray} is not a row" in loss.detail


def test_a_visit_the_pools_epoch_ends_inside_may_miss_windows_but_not_differ(good):
    """Pool w's third pass is cut by the budget; best-fit delivered only some windows of the fixed
    row 48 in it. That passes; a changed token in that visit fails."""
    mix = {"w": ("source = 'web'", 0.9), "c": ("source = 'code'", 0.1)}
    spec = LoaderSpec.from_options(
        table=good,
        seq_len=128,
        global_batch=4,
        mixture=mix,
        budget_tokens=5000,
        window=80,
        packing="best_fit",
        long_docs="window",
    )
    sample = read_sample(spec, steps=2)
    parts = [st for b in sample.batches for st in stretches(b) if st.row == 48]
    cut = [v for v in visits(parts) if v[0].visit in sample.cut_passes]
    assert len(cut) == 1
    assert max(st.end for st in cut[0]) < len(sample.rows[48].stored)  # windows missing
    assert check_text(sample).passed and check_loss(sample).passed
    victim = cut[0][0]
    batch = next(b for b in sample.batches if b.step == victim.step)
    batch.arrays["input_ids"][victim.block, victim.pos + victim.end - victim.start - 1] += 1
    result = check_text(sample)
    assert not result.passed and result.detail.startswith("row 48: the tokens delivered at ")
    assert "its pool's epoch ends inside this pass" in result.detail
