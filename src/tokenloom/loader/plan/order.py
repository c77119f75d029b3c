"""Curriculum order: an epoch visited by key columns, shuffled locally in buckets (pure numpy).

``order_by="quality DESC"`` replaces the uniform permutation of an epoch with the rows sorted by
their key, and ``order_jitter=N`` shuffles each run of ``N`` consecutive documents of that sorted
order by ``(seed, epoch)``: a curriculum with local randomness. The rules, exactly:

* **Spelling** (:func:`parse_order_by`): ``column [ASC|DESC] [NULLS FIRST|NULLS LAST]``, several
  separated by commas, keywords in any case, a column named as is or in backquotes. ``ASC`` is
  the default direction.
* **Nulls** (and NaN, which has no place in an order) sort **last** whatever the direction,
  unless ``NULLS FIRST`` is written; they are counted (:attr:`Ordering.null_rows`).
* **Ties** (equal keys on every column) keep ascending table ``id`` order (the selection's own
  order): the sorted order is a function of the stored values alone, the same every epoch.
* **Buckets** (:func:`curriculum_order`): the *documents* (non-empty rows, as the stream holds
  them) of the sorted order are cut into consecutive buckets of ``N``, the last one shorter.
  Document ``k`` draws key ``raw[k]``, the ``k``-th raw 64-bit output of the epoch's generator
  (:func:`~tokenloom.loader.plan.shuffle.epoch_rng`), and each bucket is visited by ``(raw[k], k)``
  ascending. ``N = 1`` is the strict sorted order; ``N >= n`` one uniform shuffle. A document
  moves at most ``N - 1`` places from its sorted rank.

The sorted order is computed once per selection (a table version pins the key's values) and held
as the permutation itself, :func:`~tokenloom.loader.plan.shuffle.order_dtype` positions into the
selection (4 bytes per row), never the key values. :data:`ORDER_ALGORITHM` names these rules
and belongs in the plan's fingerprint. :func:`naive_curriculum_order` is the slow reference.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tokenloom.loader.plan.shuffle import epoch_rng, order_dtype, stable_argsort_u64

__all__ = [
    "ORDER_ALGORITHM",
    "OrderKey",
    "Ordering",
    "OrderError",
    "ranked_digest",
    "parse_order_by",
    "format_order_by",
    "rank_rows",
    "naive_rank_rows",
    "float_codes",
    "int_codes",
    "key_codes",
    "sort_codes",
    "curriculum_order",
    "naive_curriculum_order",
]

ORDER_ALGORITHM = "order-by-v1;nulls-nan-flagged;ties-by-id;buckets-by-raw-pcg64[seed,epoch]"
"""Identity of the ordering rules (part of the plan's fingerprint)."""

_CHUNK = 1 << 18  # documents shuffled per pass (whole buckets; one bucket when it is larger)


class OrderError(ValueError):
    """An ``order_by`` text that does not parse (the spec turns it into a ``PlanError``)."""


@dataclass(frozen=True, slots=True)
class OrderKey:
    """One key column of an ``order_by``."""

    column: str
    """The column's name."""
    descending: bool = False
    """``DESC``: largest first."""
    nulls_first: bool = False
    """``NULLS FIRST``: rows without a value (null or NaN) before the others."""

    def __str__(self) -> str:
        name = self.column if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.column) else None
        name = name or "`" + self.column + "`"
        return (
            f"{name} {'DESC' if self.descending else 'ASC'} "
            f"NULLS {'FIRST' if self.nulls_first else 'LAST'}"
        )


_TERM = re.compile(
    r"""^\s*(?:`(?P<quoted>[^`]+)`|(?P<name>[A-Za-z_][A-Za-z0-9_]*))
        (?:\s+(?P<dir>ASC|DESC))?
        (?:\s+NULLS\s+(?P<nulls>FIRST|LAST))?\s*$""",
    re.IGNORECASE | re.VERBOSE,
)


def parse_order_by(text: str) -> tuple[OrderKey, ...]:
    """The key columns of an ``order_by`` text (see the module docstring).

    Raises:
        OrderError: Empty, a term that does not parse (named, with the spelling), or a column
            named twice.
    """
    if not isinstance(text, str) or not text.strip():
        raise OrderError(f"order_by must name a key, e.g. 'quality DESC', got {text!r}")
    keys: list[OrderKey] = []
    for term in text.split(","):
        m = _TERM.match(term)
        if m is None:
            raise OrderError(
                f"order_by term {term.strip()!r} of {text!r} does not parse; spell each term "
                "`NAME [ASC|DESC] [NULLS FIRST|NULLS LAST]`, terms separated by commas "
                "(e.g. 'quality DESC, n_tokens ASC'; a name with other characters in backquotes)"
            )
        keys.append(
            OrderKey(
                column=m.group("quoted") or m.group("name"),
                descending=(m.group("dir") or "ASC").upper() == "DESC",
                nulls_first=(m.group("nulls") or "LAST").upper() == "FIRST",
            )
        )
    names = [k.column for k in keys]
    if len(set(names)) != len(names):
        raise OrderError(f"order_by names a key twice: {text!r}")
    return tuple(keys)


def format_order_by(keys: Sequence[OrderKey]) -> str:
    """The canonical spelling of ``keys`` (every direction and null rule written out)."""
    return ", ".join(str(k) for k in keys)


def _sortable(values: np.ndarray, missing: np.ndarray, descending: bool) -> np.ndarray:
    """``values`` as an array whose ascending order is the key's order (nulls set apart)."""
    v = np.asarray(values)
    if v.dtype == np.bool_:
        v = v.astype(np.uint8)
    if np.issubdtype(v.dtype, np.datetime64) or np.issubdtype(v.dtype, np.timedelta64):
        v = v.view(np.int64)
    if not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise OrderError(f"cannot order by values of dtype {v.dtype}")
    # Rows without a value tie with each other (one constant), whatever is stored under them.
    v = np.where(missing, v.dtype.type(0), v)
    if np.issubdtype(v.dtype, np.floating):
        return -v if descending else v  # -0.0 and 0.0 tie, as they compare equal
    return np.invert(v) if descending else v  # ~x reverses the order, without overflow


_MISSING_LOW, _MISSING_HIGH = np.uint32(0), np.uint32(0xFFFFFFFF)


def float_codes(values: np.ndarray, missing: np.ndarray, key: OrderKey) -> np.ndarray | None:
    """``uint32`` codes of one float key whose ascending order is the key's order, or ``None``
    when a value is not exactly a float32 (then :func:`rank_rows`' general sort applies).

    The float32 bits made order-preserving (negative: all bits flipped; else the sign bit set),
    ``-0.0`` as ``0.0``; every number lands in ``[0x007FFFFF, 0xFF800000]``, so a row without
    a value (null or NaN) takes 0 (``NULLS FIRST``) or ``0xFFFFFFFF``. Element-wise: a batch at
    a time gives the same codes as the whole column.
    """
    v = np.asarray(values)
    gone = np.asarray(missing, dtype=bool) | np.isnan(v)
    f = v.astype(np.float32)
    if v.dtype != np.float32 and not bool(np.all((f == v) | gone)):
        return None
    f[f == 0] = 0.0  # -0.0 and 0.0 are equal: one code
    u = f.view(np.uint32)
    codes = np.where(u >> np.uint32(31), ~u, u | np.uint32(0x80000000))
    if key.descending:
        np.invert(codes, out=codes)  # the numbers' range is symmetric under ~
    codes[gone] = _MISSING_LOW if key.nulls_first else _MISSING_HIGH
    return codes


def int_codes(values: np.ndarray, missing: np.ndarray, key: OrderKey) -> np.ndarray | None:
    """``uint32`` codes of one integer (bool, date, time) key, ``1 + value - min`` (reversed for
    ``DESC``), 0 or ``0xFFFFFFFF`` without a value; ``None`` when the values span ``2**32 - 2``
    or more."""
    v = np.asarray(values)
    if v.dtype == np.bool_:
        v = v.view(np.uint8)
    if np.issubdtype(v.dtype, np.datetime64) or np.issubdtype(v.dtype, np.timedelta64):
        v = v.view(np.int64)
    gone = np.asarray(missing, dtype=bool)
    present = v[~gone] if gone.any() else v
    codes = np.empty(v.shape[0], dtype=np.uint32)
    if present.size == 0:
        codes[:] = _MISSING_LOW if key.nulls_first else _MISSING_HIGH
        return codes
    lo, hi = int(present.min()), int(present.max())
    if hi - lo > 0xFFFFFFFF - 2:
        return None
    span = np.uint64(hi - lo + 2)
    for a in range(0, v.shape[0], _CHUNK):  # modulo 2**64: exact for every present value
        part = v[a : a + _CHUNK].astype(np.uint64) - np.uint64(lo % (1 << 64)) + np.uint64(1)
        if key.descending:
            part = span - part
        codes[a : a + _CHUNK] = part.astype(np.uint32)  # wrong only where a value is missing
    codes[gone] = _MISSING_LOW if key.nulls_first else _MISSING_HIGH
    return codes


def sort_codes(codes: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Positions sorted by ``(codes[i], i)``: the packed sort of
    :func:`~tokenloom.loader.plan.shuffle.stable_argsort_u64` with each code whole in the top bits,
    so no tie needs repair (8.75 bytes per row at the peak measured at 17.5M rows, codes and
    result included, instead of ``argsort``'s 16 and more)."""
    n = int(codes.shape[0])
    # The codes' span moved to the top bits (present codes 1.., the two no-value codes around
    # them): the packed sort deals values into buckets by their top bits, and codes sharing
    # them (scores in [0, 1] share their float exponent bits) would fill one bucket, sorted in
    # one group of 8 bytes per row.
    lo, hi = np.uint32(0xFFFFFFFF), np.uint32(0)
    for a in range(0, n, _CHUNK):
        part = codes[a : a + _CHUNK]
        present = part[(part != _MISSING_LOW) & (part != _MISSING_HIGH)]
        if present.size:
            lo, hi = min(lo, present.min()), max(hi, present.max())
    span = int(hi) - int(lo) + 2 if hi >= lo else 1
    top = np.uint64(64 - span.bit_length())
    base = np.uint64(int(lo) - 1) if hi >= lo else np.uint64(0)

    def chunks():  # noqa: ANN202
        for a in range(0, n, _CHUNK):
            part = codes[a : a + _CHUNK]
            dense = part.astype(np.uint64) - base
            dense[part == _MISSING_LOW] = 0
            dense[part == _MISSING_HIGH] = span
            yield dense << top

    return stable_argsort_u64(n, chunks, exact=True, out=out)


def key_codes(values: np.ndarray, missing: np.ndarray, key: OrderKey) -> np.ndarray | None:
    """:func:`float_codes` or :func:`int_codes` by the values' dtype."""
    if np.issubdtype(np.asarray(values).dtype, np.floating):
        return float_codes(values, missing, key)
    return int_codes(values, missing, key)


def rank_rows(
    columns: Sequence[tuple[np.ndarray, np.ndarray]], keys: Sequence[OrderKey]
) -> np.ndarray:
    """The selection's rows sorted by ``keys``: a stable sort, one key at a time, last first.

    One key whose values fit 32-bit codes (:func:`key_codes`) is sorted as codes
    (:func:`sort_codes`); the general sort (any number of keys, float64 values) holds about 20
    bytes per row more at its peak.

    Args:
        columns: Per key, ``(values, missing)``: ``(N,)`` numeric values (bool, int, float,
            datetime) of the selection's rows in their order, and ``(N,)`` bool, True where the
            row has no value (null; NaN is flagged here too).
        keys: The :class:`OrderKey` of each column.

    Returns:
        ``(N,)`` :func:`~tokenloom.loader.plan.shuffle.order_dtype` positions into the selection, in
        key order (ties: ascending position).
    """
    if len(columns) != len(keys) or not keys:
        raise OrderError(f"{len(columns)} key columns for {len(keys)} keys")
    n = int(np.asarray(columns[0][0]).shape[0])
    if len(keys) == 1 and n <= 1 << 32:
        codes = key_codes(columns[0][0], columns[0][1], keys[0])
        if codes is not None:
            return sort_codes(codes)
    order: np.ndarray | None = None  # None: the identity
    for (values, missing), key in zip(reversed(columns), reversed(keys), strict=True):
        missing = np.asarray(missing, dtype=bool)
        v = np.asarray(values)
        if np.issubdtype(v.dtype, np.floating):
            missing = missing | np.isnan(v)
        sortable = _sortable(v, missing, key.descending)
        if order is not None:
            sortable, missing = sortable[order], missing[order]
        # Nulls first or last: the null flag is the primary key of this pass (stable).
        flag = ~missing if key.nulls_first else missing
        step = np.lexsort((sortable, flag))
        order = step if order is None else order[step]
    assert order is not None
    return order.astype(order_dtype(n), copy=False)


def naive_rank_rows(columns: Sequence[Sequence[object]], keys: Sequence[OrderKey]) -> list[int]:
    """Slow reference of :func:`rank_rows` on Python values (``None`` or NaN: no value)."""

    def missing(x: object) -> bool:
        return x is None or (isinstance(x, float) and x != x)

    def sort_key(i: int) -> tuple:
        out: list[object] = []
        for col, key in zip(columns, keys, strict=True):
            x = col[i]
            gone = missing(x)
            out.append((not gone) if key.nulls_first else gone)
            value = 0 if gone else x
            out.append(-value if key.descending else value)  # type: ignore[operator]
        return (*out, i)

    n = len(columns[0])
    return sorted(range(n), key=sort_key)


def ranked_digest(ranked: np.ndarray) -> str:
    """Digest of a sorted order's positions (their int64 bytes, whatever the dtype)."""
    h = hashlib.sha256(f"ranked;{ranked.shape[0]};".encode())
    for a in range(0, ranked.shape[0], 1 << 22):
        h.update(np.ascontiguousarray(ranked[a : a + (1 << 22)], np.int64).data)
    return h.hexdigest()[:24]


@dataclass(frozen=True, kw_only=True, eq=False)
class Ordering:
    """A selection's sorted order and its bucket rule: what :func:`curriculum_order` reads."""

    ranked: np.ndarray
    """``(N,)`` positions into the selection in key order (:func:`rank_rows`), read-only."""
    jitter: int
    """Documents per shuffled bucket (1: the strict sorted order)."""
    null_rows: int = 0
    """Selected rows without a value (null or NaN) in some key column."""
    by: str = ""
    """The canonical ``order_by`` (for messages)."""
    shared: str | None = None
    """The plan store directory ``ranked`` is mapped from (``None``: in this process)."""
    ranked_digest: str = ""
    """:func:`ranked_digest` of ``ranked`` (computed when empty)."""
    remap: Callable[..., Ordering] | None = None
    """How another process maps ``ranked`` back from ``shared`` (given by the plan store's
    side, :func:`~tokenloom.loader.pipeline.inputs.scan_ordering`; this module reads no
    files): called as ``remap(shared, jitter, null_rows, by, ranked_digest)``."""

    def __post_init__(self) -> None:
        if not self.ranked_digest:
            object.__setattr__(self, "ranked_digest", ranked_digest(self.ranked))

    @property
    def digest(self) -> str:
        """What the visiting order depends on besides the selection and ``(seed, epoch)``: the
        sorted order, the buckets and :data:`ORDER_ALGORITHM` (a plan store layout key)."""
        text = f"{ORDER_ALGORITHM};{self.ranked_digest};jitter={self.jitter}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __reduce__(self) -> tuple:
        # A worker maps the store's file instead of receiving a copy of the permutation.
        state = (self.jitter, self.null_rows, self.by, self.ranked_digest)
        if self.remap is not None and self.shared is not None and os.path.isdir(self.shared):
            return (self.remap, (self.shared, *state))
        return (_ordering, (self.ranked, *state))


def _ordering(ranked, jitter, null_rows, by, digest):  # noqa: ANN001, ANN202
    return Ordering(ranked=ranked, jitter=jitter, null_rows=null_rows, by=by, ranked_digest=digest)


def _raw(seed: int, epoch: int, lo: int, n: int) -> np.ndarray:
    """Raw outputs ``lo .. lo + n - 1`` of the epoch's generator."""
    bit = epoch_rng(seed=seed, epoch=epoch).bit_generator
    if lo:
        bit.advance(lo)  # PCG64: as if ``lo`` outputs had been drawn
    return bit.random_raw(n)


def curriculum_order(
    lens: np.ndarray,
    ordering: Ordering,
    *,
    seed: int,
    epoch: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Positions of the non-empty rows of ``lens`` in curriculum order (module docstring).

    Args:
        lens: ``(N,)`` token counts ``>= 0`` of the selection.
        ordering: Its :class:`Ordering` (``ranked`` of length ``N``).
        seed: The job's seed.
        epoch: The epoch.
        out: Optional ``(n,)`` array of ``order_dtype(N)`` to write into (the plan store's file).

    Returns:
        ``(n,)`` positions into ``lens`` of its ``n`` non-empty rows.
    """
    ranked = ordering.ranked
    N = int(lens.shape[0])
    if ranked.shape != (N,):
        raise ValueError(f"the sorted order holds {ranked.shape[0]} rows, the selection {N}")
    dtype = np.dtype(order_dtype(N))
    n = 0
    for a in range(0, N, _CHUNK):  # count first: ``out`` may be the store's file of size n
        n += int(np.count_nonzero(lens[ranked[a : a + _CHUNK]]))
    if out is None:
        out = np.empty(n, dtype=dtype)
    elif out.shape != (n,) or out.dtype != dtype:
        raise ValueError(f"out must be ({n},) {dtype}, got {out.shape} {out.dtype}")
    at = 0
    for a in range(0, N, _CHUNK):  # the documents in sorted order
        part = ranked[a : a + _CHUNK]
        kept = part[lens[part] > 0]
        out[at : at + kept.shape[0]] = kept
        at += kept.shape[0]
    J = int(ordering.jitter)
    if J <= 1 or n <= 1:
        return out
    group = J if J > _CHUNK else (_CHUNK // J) * J  # whole buckets per pass
    for a in range(0, n, group):
        b = min(a + group, n)
        if J > _CHUNK:  # one large bucket: the packed sort of its raw keys

            def chunks(a: int = a, b: int = b):  # noqa: ANN202
                for c in range(a, b, _CHUNK):
                    yield _raw(seed, epoch, c, min(_CHUNK, b - c))

            perm = stable_argsort_u64(b - a, chunks)
        else:
            keys = _raw(seed, epoch, a, b - a)
            perm = np.lexsort((keys, np.arange(b - a) // J))  # by (bucket, raw key, position)
        out[a:b] = out[a:b][perm]
    return out


def naive_curriculum_order(
    lens: Sequence[int], ranked: Sequence[int], *, jitter: int, seed: int, epoch: int
) -> list[int]:
    """Slow reference of :func:`curriculum_order`: drop empty rows, bucket, sort each bucket
    by ``(raw key, index)``."""
    docs = [int(p) for p in ranked if lens[int(p)] > 0]
    raw = epoch_rng(seed=seed, epoch=epoch).bit_generator.random_raw(len(docs))
    out: list[int] = []
    for a in range(0, len(docs), max(int(jitter), 1)):
        idx = range(a, min(a + max(int(jitter), 1), len(docs)))
        out += [docs[k] for k in sorted(idx, key=lambda k: (int(raw[k]), k))]
    return out
