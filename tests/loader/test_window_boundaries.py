"""Windows of long documents end at line breaks the text offers (a stored cut_points column)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs, write_jsonl  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.loader import PackedDataset, ResumeMismatchError  # noqa: E402
from tokenloom.table import Table  # noqa: E402
from tokenloom.tokenize import load_tokenizer  # noqa: E402

W, OVERLAP = 64, 8


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuts")
    paras = real_paragraphs(120)
    docs = ["\n\n".join(paras[i : i + 12]) for i in range(0, 120, 12)]  # long, with line breaks
    write_jsonl(tmp / "a.jsonl", [{"text": d} for d in docs])
    uri = str(tmp / "t.lance")
    ingest([tmp / "a.jsonl"], uri, progress=False)
    out = CliRunner().invoke(
        cli,
        [
            "tokenize",
            "--table",
            uri,
            "--tokenizer",
            "gpt2",
            "--workers",
            "0",
            "--boundaries",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["boundaries"]["column"] == "cut_points"
    return uri


def test_cut_points_are_line_ends(table):
    tok = load_tokenizer("gpt2")
    rows = Table.open(table).dataset.to_table(columns=["input_ids", "cut_points"]).to_pylist()
    for r in rows:
        assert r["cut_points"], "every document here has line breaks"
        for c in r["cut_points"]:
            assert tok.decode(r["input_ids"][c - 1 : c]).endswith("\n")


def test_windows_end_at_line_breaks_within_the_slack(table):
    tok = load_tokenizer("gpt2")
    ids = {
        r["id"]: r["input_ids"]
        for r in Table.open(table).dataset.to_table(columns=["id", "input_ids"]).to_pylist()
    }
    ds = PackedDataset(
        table,
        seq_len=W,
        global_batch=2,
        long_docs="window",
        window=W,
        overlap=OVERLAP,
        cut_column="cut_points",
        block_order="sequential",
    )
    plan = ds.plan()
    v = plan.docs
    snapped = hard = 0
    for i in range(len(v.tok_start)):
        if v.has_eos[i]:
            continue  # a document's last window ends with its EOS
        rid, s, e = int(v.row_id[i]), int(v.tok_start[i]), int(v.tok_end[i])
        toks = ids[rid]
        if tok.decode(toks[e - 1 : e]).endswith("\n"):
            snapped += 1
        else:  # no line break in the window's last eighth: cut at the hard limit
            hard += 1
            assert e - s == W
            assert not any(
                tok.decode(toks[c - 1 : c]).endswith("\n")
                for c in range(max(s + OVERLAP, s + W - W // 8) + 1, s + W + 1)
            )
    assert snapped > 0
    # every token is still new in exactly one window
    batches = list(ds)
    new = sum(
        e - s - (c1 - c0)
        for b in batches
        for (_b, _p, _r, s, e), (c0, c1) in zip(
            b["spans"].tolist(), b["context"].tolist(), strict=True
        )
    )
    assert new == sum(len(t) for t in ids.values())
    plain = PackedDataset(
        table,
        seq_len=W,
        global_batch=2,
        long_docs="window",
        window=W,
        overlap=OVERLAP,
        block_order="sequential",
    )
    with pytest.raises(ResumeMismatchError, match="cut_column"):
        plain.load_state_dict(ds.state_dict())
