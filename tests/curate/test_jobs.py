"""Curation jobs on a real table: planted duplicates, Shakespeare editions, junk, increments."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.conftest import run_cli, write_jsonl
from tokenloom.cli.main import cli
from tokenloom.curate.jobs import dedup_exact, dedup_near, score_quality
from tokenloom.ingest import ingest
from tokenloom.table import Table


def _rows(uri, columns, filter=None):
    t = Table.open(uri).dataset.to_table(columns=["id", *columns], filter=filter)
    return {r["id"]: r for r in t.to_pylist()}


def test_exact_dedup_finds_planted_copies_keeping_the_smallest_id(tmp_path, wiki):
    docs = [r["text"] for r in wiki[:40]]
    # Plant copies: exact, with different whitespace, and NFD vs NFC accents.
    planted = [
        docs[3],
        "  " + docs[3].replace(" ", "   ") + "\n",
        docs[10],
        "Caf\u0065\u0301 " + docs[11],
        "Caf\u00e9 " + docs[11],
    ]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in docs + planted])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    result = dedup_exact(uri, workers=0)
    rows = _rows(uri, ["is_dup", "dup_of"])
    flagged = {i: r["dup_of"] for i, r in rows.items() if r["is_dup"]}
    assert flagged == {40: 3, 41: 3, 42: 10, 44: 43}
    assert all(r["dup_of"] == i for i, r in rows.items() if not r["is_dup"])
    assert result.flagged == 4 and result.groups == 3 and len(result.versions) == 2

    # Incremental: a later copy of an old row is flagged; old flags do not move.
    write_jsonl(tmp_path / "b.jsonl", [{"text": docs[0]}, {"text": "A new, unique document."}])
    ingest([tmp_path / "b.jsonl"], uri, progress=False)
    dedup_exact(uri, workers=0)
    rows = _rows(uri, ["is_dup", "dup_of"])
    assert rows[45]["is_dup"] and rows[45]["dup_of"] == 0 and not rows[46]["is_dup"]
    assert Table.open(uri).count_rows("is_dup") == 5


def test_near_dedup_clusters_the_two_shakespeare_editions(tmp_path, plays, wiki):
    works = {}
    for r in plays:
        works.setdefault(r["work"], []).append(r)
    pairs = [v for v in works.values() if len(v) == 2][:6]
    records = [
        {"text": r["text"], "source": r["source"], "work": r["work"]}
        for pair in pairs
        for r in pair
    ]
    records += [{"text": r["text"], "source": "wiki_en"} for r in wiki[:30]]
    write_jsonl(tmp_path / "a.jsonl", records)
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    dedup_near(uri, workers=2)
    rows = _rows(uri, ["near_dup_cluster", "is_near_dup", "meta"])
    work = {i: json.loads(r["meta"]).get("work") for i, r in rows.items()}
    clusters = {}
    for i, r in rows.items():
        clusters.setdefault(r["near_dup_cluster"], []).append(i)
    multi = [sorted(m) for m in clusters.values() if len(m) > 1]
    # precision: every cluster is one play's two editions; recall here: all but Cymbeline's pair
    assert all(len({work[i] for i in m}) == 1 and work[m[0]] for m in multi)
    expected = sum(1 for p in pairs if p[0]["work"] != "cymbeline")
    assert len(multi) >= expected
    assert sum(r["is_near_dup"] for r in rows.values()) == len(multi)

    # A stricter threshold can only split clusters (monotone), after an explicit recompute.
    dedup_near(uri, workers=0, threshold=0.9, recompute=True)
    strict = _rows(uri, ["is_near_dup"])
    assert sum(r["is_near_dup"] for r in strict.values()) <= len(multi)


def test_quality_reasons_for_planted_junk(tmp_path, wiki):
    good = [r["text"] for r in wiki if len(r["text"].split()) > 120][:5]
    junk = [
        "\n".join(["Buy now!!! Click here"] * 30),
        "\n".join(f"• item {i} • more • stuff" for i in range(40)),
        "#### $$$ %%% &&& *** @@@ " * 40,
        "\n".join(f"and so it went on {i}..." for i in range(30)),
        "Too short.",
    ]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in good + junk])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    result = score_quality(uri, workers=0)
    rows = _rows(uri, ["quality", "quality_reasons"])
    for i in range(5):
        assert rows[i]["quality"] == 1.0, rows[i]["quality_reasons"]
    for i in range(5, 10):
        assert rows[i]["quality"] < 1.0 and rows[i]["quality_reasons"], i
    assert result.flagged == 5
    assert Table.open(uri).count_rows("quality >= 1.0") == 5


def test_dedup_and_score_cli(tmp_path, wiki):
    write_jsonl(
        tmp_path / "a.jsonl", [{"text": r["text"]} for r in wiki[:20]] + [{"text": wiki[0]["text"]}]
    )
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    out = CliRunner().invoke(cli, ["dedup", "--table", uri, "--workers", "0", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["flagged"] == 1
    out = CliRunner().invoke(cli, ["score", "--table", uri, "--workers", "0"])
    assert out.exit_code == 0 and "pass every rule" in out.output


def test_dedup_json_counts_rows_and_flags_per_source(tmp_path, paragraphs):
    docs = paragraphs[:12]
    # Source a: 6 distinct + 2 copies of its own rows; source b: 4 distinct + 1 copy of a's row 0.
    recs = [{"text": t, "source": "a"} for t in docs[:6]]
    recs += [{"text": docs[0], "source": "a"}, {"text": docs[1], "source": "a"}]
    recs += [{"text": t, "source": "b"} for t in docs[6:10]] + [{"text": docs[0], "source": "b"}]
    write_jsonl(tmp_path / "a.jsonl", recs)
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    proc = run_cli("--quiet", "dedup", "--table", uri, "--workers", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["by_source"] == {"a": {"rows": 8, "flagged": 2}, "b": {"rows": 5, "flagged": 1}}
    assert out["flagged"] == 3
    proc = run_cli("--quiet", "dedup", "--table", uri, "--near", "--workers", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    near = json.loads(proc.stdout)["by_source"]
    assert near == {"a": {"rows": 8, "flagged": 2}, "b": {"rows": 5, "flagged": 1}}
