"""``tokenloom search``: full-text (BM25), vector and hybrid queries on one table version.

- **fts**: Lance's BM25 over the INVERTED index of the text column; a query in double quotes is a
  phrase. Fragments appended after the index was built are searched too (Lance scores them
  without an index), so nothing the version holds is missed.
- **vector**: the query is embedded with the same MiniLM model as the ``embedding`` column and the
  K nearest rows by cosine distance are returned. The filter is applied **before** the search
  (``prefilter=True``). If an IVF index's probed partitions hold fewer than K matching rows while
  the filter matches more, the query is re-run as an exact flat search over the filtered rows, so a
  selective ``--where`` still returns K rows.
- **hybrid**: reciprocal rank fusion. Each of fts and vector returns its top
  ``max(50, 2K)`` under the same filter; a row's score is ``Σ 1 / (60 + rank)`` over the lists it
  appears in (rank from 1; 60 is the constant of Cormack et al., 2009); the top K by that score
  are returned with both ranks. A row found by only one retriever still competes.

``--where`` is a Lance SQL filter and composes with every mode; ``version`` opens the table as of
that version, with the indexes it had then. A version from before the full-text index is searched
with the newest index restricted to that version's rows (see :func:`_fts_source`), with a note.

Phrases: the index keeps stop words by default (``tokenloom index --remove-stop-words`` drops
them), so ``"in the beginning"`` matches those three words in order, not ``beginning`` alone;
stemming (on by default) lets it match ``in the beginnings`` too. Phrase hits are ranked by the
phrase itself (BM25F over the opening sentence and the whole text, :mod:`tokenloom.search.phrase`),
not by Lance's BM25 over its separate words.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from tokenloom.search.index import SearchError, index_info
from tokenloom.search.phrase import PHRASE_POOL, phrase_pattern, phrase_scores, phrase_stats
from tokenloom.search.phrase import words as phrase_words
from tokenloom.table import Table
from tokenloom.table.filters import validate_filter

__all__ = ["MODES", "RRF_K", "Hit", "SearchResult", "search", "snippet", "rrf_fuse"]

MODES = ("fts", "vector", "hybrid")
RRF_K = 60
SNIPPET_CHARS = 160


@dataclass(kw_only=True)
class Hit:
    """One result row."""

    id: int
    source: str
    score: float
    """fts: BM25; vector: cosine similarity (1 - distance); hybrid: the RRF score."""
    snippet: str
    fts_rank: int | None = None
    vector_rank: int | None = None


@dataclass(kw_only=True)
class SearchResult:
    """The hits of one query and how they were found."""

    query: str
    mode: str
    version: int
    where: str | None
    limit: int
    hits: list[Hit] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """E.g. that an IVF search fell back to an exact flat search under a selective filter."""

    def to_json(self) -> dict:
        return {**asdict(self), "hits": [asdict(h) for h in self.hits]}


# -- snippets -------------------------------------------------------------------------------------


def _terms(query: str) -> list[str]:
    return [t for t in re.findall(r"\w+", query.lower()) if t]


def snippet(text: str, query: str | None = None, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` around the first match of the query (its phrase,
    else its earliest term), else its start; whitespace collapsed, cuts marked with ``…``."""
    text = text or ""
    start = 0
    if query:
        terms = _terms(query)
        phrase = r"\W+".join(map(re.escape, terms))
        found = re.search(rf"\b{phrase}\b", text, re.IGNORECASE) if terms else None
        if found is None and terms:
            pattern = "|".join(map(re.escape, sorted(set(terms), key=len, reverse=True)))
            found = re.search(rf"\b(?:{pattern})\b", text, re.IGNORECASE)
        if found is not None:
            start = max(0, found.start() - width // 3)
    end = min(len(text), start + width)
    body = " ".join(text[start:end].split())
    return ("…" if start > 0 else "") + body + ("…" if end < len(text) else "")


# -- the three modes ------------------------------------------------------------------------------


def _and(*filters: str | None) -> str | None:
    parts = [f"({f})" for f in filters if f]
    return " AND ".join(parts) if parts else None


def _has_fts(table: Table, column: str) -> bool:
    return any(
        info["type"].lower() in ("inverted", "fts") and column in info["fields"]
        for info in index_info(table).values()
    )


def _fts_source(
    table: Table, column: str, where: str | None, notes: list[str]
) -> tuple[Table, str | None, set[int] | None]:
    """The table whose index answers a text query on ``table``, the filter to use there, and the
    ids allowed (``None``: all the filter selects).

    A version built before the index (``--version V`` from before ``tokenloom index``) is
    searched with the newest index restricted to V's rows: ids are assigned in commit order and
    never reused, and text is never rewritten, so V's rows are exactly the rows with
    ``id <= max id of V`` that still exist, with the same text.
    """
    if _has_fts(table, column):
        return table, where, None
    latest = Table.open(table.uri, storage_options=table.storage_options or None)
    if latest.version == table.version or not _has_fts(latest, column):
        _require_fts(table, column)
    import pyarrow.compute as pc

    allowed = table.dataset.to_table(columns=["id"], filter=where).column("id")
    max_id = pc.max(table.dataset.to_table(columns=["id"]).column("id")).as_py()
    restrict = f"id <= {max_id}" if max_id is not None else "id < 0"
    gone = table.count_rows(where) - latest.count_rows(_and(where, restrict))
    notes.append(
        f"version {table.version} has no full-text index; searched its rows (id <= {max_id}) "
        f"with the index of version {latest.version} (BM25 statistics of that index)"
        + (f"; {gone:,} of its rows were deleted since and cannot be found" if gone > 0 else "")
    )
    return latest, _and(where, restrict), set(allowed.to_pylist())


def _require_fts(table: Table, column: str) -> None:
    if _has_fts(table, column):
        return
    raise SearchError(
        f"version {table.version} of {table.uri} has no full-text index on {column!r}; "
        f"build one with `tokenloom index --table {table.uri}` (a version before the index "
        "cannot be searched by text)"
    )


def _fts(
    table: Table, query: str, where: str | None, k: int, column: str, notes: list[str]
) -> list[dict]:
    from lance.query import MatchQuery, PhraseQuery

    table, where, allowed = _fts_source(table, column, where, notes)
    q = query.strip()
    phrase = q[1:-1] if len(q) > 1 and q.startswith('"') and q.endswith('"') else None
    fts_query = PhraseQuery(phrase, column) if phrase is not None else MatchQuery(q, column)
    depth = max(k, PHRASE_POOL) if phrase is not None else k
    data = table.dataset.to_table(
        columns=["id", "source", column, "_score"],
        full_text_query=fts_query,
        filter=where,
        prefilter=True,
        limit=depth,
    )
    rows = data.to_pylist()
    if allowed is not None:  # the filter on the newer version must select what it did on V
        rows = [r for r in rows if r["id"] in allowed]
    if phrase is not None:
        _rank_phrase_hits(table, phrase, rows, where, depth, column, notes)
    rows.sort(key=lambda r: (-r["_score"], r["id"]))
    return rows[:k]


def _rank_phrase_hits(
    table: Table,
    phrase: str,
    rows: list[dict],
    where: str | None,
    depth: int,
    column: str,
    notes: list[str],
) -> None:
    """Replace Lance's score of each phrase hit by the phrase's own (:mod:`.phrase`)."""
    import pyarrow.compute as pc
    from lance.query import PhraseQuery

    if not rows:
        return
    matches = len(rows)
    if matches == depth:  # the pool is full: count every match for the idf
        matches = table.dataset.to_table(
            columns=["id", "_score"],
            full_text_query=PhraseQuery(phrase, column),
            filter=where,
            prefilter=True,
        ).num_rows
        notes.append(
            f"{matches:,} rows hold the phrase; the {depth:,} best by BM25 over its words were "
            "re-ranked by the phrase"
        )
    if "n_chars" in table.schema().names:
        avg_length = pc.mean(table.dataset.to_table(columns=["n_chars"]).column(0)).as_py()
    else:
        avg_length = sum(len(r[column] or "") for r in rows) / len(rows)
    pattern = phrase_pattern(phrase_words(phrase))
    stats = [phrase_stats(r[column], pattern) for r in rows]
    scores = phrase_scores(
        stats, avg_length=avg_length or 1.0, rows=table.count_rows(where), matches=matches
    )
    for row, score in zip(rows, scores, strict=True):
        row["_score"] = score


def _vector_column_check(table: Table, column: str) -> None:
    from tokenloom.search.embed import EMBEDDING_META_KEY, model_identity

    schema = table.schema()
    if column not in schema.names:
        raise SearchError(
            f"version {table.version} of {table.uri} has no {column!r} column for vector search; "
            f"add it with `tokenloom embed --table {table.uri}` (then `tokenloom index`)"
        )
    meta = schema.field(column).metadata or {}
    if EMBEDDING_META_KEY in meta:
        made = json.loads(meta[EMBEDDING_META_KEY])
        if made.get("model") != model_identity()["model"]:
            raise SearchError(
                f"column {column!r} was embedded with {made.get('model')!r}, but queries are "
                f"embedded with {model_identity()['model']!r}; re-embed with `tokenloom embed`"
            )


def _vector(
    table: Table,
    query_vec: np.ndarray,
    where: str | None,
    k: int,
    column: str,
    text_column: str,
    notes: list[str],
    nprobes: int | None = None,
) -> list[dict]:
    info = [i for i in index_info(table).values() if column in i["fields"]]
    nearest: dict = {"column": column, "q": query_vec, "k": k, "metric": "cosine"}
    if info:
        # Partitions were √rows at build time (index.choose_vector_index): probe a tenth, ≥ 20.
        parts = math.sqrt(max(1, info[0]["rows_indexed"]))
        nearest["nprobes"] = nprobes or max(20, math.ceil(0.1 * parts))
        if "PQ" in info[0]["type"].upper():
            nearest["refine_factor"] = 10

    def run(options: dict) -> list[dict]:
        data = table.dataset.to_table(
            columns=["id", "source", text_column, "_distance"],
            nearest=options,
            filter=where,
            prefilter=True,
        )
        rows = data.to_pylist()
        rows.sort(key=lambda r: (r["_distance"], r["id"]))
        return rows

    rows = run(nearest)
    if info and len(rows) < k:
        matching = table.count_rows(_and(where, f"{column} IS NOT NULL"))
        if matching > len(rows):
            notes.append(
                f"the index's probed partitions held {len(rows)} of the {matching} rows matching "
                "the filter; re-ran as an exact flat search"
            )
            rows = run({**nearest, "use_index": False})
    return rows


def rrf_fuse(ranked: list[list[int]], k: int = RRF_K) -> list[tuple[int, float, list[int | None]]]:
    """Reciprocal rank fusion: ``(id, Σ 1/(k + rank), [rank in each list or None])``, best
    first (ties by id)."""
    scores: dict[int, float] = {}
    ranks: dict[int, list[int | None]] = {}
    for li, ids in enumerate(ranked):
        for rank, rid in enumerate(ids, start=1):
            scores[rid] = scores.get(rid, 0.0) + 1.0 / (k + rank)
            ranks.setdefault(rid, [None] * len(ranked))[li] = rank
    order = sorted(scores, key=lambda rid: (-scores[rid], rid))
    return [(rid, scores[rid], ranks[rid]) for rid in order]


def search(
    uri: str,
    query: str,
    *,
    mode: str = "fts",
    where: str | None = None,
    version: int | None = None,
    limit: int = 10,
    text_column: str = "text",
    vector_column: str = "embedding",
    nprobes: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> SearchResult:
    """Search one version of the table.

    Args:
        uri: The table.
        query: Words (fts: BM25 over the terms; ``"a phrase"`` in double quotes: that phrase),
            or any text (vector: its meaning).
        mode: ``fts``, ``vector`` or ``hybrid``.
        where: A SQL filter applied before ranking (e.g. ``"source = 'kjv'"``).
        version: The table version to search (default: the latest).
        limit: K, the number of hits.
        text_column: The indexed text column (also the snippets' source).
        vector_column: The embedding column.
        nprobes: IVF partitions to probe (default: a tenth of them, at least 20).
        storage_options: Object-store options (with the ``AWS_*`` environment).

    Raises:
        SearchError: a missing index or column, naming the command that adds it.
    """
    if mode not in MODES:
        raise SearchError(f"search mode {mode!r} is not one of {', '.join(MODES)}")
    if limit < 1:
        raise SearchError(f"limit must be at least 1, not {limit}")
    if not query.strip():
        raise SearchError("the query is empty")
    started = time.perf_counter()
    table = Table.open(uri, version=version, storage_options=storage_options)
    where = validate_filter(table.dataset, where)
    res = SearchResult(query=query, mode=mode, version=table.version, where=where, limit=limit)
    fts_rows: list[dict] = []
    vec_rows: list[dict] = []
    depth = limit if mode != "hybrid" else max(50, 2 * limit)
    if mode in ("vector", "hybrid"):
        _vector_column_check(table, vector_column)
    if mode in ("fts", "hybrid"):
        fts_rows = _fts(table, query, where, depth, text_column, res.notes)
    if mode in ("vector", "hybrid"):
        from tokenloom.search.embed import embed_texts

        q = embed_texts([query])[0]
        vec_rows = _vector(table, q, where, depth, vector_column, text_column, res.notes, nprobes)
    if mode == "fts":
        res.hits = [
            _hit(r, r["_score"], query, text_column, fts_rank=i + 1) for i, r in enumerate(fts_rows)
        ]
    elif mode == "vector":
        res.hits = [
            _hit(r, 1.0 - r["_distance"], query, text_column, vector_rank=i + 1)
            for i, r in enumerate(vec_rows)
        ]
    else:
        by_id = {r["id"]: r for r in vec_rows} | {r["id"]: r for r in fts_rows}
        fused = rrf_fuse([[r["id"] for r in fts_rows], [r["id"] for r in vec_rows]])
        res.hits = [
            _hit(by_id[rid], score, query, text_column, fts_rank=ranks[0], vector_rank=ranks[1])
            for rid, score, ranks in fused[:limit]
        ]
    res.seconds = time.perf_counter() - started
    return res


def _hit(row: dict, score: float, query: str, text_column: str, **ranks: int | None) -> Hit:
    return Hit(
        id=int(row["id"]),
        source=row["source"],
        score=float(score),
        snippet=snippet(row[text_column], query),
        **ranks,
    )
