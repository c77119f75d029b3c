"""Text normalisation and the content hash that exact deduplication compares.

``normalize_text`` defines when two documents count as *the same text*: equal after Unicode NFC
composition and whitespace collapsing. ``text_hashes`` turns that into a 16-byte key per row,
reproducible anywhere with three lines of standard library::

    import hashlib, unicodedata
    key = " ".join(unicodedata.normalize("NFC", text).split())
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()

Python's built-in ``hash()`` is salted per process, so it is never used for anything stored.
"""

from __future__ import annotations

import hashlib
import unicodedata

import numpy as np
import pyarrow as pa

from tokenloom.curate.inputs import CurateError, TextColumn, as_texts

__all__ = ["DIGEST_SIZE", "normalize_text", "text_hashes", "hashes_to_numpy"]

DIGEST_SIZE = 16
"""Bytes per text hash: 128 bits, so an accidental collision among 10^12 documents has odds
below 10^-14."""


def normalize_text(s: str, *, lowercase: bool = False) -> str:
    """Normalise one document for comparison.

    Exactly these steps, in order:

    1. Unicode NFC composition (``"e\\u0301"`` becomes ``"\\u00e9"``); compatibility characters
       such as ligatures and full-width forms are *kept* (that would be NFKC).
    2. Every run of whitespace -- any character for which ``str.isspace()`` is true: spaces,
       tabs, newlines, ``\\r``, no-break space, the Unicode line/paragraph separators -- becomes
       one ASCII space, and leading/trailing whitespace is removed. Line structure is therefore
       *not* significant: a re-wrapped paragraph is the same text.
    3. Only when ``lowercase=True``: ``str.lower()`` (full Unicode lowercasing). Off by default,
       because case is content ("US" and "us" differ).

    Nothing else changes: punctuation, digits, zero-width characters and control characters
    other than whitespace are kept.

    Args:
        s: The document.
        lowercase: Also lowercase the result.

    Returns:
        The normalised text; ``""`` for an empty or all-whitespace document.
    """
    out = " ".join(unicodedata.normalize("NFC", s).split())
    return out.lower() if lowercase else out


def text_hashes(texts: TextColumn, *, lowercase: bool = False) -> pa.FixedSizeBinaryArray:
    """Hash each document's normalised text: the exact-duplicate key.

    Each value is ``blake2b(normalize_text(s, lowercase=lowercase).encode("utf-8"),
    digest_size=16)``: deterministic across processes, machines and Python versions. Two rows
    get the same hash exactly when their normalised texts are equal (up to a 2^-128 collision).

    Args:
        texts: ``(N,)`` documents: an Arrow string/large_string column or a list of ``str``.
        lowercase: Normalise case too (see :func:`normalize_text`).

    Returns:
        ``(N,)`` ``fixed_size_binary(16)``; a null text gives a null hash.

    Raises:
        CurateError: ``texts`` is not a column of strings, or holds a lone surrogate.
    """
    rows = as_texts(texts)
    digests = bytearray()
    valid = np.ones(len(rows), dtype=bool)
    null = bytes(DIGEST_SIZE)
    for i, s in enumerate(rows):  # one C-level hash call per row; hashlib is the cost here
        if s is None:
            valid[i] = False
            digests += null
            continue
        try:
            key = normalize_text(s, lowercase=lowercase).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CurateError(
                f"text {i} is not valid Unicode ({exc.reason}); repair it first, "
                f"e.g. `s.encode('utf-8', 'replace').decode()`"
            ) from exc
        digests += hashlib.blake2b(key, digest_size=DIGEST_SIZE).digest()
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(DIGEST_SIZE), len(rows), [validity, pa.py_buffer(bytes(digests))]
    )


def hashes_to_numpy(hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """View a ``fixed_size_binary(16)`` column as ``(N, 16) uint8`` (a copy only if chunked).

    Raises:
        CurateError: Another type, or null hashes (hash only non-null texts, or filter first).
    """
    if isinstance(hashes, pa.ChunkedArray):
        hashes = hashes.combine_chunks()
    if hashes.type != pa.binary(DIGEST_SIZE):
        raise CurateError(f"hashes must be fixed_size_binary({DIGEST_SIZE}), not {hashes.type}")
    if hashes.null_count:
        raise CurateError(
            f"hashes hold {hashes.null_count} null(s) (null texts); exclude those rows first, "
            f"e.g. with the filter `text IS NOT NULL`"
        )
    buf = hashes.buffers()[1]
    flat = np.frombuffer(buf, dtype=np.uint8)
    start = hashes.offset * DIGEST_SIZE
    return flat[start : start + len(hashes) * DIGEST_SIZE].reshape(len(hashes), DIGEST_SIZE)
