"""Windows cut at the text's structure (a ranked cut column), ``long_docs="units"``, cut columns
with mixtures, what windows end at, and ``overlap_loss``."""

from __future__ import annotations

import inspect
import json
import re
import textwrap

import numpy as np
import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.recipe import Recipe
from tokenloom.loader.plan.window import (
    END_KINDS,
    CutPoints,
    naive_structured_ends,
    window_table,
)
from tokenloom.table import Table
from tokenloom.tokenize import load_tokenizer

W, OVERLAP = 64, 8


def _random_cuts(rng, lengths, ranked=True):
    rows, ptr, values, ranks = [], [0], [], []
    for rid, n in enumerate(lengths):
        k = int(rng.integers(0, max(1, n // 6)))
        cuts = np.unique(rng.integers(1, max(n, 2), size=k))
        rows.append(rid)
        values.extend(cuts.tolist())
        ranks.extend(rng.choice([0, 0, 0, 1, 1, 2], size=cuts.shape[0]).tolist())
        ptr.append(len(values))
    return CutPoints(
        np.array(rows), np.array(ptr), np.array(values, dtype=np.int32),
        np.array(ranks, dtype=np.int8) if ranked else None,
    )  # fmt: skip


@pytest.mark.parametrize(("ranked", "units"), [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("overlap", [0, 5])
def test_window_table_equals_the_naive_reference(ranked, units, overlap):
    rng = np.random.default_rng(20 + overlap + 2 * units + ranked)
    lengths = rng.integers(1, 400, size=300)
    cuts = _random_cuts(rng, lengths, ranked)
    table = window_table(
        np.arange(300), lengths, window=40, overlap=overlap, cut_points=cuts, units=units
    )
    for i, row in enumerate(table.rows.tolist()):
        got = list(
            zip(
                table.ends[table.ptr[i] : table.ptr[i + 1]].tolist(),
                table.kinds[table.ptr[i] : table.ptr[i + 1]].tolist(),
                strict=True,
            )
        )
        offs = cuts[row].tolist()
        ranks = cuts.ranks[cuts.ptr[row] : cuts.ptr[row + 1]].tolist() if ranked else None
        want = naive_structured_ends(
            int(lengths[row]), offs, ranks, window=40, overlap=overlap, units=units
        )
        assert got == want, row


def test_units_are_never_split_when_they_fit():
    rng = np.random.default_rng(7)
    lengths = rng.integers(100, 2000, size=200)
    cuts = _random_cuts(rng, lengths)
    Wn, ov = 64, 6
    table = window_table(
        np.arange(200), lengths, window=Wn, overlap=ov, cut_points=cuts, units=True
    )
    fitting = split_when_long = 0
    for i, row in enumerate(table.rows.tolist()):
        ends = table.ends[table.ptr[i] : table.ptr[i + 1]].astype(np.int64)
        sel = cuts.ranks[cuts.ptr[row] : cuts.ptr[row + 1]] == 2
        edges = [0, *np.asarray(cuts[row])[sel].tolist(), int(lengths[row]) + 1]
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            inside = ((ends > a) & (ends < b)).any()
            if b - a <= (Wn if a == 0 else Wn - ov):
                fitting += 1
                assert not inside, (row, a, b)  # a unit that fits is never cut
            elif b - a > Wn:
                split_when_long += inside
    assert fitting > 100 and split_when_long > 10  # both cases were exercised
    with pytest.raises(PlanError, match="ranked cut column"):
        plain = CutPoints(cuts.rows, cuts.ptr, cuts.values)
        window_table(np.arange(200), lengths, window=Wn, overlap=ov, cut_points=plain, units=True)


FENCE = re.compile(r"^```", re.M)


def _markdown_docs() -> list[str]:
    """Long Markdown documents of real prose with real Python code in fenced blocks."""
    paras = real_paragraphs(60)
    code = [
        inspect.getsource(f)
        for f in (textwrap.dedent, textwrap.indent, textwrap.fill, textwrap.shorten)
    ]
    docs = []
    for d in range(6):
        parts = [f"# Chapter {d}"]
        for j in range(10):
            parts.append(paras[(d * 10 + j) % 60])
            if j % 3 == 1:
                parts.append("```python\n" + code[(d + j) % len(code)].rstrip("\n") + "\n```")
            if j == 5:
                parts.append(f"## Part {d}.{j}")
        docs.append("\n\n".join(parts) + "\n")
    return docs


def _code_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges strictly inside fenced blocks (after the opening fence's line, up to
    the end of the closing fence's line)."""
    marks = [m.start() for m in FENCE.finditer(text)]
    out = []
    for a, b in zip(marks[::2], marks[1::2], strict=True):
        out.append((text.index("\n", a) + 1, text.index("\n", b) + 1))
    return out


@pytest.fixture(scope="module")
def md_table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("md")
    docs = _markdown_docs()
    write_jsonl(tmp / "md.jsonl", [{"text": t, "source": "md"} for t in docs])
    write_jsonl(
        tmp / "py.jsonl", [{"text": inspect.getsource(textwrap), "source": "py"}] * 1
    )  # real stdlib source as a second pool
    uri = str(tmp / "t.lance")
    ingest([tmp / "md.jsonl", tmp / "py.jsonl"], uri, progress=False)
    res = run_cli(
        "tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0",
        "--boundaries", "--structure",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return uri


def _ends_inside_code(uri: str, column: str) -> tuple[int, int, int]:
    """``(window ends inside a code block, of which with a boundary in the last quarter,
    windows)`` of the md rows, from the planner's windows."""
    from tokenloom.loader import PackedDataset

    tok = load_tokenizer("gpt2")
    rows = {
        r["id"]: r
        for r in Table.open(uri)
        .dataset.to_table(columns=["id", "text", "input_ids", "cut_structure"])
        .to_pylist()
    }
    ds = PackedDataset(
        uri, seq_len=W, global_batch=2, long_docs="window", window=W, overlap=OVERLAP,
        cut_column=column, block_order="sequential",
    )  # fmt: skip
    v = ds.plan().docs
    inside = with_boundary = windows = 0
    for i in range(len(v.tok_start)):
        r = rows[int(v.row_id[i])]
        if v.has_eos[i] or not r["text"].startswith("# Chapter"):
            continue
        windows += 1
        s, e = int(v.tok_start[i]), int(v.tok_end[i])
        at = len(tok.decode(r["input_ids"][:e]))
        if any(a < at < b for a, b in _code_spans(r["text"])):
            inside += 1
            floor = max(s + OVERLAP, s + W - W // 4)
            with_boundary += any(floor < d["offset"] <= s + W for d in r["cut_structure"])
    return inside, with_boundary, windows


def test_windows_never_end_inside_a_code_block_when_a_boundary_is_in_the_last_quarter(md_table):
    lines_inside, _, lines_windows = _ends_inside_code(md_table, "cut_points")
    inside, with_boundary, windows = _ends_inside_code(md_table, "cut_structure")
    assert lines_windows > 50 and windows > 50
    assert lines_inside > 0  # line-break cuts do end inside code
    assert with_boundary == 0  # structure cuts never do when they have a choice
    assert inside < lines_inside


def test_stats_counts_window_ends_by_kind_and_units_plan(md_table):
    counts = {}
    for long_docs, column in (("window", "cut_points"), ("window", "cut_structure"),
                              ("units", "cut_structure"), ("window", None)):  # fmt: skip
        args = ["--long-docs", long_docs, "--overlap", str(OVERLAP)]
        args += ["--cut-column", column] if column else []
        res = run_cli("stats", "--table", md_table, "--seq-len", str(W), *args, "--json")
        assert res.returncode == 0, res.stderr
        ends = json.loads(res.stdout)["window_ends"]
        assert ends["windows"] == sum(ends[k] for k in ("section", "paragraph", "line", "none"))
        counts[(long_docs, column)] = ends
    assert counts[("window", "cut_points")]["section"] == 0  # line breaks carry no kind
    assert counts[("window", "cut_structure")]["section"] > 0
    assert counts[("window", "cut_structure")]["paragraph"] > 0
    assert (
        counts[("units", "cut_structure")]["section"]
        >= counts[("window", "cut_structure")]["section"]
    )
    assert counts[("window", None)]["none"] == counts[("window", None)]["windows"] > 0
    text = run_cli(
        "stats", "--table", md_table, "--seq-len", str(W), "--long-docs", "units",
        "--cut-column", "cut_structure",
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "end at: section" in text.stdout
    assert set(END_KINDS.values()) == {"none", "line", "paragraph", "section", "end"}


def test_a_mixture_with_a_cut_column_plans(md_table):
    mixture = json.dumps({"md": ["source = 'md'", 3], "py": ["source = 'py'", 1]})
    res = run_cli(
        "stats", "--table", md_table, "--seq-len", str(W), "--long-docs", "units",
        "--overlap", "4", "--cut-column", "cut_structure", "--mixture", mixture,
        "--budget-tokens", "20000", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["epoch"]["steps"] > 0
    assert out["window_ends"]["section"] > 0  # both pools' windows, cut at their structure


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--long-docs", "window", "--cut-column", "nope"], "no column 'nope'"),
        (["--long-docs", "window", "--cut-column", "text"], "not a list of token offsets"),
        (["--long-docs", "units", "--cut-column", "cut_points"], "needs a ranked cut column"),
        (["--long-docs", "units"], "needs a ranked cut column"),
        (["--overlap-loss"], "apply to long_docs='window' only"),
        (["--long-docs", "window", "--overlap-loss"], "overlap=0 has none"),
    ],
)
def test_bad_cut_column_or_recipe_exits_2(md_table, args, message):
    res = run_cli("stats", "--table", md_table, "--seq-len", str(W), *args)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr


def test_overlap_loss_is_in_the_fingerprint_and_the_ledger(md_table):
    plain = Recipe(long_docs="window", overlap=8)
    kept = Recipe(long_docs="window", overlap=8, overlap_loss=True)
    assert "overlap_loss" not in plain.fingerprint_inputs()["recipe"]
    assert kept.fingerprint_inputs()["recipe"]["overlap_loss"] is True
    got = {}
    for flag in ([], ["--overlap-loss"]):
        res = run_cli(
            "ledger", "--table", md_table, "--seq-len", str(W), "--long-docs", "units",
            "--overlap", str(OVERLAP), "--cut-column", "cut_structure", *flag, "--json",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        got[bool(flag)] = json.loads(res.stdout)
    assert got[True]["overlap_loss"] is True and got[False]["overlap_loss"] is False
    before, after = got[False]["total"], got[True]["total"]
    assert before["overlap_tokens"] == after["overlap_tokens"] > 0
    later_windows = after["overlap_tokens"] // OVERLAP
    # each later window trains its overlap's targets again (all but its first token's)
    assert after["loss_positions"] - before["loss_positions"] == later_windows * (OVERLAP - 1)


def test_a_ranked_column_with_unknown_kinds_or_fields_is_refused(tmp_path):
    import pyarrow as pa

    from tests.loader.tables import token_table
    from tokenloom.backfill import add_column, udf

    uri = token_table(tmp_path, ["\n".join(real_paragraphs(30))] * 2)
    bad_kind = pa.list_(pa.struct([("offset", pa.int32()), ("kind", pa.int8())]))
    wrong = pa.list_(pa.struct([("at", pa.int32()), ("rank", pa.int8())]))

    @udf(inputs=["n_tokens"], output=pa.field("cut_bad", bad_kind), version="1")
    def cut_bad(batch):
        return pa.array([[{"offset": 10, "kind": 7}]] * batch.num_rows, type=bad_kind)

    @udf(inputs=["n_tokens"], output=pa.field("cut_wrong", wrong), version="1")
    def cut_wrong(batch):
        return pa.array([[{"at": 10, "rank": 1}]] * batch.num_rows, type=wrong)

    add_column(uri, None, cut_bad, workers=0)
    add_column(uri, None, cut_wrong, workers=0)
    res = run_cli("stats", "--table", uri, "--seq-len", "64", "--long-docs", "window",
                  "--cut-column", "cut_bad")  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "holds kind 7" in res.stderr and "--structure" in res.stderr
    res = run_cli("stats", "--table", uri, "--seq-len", "64", "--long-docs", "window",
                  "--cut-column", "cut_wrong")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "not a list of token offsets" in res.stderr
