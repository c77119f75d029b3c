"""``tokenloom contamination``: training rows that share long word n-grams with an evaluation set.

The method of GPT-3 (Brown et al., 2020, appendix C) and OLMo's decontamination: text is
normalised (NFKC, lower case, split on anything that is not a letter or digit) and a training row
counts as contaminated for an evaluation item when they share at least one n-gram of ``n`` words
(13 by default). Evaluation items shorter than ``n`` words cannot match and are counted as such.

It scales with the table, not with memory: the evaluation n-grams are hashed into one sorted
``uint64`` array; the table (under the filter, at the version) streams in batches, each batch's
words are normalised and hashed by pyarrow/numpy and its n-gram hashes computed with a vectorised
rolling hash; only the few positions whose hash is in the evaluation set are then checked word by
word (so a hash collision never reports a false match).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.progress import progress as show_progress
from tokenloom.search.index import SearchError
from tokenloom.table import Table
from tokenloom.table.filters import validate_filter

__all__ = [
    "DEFAULT_N",
    "ContaminationResult",
    "EvalItem",
    "normalize_words",
    "read_eval",
    "find_contamination",
]

DEFAULT_N = 13
_SPLIT = r"[^\pL\pN]+"
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplication mod 2**64 is a bijection


@dataclass(kw_only=True)
class EvalItem:
    """One evaluation item and the training rows that share an n-gram with it."""

    item: int
    """Position in the evaluation file (0-based, non-empty items)."""
    excerpt: str
    rows: list[dict] = field(default_factory=list)
    """``{"id", "source", "ngram", "shared"}``: the first shared n-gram and how many distinct
    n-gram positions of the row matched."""


@dataclass(kw_only=True)
class ContaminationResult:
    """Which evaluation items appear in which training rows."""

    n: int
    version: int
    filter: str | None
    column: str
    eval_items: int = 0
    eval_too_short: int = 0
    """Items with fewer than ``n`` words (they cannot match)."""
    eval_ngrams: int = 0
    """Distinct n-grams of the evaluation set."""
    rows_scanned: int = 0
    rows_contaminated: int = 0
    items_contaminated: int = 0
    seconds: float = 0.0
    items: list[EvalItem] = field(default_factory=list)
    """Only the contaminated items, in file order."""

    def to_json(self) -> dict:
        return {**asdict(self), "items": [asdict(i) for i in self.items]}


# -- normalisation and hashing -------------------------------------------------------------------


def normalize_words(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Words of every text, flattened: ``(words, doc)`` where ``doc[i]`` is the index of the
    text word ``i`` came from. NFKC, lower case, split on non-letters/digits; empty strings
    dropped."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    lists = pc.split_pattern_regex(pc.utf8_lower(pc.utf8_normalize(texts, "NFKC")), _SPLIT)
    words = pc.list_flatten(lists)
    doc = pc.list_parent_indices(lists).to_numpy()
    keep = pc.greater(pc.binary_length(words), 0)
    return words.filter(keep), doc[keep.to_numpy(zero_copy_only=False)]


class _WordHasher:
    """Word → 64-bit BLAKE2b, cached (deterministic across processes and runs)."""

    def __init__(self, max_cache: int = 4_000_000) -> None:
        self.cache: dict[str, int] = {}
        self.max_cache = max_cache

    def __call__(self, words: pa.Array) -> np.ndarray:
        enc = pc.dictionary_encode(words)
        uniq = enc.dictionary.to_pylist()
        if len(self.cache) > self.max_cache:
            self.cache.clear()
        cache = self.cache
        vals = np.empty(len(uniq), dtype=np.uint64)
        for i, w in enumerate(uniq):
            h = cache.get(w)
            if h is None:
                h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                cache[w] = h
            vals[i] = h
        return vals[enc.indices.to_numpy(zero_copy_only=False)]


def ngram_hashes(word_hash: np.ndarray, doc: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rolling hash of every n-gram that lies inside one document.

    Args:
        word_hash: (W,) uint64 hash per word.
        doc: (W,) non-decreasing document index per word.
        n: Words per n-gram.

    Returns:
        ``(hashes, starts)``: (G,) uint64 n-gram hashes and (G,) their first word's position.
    """
    count = len(word_hash) - n + 1
    if count <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    acc = word_hash[:count].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            acc = acc * _MULT + word_hash[j : j + count]
    starts = np.flatnonzero(doc[:count] == doc[n - 1 : n - 1 + count])
    return acc[starts], starts


# -- the evaluation set --------------------------------------------------------------------------


def read_eval(path: str, field: str = "text") -> list[str]:
    """Evaluation items: JSONL records' ``field`` (when the first non-empty line is a JSON
    object), else one item per non-empty line of plain text."""
    if not os.path.isfile(path):
        raise SearchError(f"evaluation file {path!r} does not exist")
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [line for line in fh.read().splitlines() if line.strip()]
    if not lines:
        raise SearchError(f"evaluation file {path!r} holds no item")
    try:
        first = json.loads(lines[0])
    except ValueError:
        first = None
    if not isinstance(first, dict):
        return lines
    items = []
    for no, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise SearchError(f"{path}: item {no} is not JSON ({exc})") from exc
        value = rec.get(field) if isinstance(rec, dict) else None
        if not isinstance(value, str):
            raise SearchError(
                f"{path}: item {no} has no string field {field!r}; pass --eval-field NAME"
            )
        items.append(value)
    return items


class _EvalIndex:
    """The evaluation set's n-grams: a sorted hash array plus each hash's (item, words)."""

    def __init__(self, texts: list[str], n: int, hasher: _WordHasher) -> None:
        words, doc = normalize_words(pa.array(texts, pa.large_string()))
        lengths = np.bincount(doc, minlength=len(texts))
        self.too_short = int((lengths < n).sum())
        hashes, starts = ngram_hashes(hasher(words), doc, n)
        word_list = words.to_pylist()
        self.by_hash: dict[int, list[tuple[int, tuple[str, ...]]]] = {}
        for h, s in zip(hashes.tolist(), starts.tolist(), strict=True):
            entry = (int(doc[s]), tuple(word_list[s : s + n]))
            bucket = self.by_hash.setdefault(h, [])
            if entry not in bucket:
                bucket.append(entry)
        self.hashes = np.array(sorted(self.by_hash), dtype=np.uint64)
        self.ngrams = len({e[1] for b in self.by_hash.values() for e in b})


# -- the scan ------------------------------------------------------------------------------------


def find_contamination(
    uri: str,
    eval_texts: list[str],
    *,
    n: int = DEFAULT_N,
    filter: str | None = None,
    version: int | None = None,
    column: str = "text",
    batch_size: int = 2048,
    storage_options: Mapping[str, str] | None = None,
    progress: bool | None = None,
) -> ContaminationResult:
    """Training rows (under ``filter``, at ``version``) sharing an ``n``-word n-gram with an
    evaluation item.

    Args:
        uri: The table.
        eval_texts: The evaluation items.
        n: Words per n-gram (13 as in GPT-3; 8 catches shorter overlaps).
        filter: SQL selecting the training rows (the run's filter).
        version: The table version trained on (default: the latest).
        column: The text column.
        batch_size: Rows per streamed batch.
        progress: Show progress on stderr (see :mod:`tokenloom.progress`; ``None``: unless
            silenced).
    """
    if n < 1:
        raise SearchError(f"--n must be at least 1, not {n}")
    started = time.perf_counter()
    table = Table.open(uri, version=version, storage_options=storage_options)
    if column not in table.schema().names:
        raise SearchError(f"no column {column!r} in {uri}; have {table.schema().names}")
    filter = validate_filter(table.dataset, filter)
    hasher = _WordHasher()
    ev = _EvalIndex(eval_texts, n, hasher)
    res = ContaminationResult(n=n, version=table.version, filter=filter, column=column)
    res.eval_items, res.eval_too_short, res.eval_ngrams = len(eval_texts), ev.too_short, ev.ngrams
    found: dict[int, dict[int, dict]] = {}  # item -> row id -> match
    rows_hit: set[int] = set()
    try:
        batches = table.dataset.to_batches(
            columns=["id", "source", column], filter=filter, batch_size=batch_size
        )
        total = table.dataset.count_rows(filter=filter)
        with show_progress("contamination", total=total, unit="rows", show=progress) as bar:
            for batch in batches:
                res.rows_scanned += batch.num_rows
                bar.update(batch.num_rows)
                if not len(ev.hashes) or not batch.num_rows:
                    continue
                _scan_batch(batch, column, n, hasher, ev, found, rows_hit)
    except (ValueError, OSError) as exc:
        raise SearchError(f"cannot scan {uri} with filter {filter!r}: {exc}") from exc
    for item in sorted(found):
        rows = sorted(found[item].values(), key=lambda r: r["id"])
        res.items.append(EvalItem(item=item, excerpt=_excerpt(eval_texts[item]), rows=rows))
    res.items_contaminated = len(res.items)
    res.rows_contaminated = len(rows_hit)
    res.seconds = time.perf_counter() - started
    return res


def _scan_batch(
    batch: pa.RecordBatch,
    column: str,
    n: int,
    hasher: _WordHasher,
    ev: _EvalIndex,
    found: dict[int, dict[int, dict]],
    rows_hit: set[int],
) -> None:
    words, doc = normalize_words(batch.column(column))
    if len(words) < n:
        return
    hashes, starts = ngram_hashes(hasher(words), doc, n)
    pos = np.searchsorted(ev.hashes, hashes)
    pos[pos == len(ev.hashes)] = 0
    cand = np.flatnonzero(ev.hashes[pos] == hashes)
    if not len(cand):
        return
    ids = batch.column("id").to_numpy()
    sources = batch.column("source")
    for c in cand.tolist():
        s = int(starts[c])
        gram = tuple(words.slice(s, n).to_pylist())
        for item, eval_gram in ev.by_hash[int(hashes[c])]:
            if gram != eval_gram:  # a hash collision, not a match
                continue
            r = int(doc[s])
            rid = int(ids[r])
            rows_hit.add(rid)
            match = found.setdefault(item, {}).get(rid)
            if match is None:
                found[item][rid] = {
                    "id": rid,
                    "source": sources[r].as_py(),
                    "ngram": " ".join(gram),
                    "shared": 1,
                }
            else:
                match["shared"] += 1


def _excerpt(text: str, width: int = 100) -> str:
    body = " ".join(text.split())
    return body if len(body) <= width else body[: width - 1] + "…"
