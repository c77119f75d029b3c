"""After an append: ``info`` shows coverage, planning commands refuse, ``refresh`` fills it in."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.backfill import add_column, udf
from tokenloom.backfill.builtin import n_words
from tokenloom.curate.jobs import dedup_exact, score_quality
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.tokenize.column import tokenize_table

ROOT = Path(__file__).resolve().parents[2]


_run = run_cli


def _curate(uri: str) -> None:
    dedup_exact(uri, workers=0, progress=False)
    score_quality(uri, workers=0, progress=False)
    tokenize_table(uri, "gpt2", workers=0, roundtrip_sample=0)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    paras = real_paragraphs(60)
    return paras[:40] + paras[40:60] + paras[:5]  # the last 5 repeat earlier rows


@pytest.fixture
def appended(tmp_path: Path, texts: list[str]) -> str:
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:40]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in texts[40:]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    _curate(uri)
    ingest([tmp_path / "b.jsonl"], uri, progress=False)
    return uri


def test_info_shows_how_many_rows_each_column_covers(appended: str) -> None:
    out = _run("info", "--table", appended, "--json")
    assert out.returncode == 0, out.stderr
    cov = {c["name"]: c["rows_computed"] for c in json.loads(out.stdout)["columns"]}
    assert cov["text"] == 65 and cov["n_tokens"] == cov["quality"] == cov["is_dup"] == 40
    text = _run("info", "--table", appended).stdout
    assert "40/65 rows" in text and f"tokenloom refresh --table {appended}" in text


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["ledger"],
        ["verify"],
        ["stats", "--filter", "quality >= 0.5"],
        ["train", "--steps", "1", "--model", "tiny", "--seq-len", "32"],
    ],
)
def test_planning_commands_refuse_rows_a_used_column_does_not_cover(
    appended: str, tmp_path: Path, command: list[str]
) -> None:
    extra = ["--out", str(tmp_path / "run")] if command[0] == "train" else []
    out = _run(*command, "--table", appended, *extra)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert f"tokenloom refresh --table {appended}" in out.stderr
    if "--filter" in command:
        assert "'quality' is not computed for them" in out.stderr
        assert "cannot decide 25 rows" in out.stderr
    else:
        assert "'n_tokens' is not computed for 25 of the 65 selected rows" in out.stderr


def test_allow_missing_plans_them_as_empty_with_a_warning(appended: str) -> None:
    out = _run("stats", "--table", appended, "--allow-missing", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["documents"] == 65
    assert "25 selected rows have no 'n_tokens'" in out.stderr


def test_refresh_computes_what_a_full_run_computes(
    appended: str, tmp_path: Path, texts: list[str]
) -> None:
    out = _run("refresh", "--table", appended, "--workers", "0", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert {s["job"].split()[0] for s in res["steps"]} == {"dedup", "score", "tokenize"}
    assert all(s["rows_missing"] == 25 for s in res["steps"]) and res["not_refreshable"] == {}
    write_jsonl(tmp_path / "all.jsonl", [{"text": t} for t in texts])
    full = str(tmp_path / "full.lance")
    ingest([tmp_path / "all.jsonl"], full, progress=False)
    _curate(full)
    cols = ["id", "is_dup", "dup_of", "quality", "n_tokens", "input_ids"]
    got = Table.open(appended).dataset.to_table(columns=cols).sort_by("id")
    want = Table.open(full).dataset.to_table(columns=cols).sort_by("id")
    assert got.equals(want)
    assert sum(got.column("is_dup").to_pylist()) == 5
    stats = _run("stats", "--table", appended, "--filter", "NOT is_dup", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["documents"] == 60
    again = _run("refresh", "--table", appended, "--workers", "0")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_refresh_names_a_column_no_recorded_udf_can_fill(tmp_path: Path) -> None:
    @udf(inputs=["text"], output=pa.field("n_a", pa.int64()), version="1")
    def n_a(batch):  # defined in a function: nothing to load it from later
        return pa.array([t.count("a") for t in batch.column("text").to_pylist()])

    write_jsonl(tmp_path / "a.jsonl", [{"text": "banana"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "apple"}])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    add_column(uri, "n_a", n_a, workers=0, progress=False)
    add_column(uri, "words", n_words, workers=0, progress=False)  # importable: refreshed
    ingest([tmp_path / "b.jsonl"], uri, progress=False)
    out = _run("refresh", "--table", uri, "--workers", "0")
    assert out.returncode == 1
    assert "n_a (1 rows)" in out.stderr and uri in out.stderr
    assert "backfill run --udf tokenloom.backfill.builtin:n_words: words for 1 rows" in out.stdout
    assert Table.open(uri).dataset.to_table(columns=["words"]).column(0).to_pylist() == [1, 1]


def test_score_json_has_per_rule_and_per_source_counts(tmp_path: Path, texts: list[str]) -> None:
    write_jsonl(
        tmp_path / "a.jsonl", [{"text": t, "source": f"s{i % 2}"} for i, t in enumerate(texts)]
    )
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    out = _run("score", "--table", uri, "--workers", "0", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert sum(s["rows"] for s in res["by_source"].values()) == res["rows"] == 65
    assert sum(s["pass"] for s in res["by_source"].values()) == res["rows"] - res["flagged"]
    ds = Table.open(uri).dataset
    for rule, n in res["by_rule"].items():
        assert n == ds.count_rows(filter=f"array_has(quality_reasons, '{rule}')")
