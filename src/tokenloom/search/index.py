"""``tokenloom index``: a BM25 full-text index and a vector index, as table versions.

Both are Lance indexes; building one commits a new table version whose manifest references it,
so a search at version V uses exactly the indexes V had. Rows appended after an index was built
are still searched (Lance scans unindexed fragments: BM25 over them, flat distances for vectors)
until the next ``tokenloom index`` folds them in.

The vector index is chosen from the number of embedded rows (:func:`choose_vector_index`):

=================  ==================  =============================================================
rows               index               why
=================  ==================  =============================================================
< 10,000           none                a flat scan of 10k × 384 floats takes a few ms and is exact
< 1,000,000        IVF_FLAT            √n partitions, exact distances inside the probed ones
≥ 1,000,000        IVF_PQ              √n partitions, 48 sub-vectors (8 dims each, 96× smaller),
                                        queries re-rank 10× more candidates exactly (refine)
=================  ==================  =============================================================

Queries pre-filter (``prefilter=True``), so a selective ``--where`` still yields K rows; see
:mod:`tokenloom.search.query` for the fallback when the probed partitions hold fewer than K.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError
from tokenloom.progress import progress as show_progress
from tokenloom.table import Table

__all__ = [
    "SearchError",
    "VECTOR_INDEX_TYPES",
    "IndexResult",
    "FtsOptions",
    "FTS_TOKENIZERS",
    "choose_vector_index",
    "build_indexes",
    "index_info",
]

#: Names accepted by ``--vector-index`` (``auto`` applies :func:`choose_vector_index`).
VECTOR_INDEX_TYPES = ("auto", "none", "ivf_flat", "ivf_pq")
FLAT_MAX_ROWS = 10_000
IVF_FLAT_MAX_ROWS = 1_000_000
PQ_SUB_VECTORS = 48
MIN_TRAIN_ROWS = 64


class SearchError(TokenloomError):
    """A search, index or embedding request that cannot be served as asked."""


@dataclass(frozen=True, kw_only=True)
class VectorIndexChoice:
    """The vector index picked for a table size."""

    kind: str
    """``none``, ``ivf_flat`` or ``ivf_pq``."""
    num_partitions: int = 0
    num_sub_vectors: int = 0
    reason: str = ""


def choose_vector_index(rows: int, kind: str = "auto", dim: int = 384) -> VectorIndexChoice:
    """The vector index for ``rows`` embedded rows (see the module docstring for the rule)."""
    if kind not in VECTOR_INDEX_TYPES:
        raise SearchError(f"vector index {kind!r} is not one of {', '.join(VECTOR_INDEX_TYPES)}")
    if kind == "auto":
        if rows < FLAT_MAX_ROWS:
            kind = "none"
        elif rows < IVF_FLAT_MAX_ROWS:
            kind = "ivf_flat"
        else:
            kind = "ivf_pq"
        why = f"auto for {rows:,} rows"
    else:
        why = "asked for"
    if kind == "none":
        return VectorIndexChoice(kind="none", reason=f"{why}: flat search is exact and fast")
    if rows < MIN_TRAIN_ROWS:
        raise SearchError(
            f"a {kind} index needs at least {MIN_TRAIN_ROWS} embedded rows to train on, the table "
            f"has {rows}; use --vector-index none (flat search)"
        )
    parts = max(1, min(4096, round(math.sqrt(rows))))
    sub = PQ_SUB_VECTORS if kind == "ivf_pq" and dim % PQ_SUB_VECTORS == 0 else 0
    if kind == "ivf_pq" and not sub:
        sub = next(s for s in (32, 24, 16, 8, 4, 2, 1) if dim % s == 0)
    return VectorIndexChoice(kind=kind, num_partitions=parts, num_sub_vectors=sub, reason=why)


@dataclass(kw_only=True)
class IndexResult:
    """What :func:`build_indexes` built."""

    versions: list[int] = field(default_factory=list)
    """Table versions committed (one per index built)."""
    fts_column: str | None = None
    fts_seconds: float = 0.0
    fts_options: dict = field(default_factory=dict)
    vector_column: str | None = None
    vector_index: str = "none"
    vector_reason: str = ""
    vector_rows: int = 0
    num_partitions: int = 0
    vector_seconds: float = 0.0
    rows: int = 0
    up_to_date: list[str] = field(default_factory=list)
    """Indexes left as they were, committing nothing: built with the same parameters and
    already covering every fragment (a re-run after no append)."""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def fts_index_name(column: str) -> str:
    return f"{column}_fts"


def vector_index_name(column: str) -> str:
    return f"{column}_vec"


@dataclass(frozen=True, kw_only=True)
class FtsOptions:
    """How the BM25 index splits and normalises text (Lance's INVERTED index parameters)."""

    tokenizer: str = "simple"
    """``simple`` (split on whitespace and punctuation), ``whitespace``, ``icu`` (Unicode word
    segmentation, for languages without spaces) or ``ngram`` (substrings)."""
    language: str = "English"
    """Language of the stemmer and of the stop-word list (Lance's names: English, French,
    Spanish, German, ...)."""
    stem: bool = True
    """Index word stems: ``beginning`` finds ``begin``, ``begins`` (also inside phrases)."""
    remove_stop_words: bool = False
    """Drop the language's stop words. Off by default: a phrase such as ``"in the beginning"``
    then keeps every word (with them removed it degrades to ``beginning`` alone)."""
    ascii_folding: bool = True
    """``cafe`` finds ``café``."""

    def lance_params(self) -> dict:
        return {
            "base_tokenizer": self.tokenizer,
            "language": self.language,
            "stem": self.stem,
            "remove_stop_words": self.remove_stop_words,
            "ascii_folding": self.ascii_folding,
        }


FTS_TOKENIZERS = ("simple", "whitespace", "icu", "ngram")


def build_indexes(
    uri: str,
    *,
    fts: str | None = "text",
    vector: str | None = "embedding",
    vector_index: str = "auto",
    storage_options: Mapping[str, str] | None = None,
    fts_options: FtsOptions | None = None,
    progress: bool | None = None,
) -> IndexResult:
    """Build (or rebuild, covering every row) the full-text and vector indexes.

    Args:
        uri: The table (its latest version).
        fts: Text column for the BM25 index (``None``: skip).
        vector: Embedding column for the vector index; skipped when the table has no such
            column (it is optional: run ``tokenloom embed`` to add it).
        vector_index: ``auto`` (by table size), ``none``, ``ivf_flat`` or ``ivf_pq``.
        fts_options: Tokenizer, language, stemming and stop words of the BM25 index.
        progress: Show progress on stderr (see :mod:`tokenloom.progress`; ``None``: unless
            silenced).

    Raises:
        SearchError: when the text column is missing, or a forced vector index cannot be built.
    """
    table = Table.open(uri, storage_options=storage_options)
    names = table.schema().names
    res = IndexResult(rows=table.count_rows())
    todo = [c for c in (fts, vector if vector in names else None) if c is not None]
    with show_progress("index", total=len(todo), unit="indexes", show=progress) as bar:
        _build(table, res, uri, fts, vector, vector_index, fts_options, bar)
    return res


def _build(table, res, uri, fts, vector, vector_index, fts_options, bar) -> None:  # noqa: ANN001
    """:func:`build_indexes`' work, one index after the other, into ``res``."""
    names = table.schema().names
    if fts is not None:
        bar.note(f"full-text on {fts}")
        if fts not in names:
            raise SearchError(f"no column {fts!r} to index for full-text search; have {names}")
        opts = fts_options or FtsOptions()
        res.fts_column, res.fts_options = fts, opts.lance_params()
        wanted = {**opts.lance_params(), "with_position": True}
        if _up_to_date(table, fts_index_name(fts), lambda d: _same(d.details, wanted)):
            res.up_to_date.append(fts_index_name(fts))
        else:
            started = time.perf_counter()
            # Positions make phrase queries ("...") possible.
            try:
                table.dataset.create_scalar_index(
                    fts,
                    "INVERTED",
                    name=fts_index_name(fts),
                    replace=True,
                    with_position=True,
                    **opts.lance_params(),
                )
            except (ValueError, OSError, RuntimeError) as exc:
                raise SearchError(f"cannot build the full-text index with {opts}: {exc}") from exc
            res.fts_seconds = time.perf_counter() - started
            table = table.checkout()
            res.versions.append(table.version)
        bar.update()
    if vector is not None and vector in names:
        bar.note(f"vectors on {vector}")
        res.vector_column = vector
        res.vector_rows = table.count_rows(f"{vector} IS NOT NULL")
        dim = table.schema().field(vector).type.list_size
        choice = choose_vector_index(res.vector_rows, vector_index, dim)
        res.vector_index, res.vector_reason = choice.kind, choice.reason

        def same_kind(description: Any) -> bool:
            return str(description.index_type).upper() == choice.kind.upper()

        if choice.kind != "none" and _up_to_date(table, vector_index_name(vector), same_kind):
            res.num_partitions = choice.num_partitions
            res.up_to_date.append(vector_index_name(vector))
        elif choice.kind != "none":
            started = time.perf_counter()
            kwargs: dict = {"num_partitions": choice.num_partitions}
            if choice.kind == "ivf_pq":
                kwargs["num_sub_vectors"] = choice.num_sub_vectors
            table.dataset.create_index(
                vector,
                choice.kind.upper(),
                name=vector_index_name(vector),
                metric="cosine",
                replace=True,
                **kwargs,
            )
            res.num_partitions = choice.num_partitions
            res.vector_seconds = time.perf_counter() - started
            table = table.checkout()
            res.versions.append(table.version)
        bar.update()
    elif vector is not None and vector_index not in ("auto", "none"):
        raise SearchError(
            f"no column {vector!r} for a vector index; add it with `tokenloom embed --table {uri}`"
        )


def _same(details: Mapping, wanted: Mapping) -> bool:
    """Whether an index's recorded parameters hold every wanted value."""
    return all(details.get(key) == value for key, value in wanted.items())


def _up_to_date(table: Table, name: str, same: Callable[[Any], bool]) -> bool:
    """Whether index ``name`` exists, was built as ``same`` accepts (its description) and covers
    every fragment of this version: rebuilding it would commit an identical index."""
    info = index_info(table).get(name)
    if info is None or info["unindexed_fragments"]:
        return False
    return any(same(d) for d in table.dataset.describe_indices() if d.name == name)


def index_info(table: Table) -> dict[str, dict]:
    """The indexes of this table version.

    Returns:
        name → ``{type, fields, rows_indexed, fragments, unindexed_fragments}``.
    """
    frags = {f.fragment_id for f in table.dataset.get_fragments()}
    out = {}
    for idx in table.dataset.describe_indices():
        covered = set()
        for seg in idx.segments:
            covered |= set(seg.fragment_ids)
        out[idx.name] = {
            "type": idx.index_type,
            "fields": list(idx.field_names),
            "rows_indexed": int(idx.num_rows_indexed),
            "fragments": len(covered & frags),
            "unindexed_fragments": len(frags - covered),
        }
    return out
