"""MinHash signatures of documents' shingle sets, vectorised with numpy per batch.

The signature of a document is, for each of ``num_perm`` hash permutations, the minimum of the
permuted hashes of its shingles (see :mod:`tokenloom.curate.shingle`). Two documents' signatures
agree in a given position with probability equal to the Jaccard similarity of their shingle
sets, so ``mean(sig_a == sig_b)`` estimates it with standard error ``sqrt(J (1 - J) / num_perm)``
(about 0.04 at J = 0.5 with 128 permutations).

Permutation ``k`` maps a 64-bit shingle hash ``x`` to ``((a_k * x + b_k) mod 2**64) >> 32``
(multiply-add-shift: odd ``a_k``, the high 32 bits kept), so signatures are ``uint32``: 512 bytes
a document at 128 permutations. ``a_k, b_k`` come from BLAKE2b of ``(seed, k)`` rather than a
numpy generator, whose streams may change between numpy versions: signatures computed anywhere,
any time, with one :class:`MinHashConfig` are comparable. A document without shingles gets
:data:`EMPTY` in every position, which :func:`~tokenloom.curate.lsh.lsh_clusters` never matches.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from tokenloom.curate.inputs import CurateError, TextColumn, as_texts
from tokenloom.curate.shingle import Fold, shingle_hashes, shingle_hashes_naive

__all__ = [
    "EMPTY",
    "MinHashConfig",
    "permutations",
    "minhash_signatures",
    "minhash_signatures_naive",
    "estimate_jaccard",
]

EMPTY = np.uint32(0xFFFFFFFF)
"""Every position of the signature of a document with no shingles (the maximum ``uint32``)."""

_CHUNK = 1 << 15  # shingles per (chunk, num_perm) uint64 block: 32 MiB at 128 permutations


@dataclass(frozen=True, kw_only=True)
class MinHashConfig:
    """How documents become MinHash signatures. The defaults are explained in
    ``docs/curation.md``: they make the 1623 and modern editions of a Shakespeare play near
    duplicates while keeping different plays far apart."""

    num_perm: int = 128
    """Signature length: more permutations estimate Jaccard more precisely, linearly slower."""
    ngram: int = 3
    """Words per shingle. Shorter shingles tolerate more edits but share more by chance."""
    fold: Fold = Fold.SKELETON
    """Canonicalisation of the text before shingling; see :class:`~tokenloom.curate.Fold`."""
    seed: int = 1
    """Selects the permutations; signatures with different seeds are not comparable."""

    def __post_init__(self) -> None:
        for name in ("num_perm", "ngram", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise CurateError(f"MinHashConfig.{name} must be an int, not {value!r}")
        if self.num_perm < 1 or self.ngram < 1:
            raise CurateError(
                f"MinHashConfig needs num_perm >= 1 and ngram >= 1, "
                f"not num_perm={self.num_perm}, ngram={self.ngram}"
            )
        if not isinstance(self.fold, Fold):
            raise CurateError(
                f"MinHashConfig.fold must be a Fold ({', '.join(f.name for f in Fold)}), "
                f"not {self.fold!r}; e.g. Fold('{Fold.SKELETON.value}')"
            )

    @property
    def version(self) -> str:
        """A string naming everything that determines the signatures, for a UDF's version."""
        return f"minhash1-{self.fold.value}-n{self.ngram}-p{self.num_perm}-s{self.seed}"


@functools.lru_cache(maxsize=16)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The permutation parameters: ``(a, b)``, each ``(num_perm,) uint64``, ``a`` odd."""
    raw = b"".join(
        hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=16, person=b"tokenloom-minhsh").digest()
        for k in range(num_perm)
    )
    ab = np.frombuffer(raw, dtype="<u8").reshape(num_perm, 2).astype(np.uint64)
    a = ab[:, 0] | np.uint64(1)
    a.flags.writeable = False
    b = ab[:, 1].copy()
    b.flags.writeable = False
    return a, b


def minhash_signatures(texts: TextColumn, config: MinHashConfig | None = None) -> np.ndarray:
    """Compute the MinHash signature of every document.

    Args:
        texts: ``(N,)`` documents (Arrow string column or list of ``str``); null counts as empty.
        config: Shingling and permutations; :class:`MinHashConfig` defaults when ``None``.

    Returns:
        ``(N, num_perm) uint32``; rows without shingles are all :data:`EMPTY`.
    """
    config = config or MinHashConfig()
    hashes, offsets = shingle_hashes(texts, ngram=config.ngram, fold=config.fold)  # (S,), (N+1,)
    n = offsets.size - 1
    a, b = permutations(config.num_perm, config.seed)
    sig = np.full((n, config.num_perm), EMPTY, dtype=np.uint32)  # (N, P)
    doc = np.repeat(np.arange(n), np.diff(offsets))  # (S,) document of each shingle
    block = np.empty((min(_CHUNK, hashes.size), config.num_perm), dtype=np.uint64)  # (C, P)
    for lo in range(0, hashes.size, _CHUNK):
        x = hashes[lo : lo + _CHUNK]  # (C,)
        permuted = block[: x.size]
        np.multiply(x[:, None], a, out=permuted)  # wraps mod 2**64, as intended
        np.add(permuted, b, out=permuted)
        np.right_shift(permuted, np.uint64(32), out=permuted)  # (C, P), values < 2**32
        d = doc[lo : lo + _CHUNK]
        seg = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))  # (D,) runs of a doc
        part = np.minimum.reduceat(permuted, seg, axis=0)  # (D, P)
        rows = d[seg]  # (D,) distinct documents in this chunk
        sig[rows] = np.minimum(sig[rows], part)
    return sig


def minhash_signatures_naive(texts: TextColumn, config: MinHashConfig | None = None) -> np.ndarray:
    """Reference for :func:`minhash_signatures`: a Python loop per document and permutation."""
    config = config or MinHashConfig()
    a, b = permutations(config.num_perm, config.seed)
    rows = []
    for text in as_texts(texts):
        shingles = shingle_hashes_naive(text, ngram=config.ngram, fold=config.fold)
        row = []
        for ak, bk in zip(a.tolist(), b.tolist(), strict=True):
            row.append(min((((ak * x + bk) & (2**64 - 1)) >> 32 for x in shingles), default=EMPTY))
        rows.append(row)
    return np.array(rows, dtype=np.uint32).reshape(len(rows), config.num_perm)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Estimated Jaccard similarity: the fraction of equal positions.

    Args:
        sig_a: ``(..., P)`` signatures.
        sig_b: ``(..., P)`` signatures, broadcastable against ``sig_a``.

    Returns:
        ``(...) float64`` in [0, 1]. Two :data:`EMPTY` signatures estimate 1.0 here; clustering
        excludes them separately.
    """
    return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)
