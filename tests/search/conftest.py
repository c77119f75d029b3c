"""A small real table, ingested, embedded and indexed once per session (the model is the cost)."""

from __future__ import annotations

import pytest

from tests.conftest import real_paragraphs, write_jsonl

#: A sentence no docstring contains, planted in one row.
PLANTED = "The zebra quartermaster polished seventeen brass telescopes before the harbour dawn."
SOURCES = ("os_docs", "shell_docs", "text_docs")


def records(n: int = 150, offset: int = 0) -> list[dict]:
    """Real paragraphs with three sources (row i gets ``SOURCES[i % 3]``)."""
    paras = real_paragraphs(offset + n)[offset:]
    return [{"text": p, "source": SOURCES[i % 3]} for i, p in enumerate(paras)]


def build(tmp, recs: list[dict], name: str = "t.lance") -> str:
    from tokenloom.ingest import ingest

    path = tmp / f"{name}.jsonl"
    write_jsonl(path, recs)
    uri = str(tmp / name)
    ingest([str(path)], uri, progress=False)
    return uri


@pytest.fixture(scope="session")
def search_table(tmp_path_factory) -> str:
    """90 real paragraphs + the planted row (id 90), embedded (in this process, where the query
    model loads anyway) and indexed with an IVF_FLAT vector index."""
    from tokenloom.search.embed import embed_table
    from tokenloom.search.index import build_indexes

    tmp = tmp_path_factory.mktemp("search")
    planted = {"text": PLANTED + " " + real_paragraphs(91)[-1], "source": "planted"}
    recs = records(90) + [planted]
    uri = build(tmp, recs)
    embed_table(uri, workers=0)
    build_indexes(uri, vector_index="ivf_flat")
    return uri
