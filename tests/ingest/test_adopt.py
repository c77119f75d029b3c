"""``tokenloom adopt``: a Lance dataset (and a LanceDB table) under tokenloom, copied with its text
written once or adopted in place without rewriting a data file; then tokenize, stats and train
work on it. Through real processes, exit status and output asserted."""

from __future__ import annotations

import hashlib
import json
import os

import lance
import pyarrow as pa
import pytest

from tests.conftest import invoke, real_paragraphs, run_cli

BAD = [None, "   \n", ""]  # null, whitespace, empty: rejected, never rows


def _texts() -> list:
    good = real_paragraphs(12)
    return good[:4] + [BAD[0]] + good[4:8] + [BAD[1]] + good[8:] + [BAD[2]]


def _files(uri: str) -> dict[str, tuple[int, str]]:
    """Each data file of a dataset: name -> (size, BLAKE2b)."""
    out = {}
    for name in sorted(os.listdir(os.path.join(uri, "data"))):
        data = open(os.path.join(uri, "data", name), "rb").read()
        out[name] = (len(data), hashlib.blake2b(data, digest_size=20).hexdigest())
    return out


def _write(uri: str, *, large: bool, stable: bool) -> list:
    texts = _texts()
    n = len(texts)
    table = pa.table(
        {
            "key": [f"doc-{i}" for i in range(n)],
            "content": pa.array(texts, pa.large_string() if large else pa.string()),
            "origin": ["web" if i % 2 else "books" for i in range(n)],
            "emb": pa.array([[float(i), 1.0] for i in range(n)], pa.list_(pa.float32(), 2)),
        }
    )
    lance.write_dataset(table, uri, enable_stable_row_ids=stable, max_rows_per_file=6)
    return texts


def _ok(res) -> str:  # noqa: ANN001
    assert res.returncode == 0, res.stderr
    return res.stdout


def _tokenize_and_stats(uri: str, docs: int) -> dict:
    """The adopted table works downstream (in this process: adopt itself ran as a process)."""
    invoke("tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0")
    stats = json.loads(invoke("stats", "--table", uri, "--seq-len", "64", "--json"))
    assert stats["documents"] == docs and stats["tokens"] > docs
    return stats


def test_copy_writes_the_text_once_and_leaves_src_alone(tmp_path):
    src, dst = str(tmp_path / "docs.lance"), str(tmp_path / "corpus.lance")
    texts = _write(src, large=False, stable=False)
    before = _files(src)
    out = _ok(run_cli("adopt", src, "--table", dst, "--text-field", "content",
                      "--source-field", "origin", "--columns", "key"))  # fmt: skip
    assert "(a copy, text written once): 12 rows, 3 rejected" in out
    assert "null_text" in out and "empty_text" in out
    assert _files(src) == before  # SRC only read
    rows = lance.dataset(dst).to_table().to_pylist()
    assert [r["text"] for r in rows] == [t for t in texts if t and t.strip()]
    assert [r["id"] for r in rows] == list(range(12))
    assert {r["source"] for r in rows} == {"web", "books"}
    assert rows[0]["key"] == "doc-0" and json.loads(rows[0]["meta"])["emb"] == [0.0, 1.0]
    rejects = out.split("listed in ")[1].split()[0]
    lines = [json.loads(x) for x in open(rejects, encoding="utf-8")]
    assert sorted((r["reason"], r["row"]) for r in lines) == [
        ("empty_text", 9),
        ("empty_text", 14),
        ("null_text", 4),
    ]
    _tokenize_and_stats(dst, 12)
    again = _ok(run_cli("adopt", src, "--table", dst, "--text-field", "content"))
    assert "adopted before" in again
    assert lance.dataset(dst).count_rows() == 12


def test_in_place_adds_columns_without_rewriting_a_data_file(tmp_path):
    pytest.importorskip("torch")
    src = str(tmp_path / "docs.lance")
    texts = _write(src, large=True, stable=True)
    before = _files(src)
    out = _ok(run_cli("adopt", src, "--in-place", "--text-field", "content", "--json"))
    result = json.loads(out)
    assert result["mode"] == "in_place" and result["rows"] == 12
    assert result["rejected"] == {"empty_text": 2, "null_text": 1}
    after = _files(src)
    assert {k: after[k] for k in before} == before  # every existing data file byte for byte
    added = sum(size for name, (size, _) in after.items() if name not in before)
    assert added == result["bytes_added"] and 0 < added < sum(s for s, _ in before.values())
    ds = lance.dataset(src)
    rows = ds.to_table().to_pylist()
    good = [i for i, t in enumerate(texts) if t and t.strip()]
    assert [r["id"] for r in rows] == good  # ids are physical positions; rejected rows deleted
    assert [r["text"] for r in rows] == [texts[i] for i in good]
    assert all(r["source"] == "docs" and r["n_chars"] == len(r["text"]) for r in rows)
    assert rows[0]["key"] == "doc-0" and rows[0]["emb"] == [0.0, 1.0]  # user columns stay
    assert ds.schema.field("id").metadata[b"tokenloom.next_id"] == str(len(texts)).encode()
    _tokenize_and_stats(src, 12)
    run = str(tmp_path / "run")
    invoke("train", "--table", src, "--out", run, "--model", "tiny", "--seq-len", "32",
           "--global-batch-size", "2", "--steps", "1")  # fmt: skip
    assert os.path.exists(os.path.join(run, "last.json"))


def test_in_place_with_a_source_column_and_a_renamed_text(tmp_path):
    src = str(tmp_path / "docs.lance")
    _write(src, large=True, stable=True)
    out = _ok(run_cli("adopt", src, "--in-place", "--text-field", "content",
                      "--source-field", "origin"))  # fmt: skip
    assert "12 rows, 3 rejected" in out and "no existing data file rewritten" in out
    ds = lance.dataset(src)
    assert "content" not in ds.schema.names and ds.schema.field("text").type == pa.large_string()
    assert set(ds.to_table(columns=["source"]).column(0).to_pylist()) == {"web", "books"}
    res = run_cli("adopt", src, "--in-place", "--text-field", "text")
    assert res.returncode == 1
    assert "it is already a tokenloom table" in res.stderr


def test_in_place_keeps_ids_of_rows_deleted_before(tmp_path):
    src = str(tmp_path / "docs.lance")
    texts = _write(src, large=True, stable=True)
    lance.dataset(src).delete("key IN ('doc-1', 'doc-7')")
    out = json.loads(_ok(run_cli("adopt", src, "--in-place", "--text-field", "content",
                                 "--source-field", "key", "--json")))  # fmt: skip
    assert out["rejected"] == {"empty_text": 2, "null_text": 1} and out["rows"] == 10
    rows = lance.dataset(src).to_table(columns=["id", "source"]).to_pylist()
    good = [i for i, t in enumerate(texts) if t and t.strip() and i not in (1, 7)]
    assert [(r["id"], r["source"]) for r in rows] == [(i, f"doc-{i}") for i in good]


def test_in_place_refused_names_each_requirement_and_writes_nothing(tmp_path):
    src = str(tmp_path / "docs.lance")
    _write(src, large=False, stable=False)
    before, version = _files(src), lance.dataset(src).version
    res = run_cli("adopt", src, "--in-place", "--text-field", "content")
    assert res.returncode == 1
    assert "created without stable row ids" in res.stderr
    assert "'content' is string, not large_string" in res.stderr
    assert f"tokenloom adopt {src} --table NEW.lance --text-field content" in res.stderr
    assert _files(src) == before and lance.dataset(src).version == version
    empty = str(tmp_path / "empty.lance")
    lance.write_dataset(pa.table({"text": pa.array([], pa.large_string())}), empty)
    res = run_cli("adopt", empty, "--in-place")
    assert res.returncode == 1 and "holds no rows" in res.stderr
    res = run_cli("adopt", "s3://bucket/docs.lance", "--table", str(tmp_path / "t.lance"))
    assert res.returncode == 2 and "not a local folder" in res.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--in-place", "--table", "elsewhere.lance"], "drop --table"),
        ([], "--table is required"),
        (["--table", "SRC"], "is SRC itself"),
        (["--in-place", "--columns", "key"], "--columns applies to a copy"),
        (["--table", "x.lance", "--source-field", "nope"], "SRC has no column 'nope'"),
    ],
)
def test_usage_errors(tmp_path, args, named):
    src = str(tmp_path / "docs.lance")
    _write(src, large=True, stable=True)
    res = run_cli("adopt", src, *[src if a == "SRC" else a for a in args])
    assert res.returncode == 2 and named in res.stderr
    res = run_cli("adopt", str(tmp_path / "none"), "--table", str(tmp_path / "t.lance"))
    assert (
        res.returncode == 2 and "'SRC'" in res.stderr and "not the folder of a Lance" in res.stderr
    )


def test_lancedb_table(tmp_path):
    lancedb = pytest.importorskip("lancedb")
    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table("docs", pa.table({"text": real_paragraphs(5) + [None]}))
    src = str(tmp_path / "db" / "docs.lance")
    out = _ok(run_cli("adopt", src, "--table", str(tmp_path / "corpus.lance")))
    assert "5 rows, 1 rejected" in out
    _tokenize_and_stats(str(tmp_path / "corpus.lance"), 5)
