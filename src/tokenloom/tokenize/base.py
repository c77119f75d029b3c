"""The ``Tokenizer`` interface every backend implements, and the Arrow form of its output.

A tokenizer turns a batch of texts into one pyarrow ``list<uint16>`` array (``list<int32>`` when
the vocabulary does not fit in 16 bits), built from one flat numpy array of ids plus offsets, so
no Python object is made per token. Special tokens are never added: the loader appends EOS when it
packs documents, so the stored ids are exactly the text's.

A tokenizer pickles as its spec plus its ``vocab_hash``: a spawned backfill worker re-creates it
with :func:`~tokenloom.tokenize.load_tokenizer` and refuses to run if the vocabulary it finds there
hashes differently.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "EncodeError",
    "TextBatch",
    "UINT16_VOCAB_LIMIT",
    "id_type_for",
    "ids_to_list_array",
    "texts_to_list",
    "default_num_threads",
]

UINT16_VOCAB_LIMIT = 65536
"""Largest vocabulary whose ids (``0 .. vocab_size - 1``) all fit in ``uint16``."""

_INT32_MAX = 2**31 - 1

TextBatch = Sequence["str | None"] | pa.Array | pa.ChunkedArray
"""What ``encode_batch`` takes: a list of texts or an Arrow string array (nulls allowed)."""


class TokenizerError(TokenloomError):
    """A tokenizer spec cannot be loaded, or a batch cannot be encoded as asked."""


class EncodeError(TokenizerError):
    """The tokenizer itself failed on a text: its backend raised or panicked (a Rust panic is a
    ``BaseException``), e.g. a ``tokenizer.json`` regex over Oniguruma's retry limit.

    ``index`` is the position of the first failing text in the batch given to
    :meth:`Tokenizer.encode_batch`; the message names the tokenizer, not the position, so callers
    that know the row id (the backfill engine, the round-trip check) add it.
    """

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.index))


_STOPS = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""Exceptions that stop the process rather than report a failing text."""


def default_num_threads() -> int:
    """Threads a tokenizer uses for one batch: the CPUs, at most 8 (tiktoken's own default)."""
    return max(1, min(8, os.cpu_count() or 1))


def id_type_for(vocab_size: int) -> pa.DataType:
    """The Arrow type of one token id for a vocabulary of ``vocab_size`` ids.

    Args:
        vocab_size: Number of ids, i.e. the largest id plus one.

    Returns:
        ``pa.uint16()`` when every id fits in 16 bits (``vocab_size <= 65536``), else
        ``pa.int32()`` (signed, as torch and most loaders want).

    Raises:
        ValueError: ``vocab_size`` is below 1.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    return pa.uint16() if vocab_size <= UINT16_VOCAB_LIMIT else pa.int32()


def texts_to_list(texts: TextBatch) -> list[str | None]:
    """Turn a batch of texts into a Python list (``None`` for nulls).

    Raises:
        TokenizerError: An item is neither ``str`` nor ``None``, or the Arrow array is not of a
            string type.
    """
    if isinstance(texts, pa.ChunkedArray | pa.Array):
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            raise TokenizerError(
                f"encode_batch takes a string array, got Arrow type {texts.type}; "
                "cast it with `.cast(pa.string())` first"
            )
        return texts.to_pylist()
    out = list(texts)
    for i, text in enumerate(out):
        if text is not None and not isinstance(text, str):
            raise TokenizerError(
                f"encode_batch takes texts (str or None), but item {i} is "
                f"{type(text).__name__}: {text!r:.60}"
            )
    return out


def ids_to_list_array(
    chunks: Sequence[np.ndarray], id_type: pa.DataType, *, nulls: np.ndarray | None = None
) -> pa.ListArray:
    """Build one Arrow list array from one id array per document, without a per-token loop.

    Args:
        chunks: One 1-D integer array per document, shape ``(n_tokens_i,)``.
        id_type: ``pa.uint16()`` or ``pa.int32()``; ids are cast to it (the caller guarantees
            they fit).
        nulls: Optional boolean mask, shape ``(len(chunks),)``: ``True`` marks a null document
            (its chunk must be empty).

    Returns:
        ``list<id_type>`` with ``len(chunks)`` entries.

    Raises:
        TokenizerError: The batch holds more than 2**31 - 1 tokens (Arrow ``list`` offsets are
            32-bit); split it into smaller batches.
    """
    np_type = np.uint16 if id_type == pa.uint16() else np.int32
    lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total > _INT32_MAX:
        raise TokenizerError(
            f"one batch encoded to {total:,} tokens, more than an Arrow list array holds "
            f"({_INT32_MAX:,}); encode fewer texts per batch"
        )
    flat = np.empty(total, dtype=np_type)
    if chunks:
        # one pass: concatenate and narrow at once (ids are below vocab_size, so nothing wraps)
        np.concatenate(chunks, out=flat, casting="unsafe")
    mask = None if nulls is None or not nulls.any() else pa.array(nulls, type=pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        pa.array(flat, type=id_type),
        type=pa.list_(id_type),
        mask=mask,
    )


def _as_id_list(ids: Any) -> list[int]:
    """Ids from a list, a numpy array, an Arrow array or an Arrow list scalar, as Python ints."""
    if isinstance(ids, pa.ListScalar):
        ids = ids.values if ids.is_valid else []
    if isinstance(ids, pa.Array | pa.ChunkedArray):
        ids = ids.to_numpy(zero_copy_only=False)
    if isinstance(ids, np.ndarray):
        return ids.astype(np.int64, copy=False).tolist()
    return [int(i) for i in ids]


class Tokenizer(abc.ABC):
    """A loaded tokenizer: encode batches of texts to Arrow ids, decode ids back to text.

    Backends subclass this and implement :meth:`_encode_chunks`, :meth:`decode` and
    :meth:`_canonical_bytes`; everything else is shared.
    """

    def __init__(
        self,
        *,
        name: str,
        vocab_size: int,
        eos_id: int,
        bos_id: int | None = None,
        pad_id: int | None = None,
        num_threads: int | None = None,
    ) -> None:
        for what, value in (("eos_id", eos_id), ("bos_id", bos_id), ("pad_id", pad_id)):
            if value is not None and not 0 <= value < vocab_size:
                raise TokenizerError(
                    f"tokenizer {name!r}: {what}={value} is outside its vocabulary "
                    f"(0..{vocab_size - 1})"
                )
        self.name = name
        """The canonical spec: ``load_tokenizer(name)`` loads this tokenizer again."""
        self.vocab_size = vocab_size
        """Number of ids (largest id plus one), special tokens included."""
        self.eos_id = eos_id
        """End-of-text id; the loader appends it after each document."""
        self.bos_id = bos_id
        """Beginning-of-text id, or ``None`` when the tokenizer has none."""
        self.pad_id = pad_id
        """Padding id, or ``None`` when the tokenizer has none."""
        self.num_threads = num_threads or default_num_threads()
        """Threads used to encode or decode one batch (not part of the identity)."""

    # -- backend hooks -----------------------------------------------------------------------

    @abc.abstractmethod
    def _encode_chunks(self, texts: list[str]) -> list[np.ndarray]:
        """Encode texts without special tokens: one 1-D integer id array per text."""

    @abc.abstractmethod
    def _canonical_bytes(self) -> bytes:
        """The bytes ``vocab_hash`` digests: everything that decides which ids a text gets."""

    @abc.abstractmethod
    def decode(self, ids: Any) -> str:
        """Decode ids (a list, numpy array or Arrow array/list scalar) back to text.

        Special-token ids are decoded to their text; invalid UTF-8 (ids cut mid-character)
        becomes U+FFFD.
        """

    def _decode_many(self, docs: list[list[int]]) -> list[str]:
        """Decode many id lists; backends override this with their parallel batch decoder."""
        return [self.decode(doc) for doc in docs]

    def decode_batch(self, ids: pa.Array | pa.ChunkedArray | Sequence[Any]) -> list[str | None]:
        """Decode many documents: an Arrow list array (nulls give ``None``) or a list of ids."""
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not isinstance(ids, pa.Array):
            return list(self._decode_many([_as_id_list(doc) for doc in ids]))
        flat = ids.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        offsets = ids.offsets.to_numpy()  # relative to ids.values, slicing included
        valid = ids.is_valid().to_numpy(zero_copy_only=False)
        docs = [flat[offsets[i] : offsets[i + 1]].tolist() for i in np.flatnonzero(valid)]
        decoded = iter(self._decode_many(docs))
        return [next(decoded) if ok else None for ok in valid]

    # -- shared ------------------------------------------------------------------------------

    @property
    def id_type(self) -> pa.DataType:
        """Arrow type of one id: ``pa.uint16()`` up to 65,536 ids, else ``pa.int32()``."""
        return id_type_for(self.vocab_size)

    @property
    def list_type(self) -> pa.DataType:
        """Arrow type of one encoded document: ``list<id_type>``."""
        return pa.list_(self.id_type)

    @cached_property
    def vocab_hash(self) -> str:
        """Hex SHA-256 of the canonical vocabulary bytes; the same on every process and machine."""
        import hashlib

        return hashlib.sha256(self._canonical_bytes()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """What pins this tokenizer, JSON-ready, for column metadata and checkpoints.

        Returns:
            ``{"name", "vocab_size", "vocab_hash", "eos_id", "bos_id", "pad_id"}``.
        """
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "vocab_hash": self.vocab_hash,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "pad_id": self.pad_id,
        }

    def encode_batch(self, texts: TextBatch) -> pa.ListArray:
        """Encode texts to token ids, without adding any special token.

        Args:
            texts: A list of ``str`` (``None`` allowed) or an Arrow string array.

        Returns:
            ``list<uint16>`` (or ``list<int32>`` for vocabularies above 65,536 ids), one entry
            per text; a null text gives a null entry, an empty text an empty list.

        Raises:
            TokenizerError: An item is not text, or the batch holds over 2**31 - 1 tokens.
        """
        items = texts_to_list(texts)
        nulls = np.fromiter((t is None for t in items), dtype=bool, count=len(items))
        if nulls.any():
            present = [t for t in items if t is not None]
            encoded = iter(self._checked_encode(present))
            empty = np.zeros(0, dtype=np.uint32)
            chunks = [empty if is_null else next(encoded) for is_null in nulls]
        else:
            chunks = self._checked_encode(items)  # type: ignore[arg-type]  # no None here
        return ids_to_list_array(chunks, self.id_type, nulls=nulls)

    def encode(self, text: str) -> list[int]:
        """Encode one text to a list of ids (convenience; use :meth:`encode_batch` for data)."""
        return self._checked_encode([text])[0].astype(np.int64).tolist()

    def _checked_encode(self, texts: list[str]) -> list[np.ndarray]:
        """:meth:`_encode_chunks`, with a failure of the backend as an :class:`EncodeError`.

        Raises:
            EncodeError: naming this tokenizer, with the index of the first failing text (found
                by encoding the texts one by one: the error path only).
        """
        try:
            return self._encode_chunks(texts)
        except TokenizerError:
            raise
        except BaseException as exc:
            if isinstance(exc, _STOPS):
                raise
            first = exc
        index = 0  # when only the whole batch fails
        for i, text in enumerate(texts):
            try:
                self._encode_chunks([text])
            except BaseException as exc:
                if isinstance(exc, _STOPS):
                    raise
                first, index = exc, i
                break
        detail = str(first).strip().rstrip(".")[:1000] or "(no message)"
        raise EncodeError(
            f"tokenizer {self.name!r} cannot encode a text ({len(texts[index]):,} characters): "
            f"{type(first).__name__}: {detail}. Fix the tokenizer (a pre-tokenizer or normalizer "
            "regex that blows up on long input is the usual cause), or leave such rows out.",
            index,
        ) from None

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle as the spec: the worker re-creates the tokenizer and checks the vocabulary hash.
        return (_restore, (self.name, self.num_threads, self.vocab_hash))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"eos_id={self.eos_id}, vocab_hash={self.vocab_hash[:12]}…)"
        )


_RESTORED: dict[tuple[str, int, str], Tokenizer] = {}


def _restore(spec: str, num_threads: int, vocab_hash: str) -> Tokenizer:
    """Unpickle: load ``spec`` again (once per process) and check it is the same vocabulary."""
    key = (spec, num_threads, vocab_hash)
    cached = _RESTORED.get(key)
    if cached is not None:
        return cached
    from tokenloom.tokenize.registry import load_tokenizer

    tok = load_tokenizer(spec, num_threads=num_threads)
    if tok.vocab_hash != vocab_hash:
        raise TokenizerError(
            f"tokenizer {spec!r} loads here with vocab_hash {tok.vocab_hash[:12]}…, but the "
            f"pickled one had {vocab_hash[:12]}…: the files behind the spec differ on this "
            "process or machine; install the same tokenizer files everywhere"
        )
    _RESTORED[key] = tok
    return tok
