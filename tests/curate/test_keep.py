"""``dedup --near --keep``: which member of a near-duplicate cluster is kept, recorded so that
``refresh`` applies the same policy to appended rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import run_cli, write_jsonl
from tokenloom.cli.main import cli
from tokenloom.curate.inputs import CurateError
from tokenloom.curate.keep import KeepPolicy, keep_representatives, keep_representatives_naive
from tokenloom.ingest import ingest
from tokenloom.table import Table


def _near(uri: str) -> dict[int, tuple[int, bool]]:
    data = Table.open(uri).dataset.to_table(columns=["id", "near_dup_cluster", "is_near_dup"])
    return {r["id"]: (r["near_dup_cluster"], r["is_near_dup"]) for r in data.to_pylist()}


def _dedup(uri: str, *args: str) -> dict:
    out = CliRunner().invoke(cli, ["dedup", "--table", uri, "--near", "--workers", "0", *args])
    assert out.exit_code == 0, out.output
    return _near(uri)


def _cut(text: str, share: float) -> str:
    words = text.split()
    return " ".join(words[: int(len(words) * share)])


def test_keep_policies_choose_the_kept_member_and_refresh_reuses_the_policy(tmp_path, long_wiki):
    a, b, extra = long_wiki[0], long_wiki[1], long_wiki[2]
    others = [{"text": t, "source": "wiki_en"} for t in long_wiki[3:13]]
    cluster = [
        {"text": _cut(a, 0.85), "source": "mirror"},  # id 0: the first, shortest
        {"text": a, "source": "wiki_en"},  # id 1
        {"text": a + " " + _cut(extra, 0.2), "source": "web"},  # id 2: the longest
    ]
    write_jsonl(tmp_path / "a.jsonl", cluster + others)
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)

    first = _dedup(uri)  # the default: the smallest id
    assert [first[i] for i in range(3)] == [(0, False), (0, True), (0, True)]
    assert all(first[i] == (i, False) for i in range(3, 13))

    # another policy on existing columns is refused, naming --recompute (a real exit status)
    out = run_cli("dedup", "--table", uri, "--near", "--workers", "0", "--keep", "longest")
    assert out.returncode == 1 and "--recompute" in out.stderr and "--keep first" in out.stderr
    longest = _dedup(uri, "--keep", "longest", "--recompute")
    assert [longest[i] for i in range(3)] == [(2, True), (2, True), (2, False)]

    by_source = _dedup(uri, "--keep", "source-priority:wiki_en,web", "--recompute")
    assert [by_source[i] for i in range(3)] == [(1, True), (1, False), (1, True)]
    made = Table.open(uri).schema().field("near_dup_cluster").metadata[b"tokenloom.udf"]
    assert json.loads(made)["kwargs"]["keep"] == "source-priority:wiki_en,web"

    # appended: a new pair, the web copy first; refresh keeps the wiki_en one, as recorded
    write_jsonl(
        tmp_path / "b.jsonl",
        [{"text": b, "source": "web"}, {"text": _cut(b, 0.9), "source": "wiki_en"}],
    )
    ingest([tmp_path / "b.jsonl"], uri, progress=False)
    out = run_cli("refresh", "--table", uri, "--workers", "0")
    assert out.returncode == 0, out.stderr
    assert "--keep source-priority:wiki_en,web" in out.stdout
    after = _near(uri)
    assert after[13] == (14, True) and after[14] == (14, False)
    assert all(after[i] == by_source[i] for i in range(13))  # earlier decisions stand


def test_bad_keep_values_are_usage_errors(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "one document of a few words"}])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    out = run_cli("dedup", "--table", uri, "--near", "--keep", "source-priority:")
    assert out.returncode == 1 and "source-priority needs its sources" in out.stderr
    out = run_cli("dedup", "--table", uri, "--keep", "longest")
    assert out.returncode == 2 and "pass it with --near" in out.stderr
    for keep, says in [
        ("shortest", "is not one of first, longest"),
        ("source-priority:a,a", "names a source twice"),
        ("longest:a", "only it takes a list"),
    ]:
        out = run_cli("dedup", "--table", uri, "--near", "--keep", keep)
        assert out.returncode == 1 and says in out.stderr, (keep, out.stderr)
    assert "is_near_dup" not in Table.open(uri).schema().names  # nothing was computed
    with pytest.raises(CurateError, match="not one of"):
        KeepPolicy.parse("shortest")


def test_fast_choice_matches_the_reference():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 200))
        ids = rng.permutation(10 * n)[:n].astype(np.int64)
        labels = rng.integers(0, max(1, n // 4), n)
        pref = rng.integers(-3, 3, n)
        before = rng.random(n) < 0.1
        for kept in (None, before):
            got = keep_representatives(labels, ids, pref, kept)
            assert np.array_equal(got, keep_representatives_naive(labels, ids, pref, kept))
