"""Document-length statistics, and what pad/truncate costs against packing at one block length.

Pure numpy over the ``n_tokens`` column. The two policies, for documents of ``n_i`` tokens and a
block length ``L``:

- **pad/truncate**: each document becomes one sequence of ``L`` positions. It keeps
  ``sum(min(n_i, L))`` tokens, so the share of tokens kept is ``sum(min(n_i, L)) / sum(n_i)``,
  and computes ``docs * L`` positions, of which ``sum(min(n_i, L)) / (docs * L)`` are real tokens;
  the rest is padding.
- **packing** (what tokenloom's loader does): documents are concatenated with one EOS after each
  and cut into blocks, so every token is kept, in ``ceil((sum(n_i) + docs) / L)`` blocks; only
  the last block can hold padding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "LengthStats",
    "Percentiles",
    "SourceLengths",
    "length_stats",
    "source_codes",
    "PERCENTILES",
]

PERCENTILES = (5, 25, 50, 75, 95, 99)
"""Percentiles reported, besides the maximum."""


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    """Document length percentiles, in tokens (numpy's default linear interpolation)."""

    p5: float
    p25: float
    p50: float
    p75: float
    p95: float
    p99: float
    max: int


@dataclass(frozen=True, kw_only=True)
class SourceLengths:
    """Counts of one source."""

    source: str
    docs: int
    """Documents of this source."""
    tokens: int
    """Tokens of this source."""
    truncated_docs: int
    """Documents longer than ``seq_len``, i.e. cut by pad/truncate."""
    kept_tokens: int
    """Tokens pad/truncate keeps: ``sum(min(n, seq_len))``."""


@dataclass(frozen=True, kw_only=True)
class LengthStats:
    """Length statistics of a set of documents, and the pad/truncate vs packing comparison."""

    seq_len: int
    """Block length the comparison is made at."""
    documents: int
    """Number of documents."""
    tokens: int
    """Total tokens (no EOS)."""
    mean: float
    """Mean tokens per document."""
    percentiles: Percentiles
    """Length distribution."""
    by_source: tuple[SourceLengths, ...]
    """Per-source counts, sorted by source name; empty when no sources were given."""
    truncated_docs: int
    """Documents longer than ``seq_len``."""
    kept_tokens: int
    """Tokens pad/truncate keeps: ``sum(min(n, seq_len))``."""
    kept_share: float
    """Share of tokens pad/truncate keeps: ``kept_tokens / tokens``."""
    padded_positions: int
    """Positions pad/truncate computes: ``documents * seq_len``."""
    real_position_share: float
    """Share of pad/truncate's positions that are real tokens: ``kept_tokens / padded_positions``.
    ``1 - real_position_share`` is the compute wasted on padding."""
    packed_blocks: int
    """Blocks packing needs: ``ceil((tokens + documents) / seq_len)`` (one EOS per document)."""
    packed_real_share: float
    """Share of packing's positions holding tokens or EOS: ``(tokens + documents) /
    (packed_blocks * seq_len)``; below 1 only through the last block's padding."""

    @property
    def padding_share(self) -> float:
        """Share of pad/truncate's compute spent on padding."""
        return 1.0 - self.real_position_share

    def summary(self) -> str:
        """The comparison as a training team reads it, in one sentence."""
        return (
            f"pad/truncate to {self.seq_len} keeps {self.kept_share:.1%} of tokens "
            f"({self.truncated_docs:,} of {self.documents:,} documents cut) and wastes "
            f"{self.padding_share:.1%} of compute on padding; packing keeps 100% of "
            f"{self.tokens:,} tokens in {self.packed_blocks:,} blocks of {self.seq_len} "
            f"({1 - self.packed_real_share:.2%} padding, last block only)"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, plus ``padding_share`` and ``summary``."""
        out = asdict(self)
        out["by_source"] = [asdict(s) for s in self.by_source]
        out["padding_share"] = self.padding_share
        out["summary"] = self.summary()
        return out


def _as_counts(n_tokens: np.ndarray) -> np.ndarray:
    counts = np.asarray(n_tokens)
    if counts.ndim != 1:
        raise ValueError(f"n_tokens must be 1-D (one count per document), got shape {counts.shape}")
    if counts.size == 0:
        raise ValueError("n_tokens is empty: length statistics need at least one document")
    if not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"n_tokens must hold integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64, copy=False)
    if counts.min() < 0:
        raise ValueError(f"n_tokens holds a negative count ({int(counts.min())})")
    return counts


def _check_sources(got: object, n: int) -> None:
    shape = got if isinstance(got, tuple) else (got,)
    if shape != (n,):
        raise ValueError(
            f"sources must hold one per document: got shape {shape} for {n} counts in "
            "n_tokens; pass one label per document"
        )


def source_codes(sources: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct source labels, sorted, and each document's index into them.

    Args:
        sources: One label per document: a numpy array or sequence, or an Arrow (chunked)
            string column, which is dictionary-encoded without a Python object per document.
        n: The number of documents ``sources`` must cover.

    Returns:
        ``(names, codes)``: ``(k,)`` str labels in sorted order and ``(n,) int64`` with
        ``names[codes[i]]`` the label of document ``i`` (as ``np.unique(labels.astype(str),
        return_inverse=True)``; a null label reads ``"None"``).

    Raises:
        ValueError: ``sources`` does not hold ``n`` labels.
    """
    import pyarrow as pa

    if isinstance(sources, (pa.Array, pa.ChunkedArray)):
        _check_sources(len(sources), n)
        import pyarrow.compute as pc

        if pa.types.is_dictionary(sources.type) and not sources.null_count:
            arr = sources.combine_chunks() if isinstance(sources, pa.ChunkedArray) else sources
            names = np.asarray(arr.dictionary.cast(pa.large_string()).to_pylist(), dtype=str)
            uniq, inv = np.unique(names, return_inverse=True)  # (k,) a few labels
            codes = inv[arr.indices.to_numpy(zero_copy_only=False)]
            present = np.flatnonzero(np.bincount(codes, minlength=uniq.size))
            rank = np.zeros(uniq.size, dtype=np.int64)
            rank[present] = np.arange(present.size)
            return uniq[present], rank[codes]

        col = pc.fill_null(sources.cast(pa.large_string()), "None")
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks else pa.array([], pa.large_string())
        encoded = pc.dictionary_encode(col)
        found = np.asarray(encoded.dictionary.to_pylist(), dtype=str)  # (k,) a few labels
        order = np.argsort(found, kind="stable")
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        return found[order], rank[encoded.indices.to_numpy(zero_copy_only=False)]
    labels = np.asarray(sources)
    _check_sources(labels.shape, n)
    return np.unique(labels.astype(str), return_inverse=True)


def _by_source(counts: np.ndarray, kept: np.ndarray, long: np.ndarray, sources: Any) -> tuple:
    names, inverse = source_codes(sources, counts.size)
    k = len(names)
    docs = np.bincount(inverse, minlength=k)
    # sums in int64 (np.bincount's weights would go through float64)
    tokens = np.zeros(k, dtype=np.int64)
    kept_tokens = np.zeros(k, dtype=np.int64)
    np.add.at(tokens, inverse, counts)
    np.add.at(kept_tokens, inverse, kept)
    truncated = np.bincount(inverse, weights=long, minlength=k).astype(np.int64)
    return tuple(
        SourceLengths(
            source=str(names[i]),
            docs=int(docs[i]),
            tokens=int(tokens[i]),
            truncated_docs=int(truncated[i]),
            kept_tokens=int(kept_tokens[i]),
        )
        for i in range(k)
    )


def length_stats(
    n_tokens: np.ndarray, *, seq_len: int, sources: np.ndarray | None = None
) -> LengthStats:
    """Summarise document lengths and compare pad/truncate with packing at ``seq_len``.

    Args:
        n_tokens: Tokens per document, shape ``(docs,)``, integers >= 0 (no EOS counted).
        seq_len: Block length, >= 1.
        sources: Optional source label per document, shape ``(docs,)``, or the Arrow ``source``
            column (read without a Python string per document).

    Returns:
        The statistics; see :class:`LengthStats` for each figure's formula.

    Raises:
        ValueError: Empty, non-integer, negative or non-1-D ``n_tokens``; ``seq_len < 1``;
            ``sources`` of another shape.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    counts = _as_counts(n_tokens)
    docs = int(counts.size)
    tokens = int(counts.sum())
    kept = np.minimum(counts, seq_len)
    long = counts > seq_len
    kept_tokens = int(kept.sum())
    packed_blocks = math.ceil((tokens + docs) / seq_len)
    pct = np.percentile(counts, PERCENTILES)
    return LengthStats(
        seq_len=seq_len,
        documents=docs,
        tokens=tokens,
        mean=tokens / docs,
        percentiles=Percentiles(
            **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)},
            max=int(counts.max()),
        ),
        by_source=() if sources is None else _by_source(counts, kept, long, sources),
        truncated_docs=int(long.sum()),
        kept_tokens=kept_tokens,
        kept_share=kept_tokens / tokens if tokens else 1.0,
        padded_positions=docs * seq_len,
        real_position_share=kept_tokens / (docs * seq_len),
        packed_blocks=packed_blocks,
        packed_real_share=(tokens + docs) / (packed_blocks * seq_len),
    )
