"""``CompactInts``: a read-only integer column in a few bits per value, read by gathers.

The plan's inputs (table ``id``, ``n_tokens`` and Lance ``_rowid`` of every selected row) are held
by every node for the whole job, so their size per row counts. Each column is cut into chunks of
:data:`CHUNK` values stored *frame of reference*: per chunk one 64-bit ``base`` and every value
as ``value - base - slope * j`` (``j``: position in the chunk) in the fewest bits that hold the
chunk's largest residual, bit-packed. ``slope`` is 0 or 1 per column, whichever is smaller: 1
turns a run of consecutive ids into zero-bit residuals. A column may also be stored relative to
another aligned column (``ref``): ``_rowid - id`` is constant over long runs of a table whose rows
were written in id order, so the row ids cost almost nothing beside the ids.

What it costs: 12 bytes per chunk of headers (``base`` + a 32-bit byte offset; 64-bit offsets
from 4 GiB of residuals) plus the residual bits: about 1.8 B/row for lognormal token counts
(median 450), 0.1 B/row for consecutive ids. Widths from 57 bits are stored as 64 so that one
unaligned 8-byte load reads any value: a gather of ``k`` values is ~15 vectorised numpy
operations on ``k`` elements, whatever the data. Values are exact (int32/int64/uint32/uint64,
the full range, negative values included: signed values are mapped to ``uint64`` by flipping the
sign bit, which keeps their order).

Summaries are computed once when encoding (``sum``, ``min``, ``max``, zeros, sortedness), so the
checks the planner makes cost nothing. A column converts to a plain array only when asked
(``np.asarray``, :meth:`CompactInts.astype`, :meth:`CompactInts.tolist`); arithmetic and
comparisons on it raise ``TypeError`` instead of silently building a full-size array.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "CHUNK",
    "COMPACT_FORMAT",
    "CompactInts",
    "encode",
    "naive_decode",
    "count_nonzero",
    "nonzero_positions",
]

CHUNK = 128
"""Values per chunk (one ``base`` and one width each)."""

COMPACT_FORMAT = f"for-bitpack-v1;chunk={CHUNK};wide=57->64;le"
"""Identity of the encoding (part of the plan store's input format)."""

_WIDE = 57  # residual widths from here are stored as 64 bits (one 8-byte load reads any other)
_BATCH = (1 << 20) // CHUNK  # chunks encoded per pass (1M values: bounds the temporaries)
_BLOCK = 1 << 20  # values decoded per pass when iterating
_SIGN = np.uint64(1 << 63)
_MASKS = np.array([(1 << w) - 1 for w in range(64)] + [(1 << 64) - 1], dtype=np.uint64)
_SHIFT = CHUNK.bit_length() - 1
_DTYPES = {np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64)}


def _signed(dtype: np.dtype) -> bool:
    return dtype.kind == "i"


def _to_u(x: np.ndarray, signed: bool) -> np.ndarray:
    """Order-preserving map to uint64 (signed values: the int64 bits with the sign bit flipped)."""
    if signed:
        return x.astype(np.int64, copy=False).view(np.uint64) ^ _SIGN
    return x.astype(np.uint64, copy=False)


def _from_u(u: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if _signed(dtype):
        return (u ^ _SIGN).view(np.int64).astype(dtype, copy=False)
    return u.astype(dtype, copy=False)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """``(m,)`` bits of each uint64 value (0 for 0), as int64."""
    x = x.copy()
    out = np.zeros(x.shape[0], dtype=np.int64)
    for k in (32, 16, 8, 4, 2, 1):
        big = x >= np.uint64(1 << k)
        out[big] += k
        x[big] >>= np.uint64(k)
    out += x > 0
    return out


class CompactInts:
    """A 1-D integer column, encoded as the module docstring says. Immutable.

    Supports what the loader does with its inputs: ``len``, ``col[i]``, ``col[a:b]``, gathers by
    an index array or a boolean mask (``col[idx]``, shape of ``idx``), ``sum``/``min``/``max``/
    :meth:`count_nonzero` (stored, O(1)), :meth:`searchsorted` on a sorted column, iteration by
    blocks (:meth:`blocks`) and pickling. Build one with :func:`encode`.
    """

    __array_ufunc__ = None  # ``col + 1``, ``col == 0``: TypeError, never a silent full copy
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        *,
        dtype: Any,
        n: int,
        slope: int,
        bases: np.ndarray,
        starts: np.ndarray,
        data: np.ndarray,
        stats: dict[str, Any],
        ref: CompactInts | None = None,
    ) -> None:
        self.dtype = np.dtype(dtype)
        self.n = int(n)
        self.slope = int(slope)
        self.bases = bases
        """``(chunks,)`` uint64: each chunk's frame (in the order-preserving uint64 domain)."""
        self.starts = starts
        """``(chunks + 1,)`` uint32 or int64: byte offset of each chunk's residuals in ``data``
        (a chunk of width ``w`` takes ``CHUNK * w / 8`` bytes)."""
        self.data = data
        """uint8: the packed residuals, then 8 zero bytes (every 8-byte load stays inside)."""
        self.stats = dict(stats)
        """``sum``, ``min``, ``max``, ``zeros``, ``sorted`` (non-decreasing) of the values."""
        self.ref = ref
        """The aligned column these values are stored relative to (``value - ref``), or None."""
        self._words: np.ndarray | None = None
        self._widths: np.ndarray | None = None
        self._digest: str | None = None

    # -- numpy-like surface -------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    ndim = 1

    @property
    def size(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        """Bytes this column holds (its ``ref`` not included)."""
        return int(self.bases.nbytes + self.starts.nbytes + self.data.nbytes)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return (
            f"CompactInts(n={self.n}, dtype={self.dtype}, {self.nbytes / max(self.n, 1):.2f} "
            f"B/value{', ref' if self.ref is not None else ''})"
        )

    def __eq__(self, other: object) -> bool:
        raise TypeError(
            "a CompactInts column does not compare element-wise; materialise it with "
            "np.asarray(col) (full size), or compare its blocks()"
        )

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__  # type: ignore[assignment]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._range(0, self.n)
        return out if dtype is None else out.astype(dtype, copy=False)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        """The whole column as a plain array (``n`` values: full size)."""
        return self._range(0, self.n).astype(dtype, copy=False)

    def tolist(self) -> list[int]:
        return self._range(0, self.n).tolist()

    def tobytes(self) -> bytes:
        """The plain array's bytes (as ``np.asarray(col).tobytes()``)."""
        return self._range(0, self.n).tobytes()

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, **kwargs: Any) -> Any:
        if axis not in (None, 0) or out is not None or kwargs:
            raise TypeError("CompactInts.sum supports only a whole-column sum")
        total = self.stats["sum"]
        acc = np.int64 if _signed(self.dtype) else np.uint64
        value = acc(total % (1 << 64) if acc is np.uint64 else _wrap_int64(total))
        return value if dtype is None else np.dtype(dtype).type(value)

    def min(self, *args: Any, **kwargs: Any) -> Any:
        if not self.n:
            raise ValueError("zero-size column has no minimum")
        return self.dtype.type(self.stats["min"])

    def max(self, *args: Any, **kwargs: Any) -> Any:
        if not self.n:
            raise ValueError("zero-size column has no maximum")
        return self.dtype.type(self.stats["max"])

    def count_nonzero(self) -> int:
        """Values that are not 0 (stored)."""
        return self.n - int(self.stats["zeros"])

    @property
    def is_sorted(self) -> bool:
        """The values are non-decreasing."""
        return bool(self.stats["sorted"])

    def __getitem__(self, key: Any) -> Any:
        n = self.n
        if isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} is out of bounds for a column of {n}")
            return self._take(np.array([i], dtype=np.int64))[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self._range(start, max(stop, start))
            return self._take(np.arange(start, stop, step, dtype=np.int64))
        idx = np.asarray(key)
        if idx.dtype == np.bool_:
            if idx.shape != (n,):
                raise IndexError(f"boolean index of shape {idx.shape} for a column of {n}")
            return self._take(np.flatnonzero(idx))
        if idx.size == 0:
            return np.empty(idx.shape, dtype=self.dtype)
        if not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"columns are indexed by integers, slices or masks, not {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64, copy=False)
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -n or hi >= n:
            raise IndexError(f"index {lo if lo < -n else hi} is out of bounds for a column of {n}")
        if lo < 0:
            flat = np.where(flat < 0, flat + n, flat)
        return self._take(flat).reshape(idx.shape)

    def blocks(self, size: int = _BLOCK) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, values)`` of consecutive blocks of at most ``size`` values."""
        for lo in range(0, self.n, size):
            yield lo, self._range(lo, min(lo + size, self.n))

    def searchsorted(self, v: Any, side: str = "left", sorter: Any = None) -> Any:
        """As ``np.searchsorted`` on the plain column (which must be sorted): a binary search
        over the chunks' first values, then over the ``CHUNK`` values of each chunk found."""
        if sorter is not None or side not in ("left", "right"):
            raise ValueError(f"searchsorted supports side='left'/'right' only, got {side!r}")
        if not self.is_sorted or self.ref is not None or self.slope and not self._strict:
            raise ValueError("searchsorted needs a sorted column stored without ref")
        q = np.asarray(v)
        scalar = q.ndim == 0
        flat = q.reshape(-1)
        if flat.size and not np.issubdtype(flat.dtype, np.integer):
            raise TypeError(f"searchsorted takes integers, got {flat.dtype}")
        if _signed(self.dtype):
            lo_v, hi_v = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        else:
            lo_v, hi_v = 0, np.iinfo(np.uint64).max
        if flat.size and (int(flat.min()) < lo_v or int(flat.max()) > hi_v):
            flat = np.clip(flat.astype(object), lo_v, hi_v).astype(self._wide)
        qu = _to_u(flat.astype(self._wide, copy=False), _signed(self.dtype))
        # For a sorted column each chunk's base is its first value (slope 0, or strictly
        # ascending values with slope 1): chunks [0, c) start at or below the query.
        c = np.searchsorted(self.bases, qu, side=side)
        found = c > 0  # else every value is above the query: position 0
        chunk = c[found] - 1
        # Bisect [0, size) inside the chunk: its first value is at or below the query.
        lo = np.zeros(chunk.shape[0], dtype=np.int64)
        hi = np.minimum(self.n - chunk * CHUNK, CHUNK)
        frame = self._frame(chunk)
        cmp = np.less_equal if side == "right" else np.less
        for _ in range(_SHIFT + 1):
            mid = (lo + hi) >> 1
            if not (lo < hi).any():
                break
            below = cmp(self._decode(np.minimum(mid, hi - 1), frame), qu[found]) & (lo < hi)
            lo = np.where(below, mid + 1, lo)
            hi = np.where(below, hi, np.minimum(mid, hi))
        out = np.zeros(qu.shape[0], dtype=np.intp)
        out[found] = chunk * CHUNK + lo
        return out[0] if scalar else out.reshape(q.shape)

    # -- storage ------------------------------------------------------------------------------

    def parts(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The arrays and the JSON-able meta :meth:`from_parts` rebuilds the column from."""
        meta = {
            "format": COMPACT_FORMAT,
            "dtype": self.dtype.str,
            "n": self.n,
            "slope": self.slope,
            "stats": self.stats,
        }
        return {"bases": self.bases, "starts": self.starts, "data": self.data}, meta

    @classmethod
    def from_parts(
        cls, arrays: dict[str, np.ndarray], meta: dict[str, Any], ref: CompactInts | None = None
    ) -> CompactInts:
        """A column from :meth:`parts` (e.g. mapped from files).

        Raises:
            ValueError: The parts are not of this format or do not fit together.
        """
        if meta.get("format") != COMPACT_FORMAT:
            raise ValueError(f"not a {COMPACT_FORMAT} column: {meta.get('format')!r}")
        n, bases, starts, data = int(meta["n"]), arrays["bases"], arrays["starts"], arrays["data"]
        chunks = -(-n // CHUNK)
        if (
            bases.shape != (chunks,)
            or starts.shape != (chunks + 1,)
            or data.dtype != np.uint8
            or (chunks and int(starts[-1]) + 8 != data.shape[0])
            or (ref is not None and ref.n != n)
        ):
            raise ValueError("column parts do not fit together")
        stats = dict(meta["stats"])
        return cls(
            dtype=np.dtype(meta["dtype"]),
            n=n,
            slope=int(meta["slope"]),
            bases=bases,
            starts=starts,
            data=data,
            stats=stats,
            ref=ref,
        )

    def digest(self) -> str:
        """SHA-256 of the values (of their encoding, which is a function of the values alone)."""
        if self._digest is None:
            h = hashlib.sha256(f"{COMPACT_FORMAT};{self.dtype.str};{self.n};".encode())
            h.update(f"{self.slope};".encode())
            for arr in (self.bases, self.starts, self.data):
                h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
            if self.ref is not None:
                h.update(self.ref.digest().encode())
            self._digest = h.hexdigest()
        return self._digest

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_words"] = None  # a view over data, rebuilt on first use
        state["_widths"] = None
        return state

    # -- decoding -----------------------------------------------------------------------------

    @property
    def _wide(self) -> type:
        return np.int64 if _signed(self.dtype) else np.uint64

    @property
    def _strict(self) -> bool:
        return bool(self.stats.get("strict", False))

    def _view(self) -> np.ndarray:
        """``data`` as overlapping little-endian 8-byte words, one starting at every byte."""
        if self._words is None:
            self._words = np.ndarray(
                (max(self.data.shape[0] - 7, 0),), dtype="<u8", buffer=self.data, strides=(1,)
            )
        return self._words

    def _frame(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per chunk ``c``: first bit of its residuals, width, mask and base."""
        if self._widths is None:
            self._widths = (np.diff(self.starts.astype(np.int64)) >> (_SHIFT - 3)).astype(np.uint8)
        w = self._widths[c]
        return np.left_shift(self.starts[c], 3, dtype=np.int64), w, _MASKS[w], self.bases[c]

    def _decode(
        self, j: np.ndarray, frame: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    ) -> np.ndarray:
        """Value ``j`` (position in its chunk) of each chunk of ``frame``, uint64 domain."""
        bit0, w, mask, base = frame
        bit = np.multiply(j, w, dtype=np.int64)
        bit += bit0
        word = self._view()[bit >> 3]
        word >>= np.bitwise_and(bit, 7, dtype=np.uint64, casting="unsafe")
        word &= mask
        word += base
        if self.slope:
            word += j.astype(np.uint64)
        return word

    def _take_u(self, idx: np.ndarray) -> np.ndarray:
        """Stored values (uint64 domain, ``ref`` not added) at in-range int64 positions."""
        if not idx.shape[0]:
            return np.empty(0, dtype=np.uint64)
        return self._decode(idx & (CHUNK - 1), self._frame(idx >> _SHIFT))

    def _take(self, idx: np.ndarray) -> np.ndarray:
        u = self._take_u(idx)
        if self.ref is None:
            return _from_u(u, self.dtype)
        base = _to_u_raw(self.ref._take(idx))
        return (base + (u ^ _SIGN)).view(self._wide).astype(self.dtype, copy=False)

    def _range(self, lo: int, hi: int) -> np.ndarray:
        return self._take(np.arange(lo, hi, dtype=np.int64))


def _to_u_raw(x: np.ndarray) -> np.ndarray:
    """The 64-bit two's complement bits of ``x`` as uint64 (no order mapping)."""
    if _signed(x.dtype):
        return x.astype(np.int64, copy=False).view(np.uint64)
    return x.astype(np.uint64, copy=False)


def _wrap_int64(v: int) -> int:
    v %= 1 << 64
    return v - (1 << 64) if v >= 1 << 63 else v


def _frames(u: np.ndarray, slope: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bases, residuals)`` of consecutive chunks of ``u``: ``(m,)`` and ``(m, CHUNK)``; the
    positions past the end of a short last chunk get residual 0."""
    m = -(-u.shape[0] // CHUNK)
    t = np.empty(m * CHUNK, dtype=np.uint64)
    t[: u.shape[0]] = u
    t = t.reshape(m, CHUNK)
    if slope:
        t -= np.arange(CHUNK, dtype=np.uint64)
    tail = u.shape[0] - (m - 1) * CHUNK
    if tail < CHUNK:
        t[-1, tail:] = t[-1, :tail].min()
    bases = t.min(axis=1)
    t -= bases[:, None]
    return bases, t


def _widths(r: np.ndarray) -> np.ndarray:
    w = _bit_length(r.max(axis=1))
    w[w >= _WIDE] = 64
    return w


def _pack(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Residuals ``(m, CHUNK)`` packed chunk after chunk, chunk ``i`` in ``w[i]`` bits per value:
    ``CHUNK * w[i] / 64`` little-endian words each."""
    per = w * (CHUNK // 64)  # words per chunk
    at = np.cumsum(per) - per
    words = np.zeros(int(per.sum()), dtype=np.uint64)
    for width in np.unique(w[w > 0]).tolist():
        rows = np.flatnonzero(w == width)
        sub, base = r[rows], at[rows]
        for j in range(CHUNK):
            q, s = divmod(j * width, 64)
            words[base + q] |= sub[:, j] << np.uint64(s)
            if s + width > 64:
                words[base + q + 1] |= sub[:, j] >> np.uint64(64 - s)
    return words.astype("<u8", copy=False).view(np.uint8)


def encode(
    values: Any, *, ref: CompactInts | None = None, ref_values: np.ndarray | None = None
) -> CompactInts:
    """``values`` (1-D integers) as a :class:`CompactInts`.

    Args:
        values: The column. int32, int64, uint32 and uint64 are kept as they are; other integer
            dtypes become int64 (signed) or uint64 (unsigned).
        ref: Optional aligned column (same length) to store the values relative to: worth it
            when ``values - ref`` is nearly constant (Lance row ids beside table ids).
        ref_values: ``ref``'s values as a plain array, when the caller has them (spares
            decoding them); they must equal ``ref``'s.

    Raises:
        ValueError: ``values`` is not a 1-D integer array, or ``ref`` has another length.
    """
    x = np.asarray(values)
    if x.ndim != 1 or (x.size and not np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"encode takes a 1-D integer array, got {x.dtype} {x.shape}")
    dtype = x.dtype if x.dtype in _DTYPES else np.dtype(np.int64 if x.dtype.kind == "i" else "u8")
    if x.size == 0:
        dtype = x.dtype if x.dtype in _DTYPES else np.dtype(np.int64)
    if ref is not None and ref.n != x.shape[0]:
        raise ValueError(f"ref has {ref.n} values, the column {x.shape[0]}")
    n, signed = int(x.shape[0]), _signed(dtype)
    stats: dict[str, Any] = {"sum": 0, "min": 0, "max": 0, "zeros": 0, "sorted": True}
    if n:
        total = x.sum(dtype=np.int64 if signed else np.uint64)
        stats = {
            "sum": int(total),
            "min": int(x.min()),
            "max": int(x.max()),
            "zeros": n - int(np.count_nonzero(x)),
            "sorted": _first_drop(x, strict=False) is None,
            "strict": _first_drop(x, strict=True) is None,
        }

    def domain(a: int, b: int) -> np.ndarray:
        part = x[a:b]
        if ref is None:
            return _to_u(part, signed)
        # value - ref in 64-bit two's complement, mapped as a signed number
        base = ref[a:b] if ref_values is None else ref_values[a:b]
        return (_to_u_raw(part.astype(dtype, copy=False)) - _to_u_raw(base)) ^ _SIGN

    step = _BATCH * CHUNK
    slope_ok = ref is None and n > 0 and (stats["strict"] or not stats["sorted"])
    widths = {0: [], 1: []}
    for a in range(0, n, step):
        u = domain(a, a + step)
        for slope in (0, 1) if slope_ok and int(u.min()) >= CHUNK else (0,):
            widths[slope].append(_widths(_frames(u, slope)[1]))
    w0 = np.concatenate(widths[0]) if widths[0] else np.zeros(0, dtype=np.int64)
    slope = 0
    if widths[1] and len(widths[1]) == len(widths[0]):
        w1 = np.concatenate(widths[1])
        if int(w1.sum()) < int(w0.sum()):
            slope, w0 = 1, w1
    chunks = w0.shape[0]
    sizes = w0 * (CHUNK // 8)  # bytes per chunk
    total_bytes = int(sizes.sum())
    starts = np.zeros(chunks + 1, dtype=np.uint32 if total_bytes < 1 << 32 else np.int64)
    np.cumsum(sizes, out=starts[1:], dtype=starts.dtype)
    bases = np.empty(chunks, dtype=np.uint64)
    data = np.zeros(total_bytes + 8, dtype=np.uint8)
    for a in range(0, n, step):
        b, r = _frames(domain(a, a + step), slope)
        c0 = a // CHUNK
        bases[c0 : c0 + b.shape[0]] = b
        w = w0[c0 : c0 + b.shape[0]]
        lo = int(starts[c0])
        packed = _pack(r, w)
        data[lo : lo + packed.shape[0]] = packed
    for arr in (bases, starts, data):
        arr.flags.writeable = False
    return CompactInts(
        dtype=dtype, n=n, slope=slope, bases=bases, starts=starts, data=data, stats=stats, ref=ref
    )


def _first_drop(x: np.ndarray, *, strict: bool) -> int | None:
    """First ``i`` with ``x[i + 1] < x[i]`` (``<=`` when ``strict``), in blocks."""
    for a in range(0, max(x.shape[0] - 1, 0), _BLOCK):
        b = min(a + _BLOCK, x.shape[0] - 1)
        down = x[a + 1 : b + 1] <= x[a:b] if strict else x[a + 1 : b + 1] < x[a:b]
        if down.any():
            return a + int(np.argmax(down))
    return None


def naive_decode(col: CompactInts) -> np.ndarray:
    """Slow reference decoder: every value from its chunk's bits, one Python int at a time."""
    data = bytes(col.data)
    out = []
    for i in range(col.n):
        c, j = divmod(i, CHUNK)
        s, e = int(col.starts[c]), int(col.starts[c + 1])
        w = (e - s) * 8 // CHUNK
        bit = s * 8 + j * w
        word = int.from_bytes(data[bit // 8 : bit // 8 + 8], "little") >> (bit % 8)
        u = (int(col.bases[c]) + (word & ((1 << w) - 1)) + col.slope * j) % (1 << 64)
        if col.ref is not None:
            base = int(col.ref[i]) % (1 << 64)
            u = (base + (u ^ (1 << 63))) % (1 << 64)
        elif _signed(col.dtype):
            u ^= 1 << 63
        if _signed(col.dtype) and u >= 1 << 63:
            u -= 1 << 64
        out.append(u)
    return np.array(out, dtype=object).astype(col.dtype) if out else np.empty(0, col.dtype)


def count_nonzero(a: Any) -> int:
    """Non-zero values of a plain array or a :class:`CompactInts` (stored: O(1))."""
    return a.count_nonzero() if isinstance(a, CompactInts) else int(np.count_nonzero(a))


def nonzero_positions(a: Any, dtype: Any = np.int64) -> np.ndarray:
    """``np.flatnonzero(a).astype(dtype)`` of a plain array or a :class:`CompactInts`, built
    block by block (no full-size int64 temporary)."""
    out = np.empty(count_nonzero(a), dtype=dtype)
    at = 0
    for lo in range(0, a.shape[0], _BLOCK):
        part = np.flatnonzero(a[lo : lo + _BLOCK])
        out[at : at + part.shape[0]] = part + lo
        at += part.shape[0]
    return out
