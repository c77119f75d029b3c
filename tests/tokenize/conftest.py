"""Fixtures of the tokenizer tests: the bundled real corpus (built once), GPT-2, a trained BPE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tokenloom.corpus import build_corpus
from tokenloom.tokenize import Tokenizer, load_tokenizer, train_bpe


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """The bundled corpus, read into memory in sorted file order."""

    texts: list[str]
    sources: np.ndarray

    def of(self, source: str, n: int | None = None) -> list[str]:
        """The first ``n`` texts of one source."""
        picked = [t for t, s in zip(self.texts, self.sources, strict=True) if s == source]
        return picked[:n]

    def mixed(self, per_source: int) -> list[str]:
        """The first ``per_source`` texts of every source, in source order."""
        return [t for s in sorted(set(self.sources)) for t in self.of(str(s), per_source)]

    def pick(self, **sizes: int) -> list[str]:
        """The first ``n`` texts of each named source, e.g. ``pick(wiki_es=10, kjv=2)``."""
        return [t for source, n in sizes.items() for t in self.of(source, n)]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(out)
    texts: list[str] = []
    sources: list[str] = []
    for path in sorted(Path(out).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            texts.append(record["text"])
            sources.append(record["source"])
    return Corpus(texts=texts, sources=np.array(sources))


@pytest.fixture(scope="session")
def gpt2() -> Tokenizer:
    return load_tokenizer("gpt2")


@pytest.fixture(scope="session")
def bpe_texts(corpus: Corpus) -> list[str]:
    """A small real training set: wiki in three languages, KJV, code and one play."""
    return corpus.pick(
        wiki_en=100, wiki_es=100, wiki_fr=100, kjv=20, python_stdlib=20, shakespeare_folio=1
    )


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory, bpe_texts: list[str]) -> Path:
    out = tmp_path_factory.mktemp("bpe")
    train_bpe(bpe_texts, vocab_size=1000, out_dir=out)
    return out
