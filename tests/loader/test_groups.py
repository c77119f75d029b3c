"""Related rows as one document (``GroupSpec``): layout, order, markers, BOS, ledger, verify,
trace, resume and the CLI, on real standard-library packages and real prose."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import invoke, real_paragraphs, run_cli, write_jsonl
from tokenloom.cli.main import cli
from tokenloom.ingest import ingest
from tokenloom.loader import DataLoader, LoaderSpec, PackedDataset, ledger
from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.files import MARKER, Files, import_order
from tokenloom.loader.plan.spec import GroupSpec
from tokenloom.loader.plan.state import LoaderState
from tokenloom.tokenize import load_tokenizer, train_bpe

PACKAGES = ("json", "tomllib", "zoneinfo")
MARK = "<|file|> {name}\n"


def _package_rows() -> list[dict]:
    import json as json_mod

    rows = []
    for name in PACKAGES:
        folder = Path(json_mod.__file__).parent.parent / name
        for path in sorted(folder.glob("*.py")):
            rel = f"{name}/{path.name}"
            rows.append({"text": path.read_text(), "source": "code", "unit": name, "path": rel})
    return rows


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    """Three stdlib packages (code grouped by package, in import order) and real prose in
    five "books" of chapters, tokenized by a small byte-level BPE whose config names a BOS
    (input_ids, with ranked structure cut points) and by GPT-2, which has none (input_ids_gpt2)."""
    tmp = tmp_path_factory.mktemp("groups")
    paras = real_paragraphs(60)
    prose = [
        {"text": p, "source": "prose", "unit": f"book{i % 5}", "path": f"book{i % 5}/{i:02d}"}
        for i, p in enumerate(paras)
    ]
    records = _package_rows() + prose
    records.insert(
        3, {"text": "import json\n", "source": "code", "unit": "solo", "path": "solo.py"}
    )
    write_jsonl(tmp / "docs.jsonl", records)
    uri = str(tmp / "t.lance")
    ingest([tmp / "docs.jsonl"], uri, progress=False, columns="unit:string,path:string")
    bpe = tmp / "bpe"
    train_bpe([r["text"] for r in records], vocab_size=600, out_dir=bpe)
    config = json.loads((bpe / "tokenizer_config.json").read_text())
    (bpe / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|endoftext|>"}))
    runner = CliRunner()
    for args in (
        ["--tokenizer", str(bpe), "--structure"],
        ["--tokenizer", "gpt2", "--column", "input_ids_gpt2"],
    ):
        out = runner.invoke(cli, ["tokenize", "--table", uri, "--workers", "0", *args])
        assert out.exit_code == 0, out.output
    return uri


def _spec(table: str, **kw) -> LoaderSpec:
    group = {"key": "unit", "order": "imports", "marker": MARK, "bos": True}
    options = {"seq_len": 128, "global_batch": 4, "seed": 3, "group": group, **kw}
    return LoaderSpec.from_options(table=table, **options)


def _epoch(ds: PackedDataset, epoch: int = 0) -> list[dict]:
    ds.load_state_dict(LoaderState.create(epoch=epoch, step=0, inputs=ds.plan_inputs()).to_dict())
    return [{k: np.asarray(v) for k, v in b.items()} for b in DataLoader(ds, num_workers=0)]


@pytest.fixture(scope="module")
def grouped(table) -> PackedDataset:
    return PackedDataset(_spec(table, block_order="sequential"))


# -- the layout, pure -------------------------------------------------------------------------


def test_unfold_equals_a_naive_walk():
    rng = np.random.default_rng(0)
    R = 40
    n = rng.integers(0, 9, R)
    plen = rng.integers(0, 3, R)
    gptr = np.concatenate([[0], np.sort(rng.choice(np.arange(1, R), 9, replace=False)), [R]])
    pptr = np.concatenate([[0], np.cumsum(plen)])
    files = Files(rows=np.arange(100, 100 + R), at=np.arange(R), gptr=gptr, n_tokens=n,
                  pptr=pptr, prefix=np.arange(1000, 1000 + pptr[-1]))  # fmt: skip
    docs = []  # each group's tokens: (kind, member, index) per token
    for g in range(files.groups):
        doc = []
        for m in range(gptr[g], gptr[g + 1]):
            doc += [(MARKER, m, i) for i in range(plen[m])] + [(0, m, i) for i in range(n[m])]
        docs.append(doc)
    assert [len(d) for d in docs] == files.lengths.tolist()
    groups, starts, stops = [], [], []
    for _ in range(200):
        g = int(rng.integers(0, files.groups))
        a = int(rng.integers(0, len(docs[g]) + 1))
        groups.append(g), starts.append(a), stops.append(int(rng.integers(a, len(docs[g]) + 1)))
    p = files.unfold(np.array(groups), np.array(starts), np.array(stops))
    got = [[] for _ in groups]
    for k in range(len(p)):
        got[p.stretch[k]] += [
            (int(p.kind[k]), int(p.member[k]), i) for i in range(p.lo[k], p.hi[k])
        ]
        assert docs[groups[p.stretch[k]]][p.at[k]][:2] == (p.kind[k], p.member[k])
    assert got == [docs[g][a:b] for g, a, b in zip(groups, starts, stops, strict=True)]
    counts = files.marker_counts(np.array(groups), np.array(starts), np.array(stops))
    assert counts.tolist() == [sum(k == MARKER for k, *_ in docs[g][a:b])
                               for g, a, b in zip(groups, starts, stops, strict=True)]  # fmt: skip


def test_import_order_puts_imports_first_and_breaks_a_cycle():
    paths = ["pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/d.py", "pkg/e.py"]
    texts = [
        "from .a import x\n",  # the package needs a (the attribute x is no module)
        "from . import b\nimport pkg.c\n",  # a needs b and c
        "from .a import y\n",  # b needs a: a cycle a <-> b
        "x = 1\n",
        "this is not python (\n",  # a parse error: no imports known
        "from pkg import d\nimport os\n",  # e needs d (os is not in the group)
    ]
    order = [paths[i] for i in import_order(paths, texts)]
    # c, d free, e once d is placed; then only the cycle a <-> b is left: broken at its
    # smallest path (a), after which the package and b are free (in path order)
    assert order == ["pkg/c.py", "pkg/d.py", "pkg/e.py", "pkg/a.py", "pkg/__init__.py", "pkg/b.py"]


def test_group_spec_refusals():
    with pytest.raises(PlanError, match="pass a key"):
        GroupSpec(order="path")
    with pytest.raises(PlanError, match="not a column name"):
        GroupSpec(key="unit", marker="<|file|> {0}")
    with pytest.raises(PlanError, match="not combined with mixture"):
        LoaderSpec(table="t", group={"key": "unit"}, mixture={"a": ["true", 1]})


# -- on the table -----------------------------------------------------------------------------


def _stream(ds: PackedDataset, epoch: int) -> list[int]:
    """The groups in the order the epoch's blocks visit them (each once)."""
    seen: list[int] = []
    for b in _epoch(ds, epoch):
        for g in b["spans"][:, 2].tolist():
            if not seen or seen[-1] != g:
                seen.append(g)
    return seen


def test_a_group_is_one_document_in_the_naive_layout(grouped, table):
    """Concat packing of the groups, in the plan's order, equals the naive layout: every group
    = BOS, then each file's marker and its stored tokens in import (or path) order, then one
    EOS; the stream cut into blocks of L."""
    files, tok = grouped.planner.files, load_tokenizer(grouped.inputs.tokenizer["name"])
    order = _stream(grouped, 0)
    assert sorted(order) == list(range(files.groups))  # each group once, contiguous
    from tokenloom.table import Table
    from tokenloom.table.tokens import as_token_lists

    t = Table.open(table).dataset.to_table(columns=["id", "path", "input_ids"])
    lists = as_token_lists(t.column("input_ids"), t.schema.field("input_ids")).to_pylist()
    stored = dict(zip(t.column("id").to_pylist(), lists, strict=True))
    path = dict(zip(t.column("id").to_pylist(), t.column("path").to_pylist(), strict=True))
    stream: list[int] = []
    for g in order:
        for k, m in enumerate(range(files.gptr[g], files.gptr[g + 1])):
            rid = int(files.rows[m])
            bos = [tok.bos_id] if k == 0 else []
            stream += bos + tok.encode(MARK.format(name=path[rid])) + stored[rid]
        stream.append(grouped.eos_id)
    batches = _epoch(grouped, 0)
    got = np.concatenate([b["input_ids"].reshape(-1) for b in batches])
    L = grouped.seq_len
    assert got[: len(stream)].tolist() == stream
    assert (got[len(stream) :] == grouped.pad_id).all() and len(got) - len(stream) < 4 * L
    # the json package in import order: scanner before decoder before the package
    json_g = next(
        g for g in range(files.groups) if path[int(files.rows[files.gptr[g]])].startswith("json/")
    )
    names = [path[int(r)] for r in files.rows[files.gptr[json_g] : files.gptr[json_g + 1]]]
    assert (
        names.index("json/scanner.py")
        < names.index("json/decoder.py")
        < names.index("json/__init__.py")
    )
    # one segment per group: a block's doc_ids change only where a group ends
    for b in batches:
        for row_spans in [b["spans"][b["spans"][:, 0] == i] for i in range(len(b["input_ids"]))]:
            assert len(set(row_spans[:, 2].tolist())) == len(row_spans)


def test_groups_shuffle_as_units_across_epochs_and_seeds(grouped, table):
    first, second = _stream(grouped, 0), _stream(grouped, 1)
    other = _stream(PackedDataset(_spec(table, seed=4, block_order="sequential")), 0)
    assert sorted(first) == sorted(second) == sorted(other)
    assert first != second and first != other


def test_ledger_counts_markers_apart(grouped):
    files = grouped.planner.files
    led = ledger(grouped.planner).pools[0]
    assert led.marker_tokens == files.prefix_tokens == int(np.diff(files.pptr).sum())
    assert led.body_tokens == int(files.n_tokens.sum())
    assert led.separator_tokens == led.unique_documents == files.groups


def test_bos_refused_when_the_tokenizer_has_none(table):
    from tokenloom.loader.pipeline.read import LoaderError

    with pytest.raises(LoaderError, match="defines no BOS token"):
        PackedDataset(_spec(table, token_column="input_ids_gpt2"))


def test_null_or_missing_key_is_refused(table):
    from tokenloom.loader.pipeline.read import LoaderError

    with pytest.raises(LoaderError, match="does not hold"):
        PackedDataset(_spec(table, group={"key": "package"}))


def test_units_with_groups_verify_resume_and_a_corrupted_marker(table):
    """Long groups in units cut at file edges and structure; verify's six checks pass (resume
    mid-epoch included) and a marker changed in a batch is found."""
    from tokenloom.verify import verify
    from tokenloom.verify.sample import read_sample
    from tokenloom.verify.text import marker_problem

    spec = _spec(table, long_docs="units", window=128, overlap=16, cut_column="cut_structure")
    report = verify(spec, steps=3)
    assert report.passed, [c for c in report.checks if not c.passed]
    sample = read_sample(spec, steps=2)
    assert marker_problem(sample) is None
    batch = sample.batches[0]
    sp = batch.arrays["spans"]
    p = sample.files.unfold(sp[:, 2], sp[:, 3], sp[:, 4])
    k = int(np.flatnonzero(p.kind == MARKER)[0])
    at = sp[p.stretch[k], 1] + p.at[k] - sp[p.stretch[k], 3]
    batch.arrays["input_ids"][sp[p.stretch[k], 0], at] += 1
    assert "prefix (file marker or BOS) of row" in marker_problem(sample)


@pytest.mark.slow  # three subprocesses (train imports torch): scheduled first
def test_cli_train_trace_and_refusal(table, tmp_path):
    out = str(tmp_path / "run")
    common = ["train", "--table", table, "--model", "tiny", "--seq-len", "64",
              "--global-batch-size", "2", "--steps", "2", "--log-every", "1",
              "--block-order", "sequential", "--group-by", "unit", "--group-order", "imports",
              "--file-marker", MARK, "--bos"]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1"}
    invoke(*common, "--out", out)  # the steps it builds on, in this process
    rows = json.loads(invoke("trace", "--run", out, "--step", "1", "--json"))["rows"]
    assert {r["kind"] for r in rows} <= {"tokens", "marker"} and rows[0]["kind"] == "marker"
    assert all(r["file"] for r in rows)
    first = rows[0]
    assert first["file"] in first["snippet"]  # the marker names its file
    refused = run_cli(*common[:-1], "--bos", "--column", "input_ids_gpt2", "--out",
                      os.path.join(tmp_path, "gpt2"), env=env)  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "defines no BOS token" in refused.stderr
