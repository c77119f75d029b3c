"""Reading the token ranges a batch's spans need (the plan's own inputs are scanned by
:mod:`~tokenloom.loader.pipeline.inputs`).

Token lists are fetched by stable row id (:func:`~tokenloom.loader.pipeline.take.take`:
thread-safe, GIL released) and each
stretch's range is located in them (:meth:`TokenReader.locate`: a
:class:`~tokenloom.loader.plan.pack.TokenSource` the compiled packer reads in place) or gathered
into the packer's layout with one vectorised ``take`` (:meth:`TokenReader.read_masked`): locally one
take per group of steps; on an object store the rows of many groups at once (a :class:`Fetched`
span, :meth:`TokenReader.fetch`, cut into concurrent takes of neighbouring rows), which the
groups are then packed from. A
document that goes on past a group is kept in a small LRU while its later blocks are packed, so a
document of millions of tokens is read about once per process and costs linear work.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from tokenloom.errors import TokenloomError
from tokenloom.loader.pipeline.take import take
from tokenloom.loader.plan.pack import TokenSource, _gather  # noqa: F401 - _gather: imported from here too
from tokenloom.loader.plan.window import CutPoints
from tokenloom.table.storage import is_remote
from tokenloom.table.tokens import join_token_lists, token_dtype, token_lists

__all__ = ["TokenReader", "Fetched", "split_rows", "read_cut_points", "LoaderError"]


class LoaderError(TokenloomError):
    """The loader cannot be built as asked (missing column, bad filter, no tokenizer)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Fetched:
    """The token lists of a set of rows, fetched ahead of the groups packed from them."""

    rowids: np.ndarray
    """``(R,)`` stable row ids, ascending (uint64)."""
    starts: np.ndarray
    """``(R,)`` int64: where each row's tokens start in :attr:`values`."""
    lengths: np.ndarray
    """``(R,)`` int64: tokens of each row (0 for a null list)."""
    values: np.ndarray
    """Every row's tokens, one after another (the column's dtype)."""
    read: tuple[int, int, float]
    """Rows, bytes and seconds the fetch cost."""
    mask_pairs: np.ndarray | None = None
    """With a loss-mask column: ``(K, 2)`` int64 spans of the rows (taken with their tokens)."""
    mask_ptr: np.ndarray | None = None
    """``(R + 1,)`` int64: row ``r``'s spans are ``mask_pairs[mask_ptr[r]:mask_ptr[r + 1]]``."""

    def find(self, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, index)``: which of ``rowids`` this holds, and at which position."""
        pos = np.searchsorted(self.rowids, rowids)
        pos = np.minimum(pos, max(len(self.rowids) - 1, 0))
        found = (self.rowids[pos] == rowids) if len(self.rowids) else np.zeros(len(rowids), bool)
        return found, pos


SPLIT_TAKE_ROWS = 256
"""On an object store, rows per concurrent sub-take of one group's take (at least)."""
SPLIT_TAKE_PARTS = 4
"""On an object store, most sub-takes one group's take is split into (one take issues its
GETs in waves; a few takes at once keep more in flight)."""


def split_rows(ids: np.ndarray, *, min_rows: int, max_parts: int) -> list[np.ndarray]:
    """``ids`` (ascending) cut into at most ``max_parts`` runs of neighbouring rows, each of at
    least ``min_rows`` (but one run when there are fewer than ``2 * min_rows``)."""
    parts = int(min(max_parts, max(len(ids) // max(min_rows, 1), 1)))
    return [p for p in np.array_split(ids, parts) if len(p)] if parts > 1 else [ids]


class TokenReader:
    """Reads the token ranges of spans (one per process; datasets are opened lazily)."""

    def __init__(
        self,
        uri: str,
        version: int,
        token_column: str,
        *,
        storage_options: dict | None = None,
        cache_tokens: int = 32 << 20,
        mask_column: str | None = None,
    ) -> None:
        self.uri = uri
        self.version = version
        self.token_column = token_column
        self.mask_column = mask_column
        """A loss-mask column read in the same take as the tokens
        (:mod:`~tokenloom.loader.pipeline.lossmask`), or ``None``."""
        self.storage_options = storage_options
        self.cache_tokens = cache_tokens
        self.block_size: int | None = None
        """Lance's merge window for this reader's dataset (``None``: Lance's default); set
        through :meth:`use_block_size`."""
        self._ds: lance.LanceDataset | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._lock = threading.Lock()  # I/O threads share the cache and the counters
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._masks: dict[int, np.ndarray] = {}  # the cached rows' loss-mask spans
        self._cached = 0
        self.rows_read = 0
        self.bytes_read = 0
        self.read_seconds = 0.0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_ds"] = None  # Lance handles do not cross processes
        state["_pool"] = None
        state["_pool_size"] = 0
        state["_lock"] = None
        state["_cache"] = OrderedDict()
        state["_masks"] = {}
        state["_cached"] = 0
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def dataset(self) -> lance.LanceDataset:
        if self._ds is None:
            extra = {"block_size": self.block_size} if self.block_size else {}
            self._ds = lance.dataset(
                self.uri, version=self.version, storage_options=self.storage_options, **extra
            )
        return self._ds

    @property
    def field(self) -> pa.Field:
        """The token column's field (its layout: :mod:`tokenloom.table.tokens`)."""
        return self.dataset.schema.field(self.token_column)

    @property
    def token_width(self) -> int:
        """Bytes per token id of the column (either layout)."""
        return token_dtype(self.field).itemsize

    def use_block_size(self, block_size: int | None) -> None:
        """Read with Lance's merge window ``block_size`` from now on (the dataset is opened
        again if it was open with another one)."""
        if block_size != self.block_size:
            self.block_size = block_size
            self._ds = None

    def read_ranges(
        self,
        rowids: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        doc_len: np.ndarray,
        fetched: Fetched | None = None,
    ) -> tuple[np.ndarray, np.ndarray, tuple[int, int, float]]:
        """Tokens ``[starts[i], stops[i])`` of row ``rowids[i]`` for every ``i``, concatenated
        (:meth:`read_masked` without the mask).

        The rows come from the long-document cache, else from ``fetched``, else from one
        ``take``; then one vectorised gather per source buffer (the fetched or taken values, each
        cached document): no per-row or per-stretch Python. A row whose tokens go on past the
        last range asked for (a document continuing into later blocks) is copied into the cache.

        Args:
            rowids: ``(S,)`` stable row ids (uint64).
            starts, stops: ``(S,)`` token ranges of each row.
            doc_len: ``(S,)`` planned tokens of each row (its ``n_tokens``).
            fetched: Rows fetched ahead (:meth:`fetch`); rows it lacks are taken here.

        Returns:
            ``(tokens, offsets)`` in the layout :func:`tokenloom.loader.plan.pack.pack_blocks`
            takes: ``tokens`` in the column's dtype, ``offsets`` ``(S + 1,)`` int64; and the rows,
            bytes and seconds this call's ``take`` cost.

        Raises:
            LoaderError: A row holds fewer tokens than the plan (its ``n_tokens``) says.
        """
        tokens, offsets, _, read = self.read_masked(rowids, starts, stops, doc_len, fetched)
        return tokens, offsets, read

    def read_masked(
        self,
        rowids: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        doc_len: np.ndarray,
        fetched: Fetched | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, int, float]]:
        """:meth:`read_ranges`, and with a :attr:`mask_column` which read tokens lie in a
        loss-mask span of their row (the spans come with the rows: same take, fetch or cache).

        Returns:
            ``(tokens, offsets, masked, read)``: ``masked`` is ``(T,)`` bool aligned with
            ``tokens`` (:func:`~tokenloom.loader.pipeline.lossmask.stretch_mask`), ``None`` without
            a mask column.

        Raises:
            LoaderError: A row holds fewer tokens than the plan says.
            LossMaskDataError: A row's spans break the mask column's contract.
        """
        source, offsets, masked, read = self.locate(rowids, starts, stops, doc_len, fetched)
        return source.gather(offsets), offsets, masked, read

    def locate(
        self,
        rowids: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        doc_len: np.ndarray,
        fetched: Fetched | None = None,
    ) -> tuple[TokenSource, np.ndarray, np.ndarray | None, tuple[int, int, float]]:
        """:meth:`read_masked` without the gather: where each range lies, for the compiled
        packer to read in place (:class:`~tokenloom.loader.plan.pack.TokenSource`: the fetched or
        taken rows' buffer, zero-copy, and the ranges of cached documents copied apart).

        Returns:
            ``(source, offsets, masked, read)``: ``source.gather(offsets)`` is
            :meth:`read_masked`'s ``tokens``; the rest as :meth:`read_masked`.

        Raises:
            LoaderError: A row holds fewer tokens than the plan says.
            LossMaskDataError: A row's spans break the mask column's contract.
        """
        S = len(rowids)
        want_mask = self.mask_column is not None
        msrc: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        # (uniq rows, their index into the source's ptr, source pairs, source ptr)
        lengths = (stops - starts).astype(np.int64, copy=False)
        offsets = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        read = (0, 0, 0.0)
        if S == 0:
            empty = np.zeros(0, dtype=bool) if want_mask else None
            return TokenSource(values=np.empty(0, np.int64), at=starts[:0]), offsets, empty, read
        uniq, first, inv = np.unique(rowids, return_index=True, return_inverse=True)
        source = np.zeros(len(uniq), dtype=np.int64)  # which buffer holds each row
        base = np.zeros(len(uniq), dtype=np.int64)  # where its tokens start in that buffer
        row_len = np.zeros(len(uniq), dtype=np.int64)
        cached = np.zeros(len(uniq), dtype=bool)
        buffers: list[np.ndarray] = [np.empty(0, dtype=np.int64)]  # 0: fetched or taken rows
        if self._cache:
            with self._lock:
                for j, rid in enumerate(uniq.tolist()):
                    arr = self._cache.get(rid)
                    if arr is not None:
                        self._cache.move_to_end(rid)
                        cached[j] = True
                        source[j] = len(buffers)
                        row_len[j] = len(arr)
                        buffers.append(arr)
        missing = np.flatnonzero(~cached)
        if fetched is not None and len(missing):
            found, pos = fetched.find(uniq[missing])
            have, pos = missing[found], pos[found]
            base[have] = fetched.starts[pos]
            row_len[have] = fetched.lengths[pos]
            buffers[0] = fetched.values
            if want_mask:
                msrc.append((have, pos, fetched.mask_pairs, fetched.mask_ptr))  # type: ignore[arg-type]
            missing = missing[~found]
        if len(missing):
            k = 0 if fetched is None else len(buffers)  # rows a fetch lacked: their own buffer
            started = time.perf_counter()
            col, mcol = self._take(uniq[missing])
            read = (len(missing), col.nbytes, time.perf_counter() - started)
            if mcol is not None:
                pairs, ptr = self._pairs(mcol, uniq[missing])
                msrc.append((missing, np.arange(len(missing)), pairs, ptr))
            with self._lock:
                self.read_seconds += read[2]
                self.rows_read += read[0]
                self.bytes_read += read[1]
            chunks = col.chunks
            del col  # the chunks go as they are copied
            lists = join_token_lists(chunks, self.field)
            if k:
                buffers.append(lists.values)
            else:
                buffers[0] = lists.values
            source[missing] = k
            base[missing] = lists.offsets[:-1]
            row_len[missing] = lists.lengths
        short = stops > row_len[inv]
        if short.any():
            i = int(np.flatnonzero(short)[0])
            raise LoaderError(
                f"row with stable id {int(rowids[i])} holds {int(row_len[inv[i]])} tokens in "
                f"column {self.token_column!r} but the plan needs {int(stops[i])} (its stored "
                f"count is {int(doc_len[i])}); the count column is stale: run "
                f"`tokenloom refresh --table {self.uri}`"
            )
        masked = None
        mpairs = mptr = None
        if want_mask:
            mpairs, mptr = self._row_pairs(uniq, cached, msrc)
            from tokenloom.loader.pipeline.lossmask import check_pairs

            check_pairs(
                mpairs, mptr, row_len, column=str(self.mask_column), rowids=uniq,
                what="stable row id",
            )  # fmt: skip
        dtype = next((b.dtype for b in buffers if len(b)), np.dtype(np.int64))
        at = base[inv] + starts  # (S,) where each range starts in its source buffer
        src = source[inv]  # (S,) buffer of each range
        other = np.flatnonzero(src != 0)
        values = buffers[0] if len(buffers[0]) else np.empty(0, dtype=dtype)
        extra = np.empty(0, dtype=dtype)
        if len(other):
            # The few ranges of cached documents (a document running on from the previous
            # group) are copied apart, one after another, after the taken rows' buffer.
            n = lengths[other]
            pieces = zip(src[other].tolist(), at[other].tolist(), n.tolist(), strict=True)
            extra = np.concatenate([buffers[b][lo : lo + k] for b, lo, k in pieces])
            extra = extra.astype(dtype, copy=False)
            at[other] = len(values) + np.cumsum(n) - n
        # A document that goes on after this call's last range is needed again by a later
        # call: keep a copy (not a view that would pin the whole fetched or taken buffer); one
        # that ends here is dropped from the cache.
        last = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(last, inv, stops)
        done = last >= doc_len[first]
        ended = uniq[cached & done].tolist()
        if ended:
            with self._lock:
                for rid in ended:
                    self._masks.pop(rid, None)
                    arr = self._cache.pop(rid, None)
                    if arr is not None:
                        self._cached -= len(arr)
        for j in np.flatnonzero(~cached & ~done).tolist():
            lo = int(base[j])
            held = None if mpairs is None else mpairs[mptr[j] : mptr[j + 1]].copy()  # type: ignore[index]
            self._remember(int(uniq[j]), buffers[source[j]][lo : lo + int(row_len[j])].copy(), held)
        if mpairs is not None:
            from tokenloom.loader.pipeline.lossmask import stretch_mask

            masked = stretch_mask(mpairs, mptr, inv, starts, stops, offsets)  # type: ignore[arg-type]
        return TokenSource(values=values, at=at, extra=extra), offsets, masked, read

    def _pairs(self, mcol: Any, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The spans of a taken mask column
        (:func:`~tokenloom.loader.pipeline.lossmask.mask_pairs`)."""
        from tokenloom.loader.pipeline.lossmask import mask_pairs

        return mask_pairs(mcol, column=str(self.mask_column), rowids=rowids, what="stable row id")

    def _row_pairs(
        self, uniq: np.ndarray, cached: np.ndarray, sources: list
    ) -> tuple[np.ndarray, np.ndarray]:
        """The spans of each of ``uniq`` (CSR by its index) from the cache and the sources
        (``(rows, index into the source's ptr, pairs, ptr)`` each): one gather per source."""
        counts = np.zeros(len(uniq), dtype=np.int64)
        held: dict[int, np.ndarray] = {}
        if cached.any():
            with self._lock:
                for j in np.flatnonzero(cached).tolist():
                    held[j] = self._masks.get(int(uniq[j]), np.zeros((0, 2), dtype=np.int64))
        for j, arr in held.items():
            counts[j] = len(arr)
        for rows, at, _, ptr in sources:
            counts[rows] = ptr[at + 1] - ptr[at]
        out_ptr = np.zeros(len(uniq) + 1, dtype=np.int64)
        np.cumsum(counts, out=out_ptr[1:])
        out = np.empty((int(out_ptr[-1]), 2), dtype=np.int64)
        for rows, at, pairs, ptr in sources:
            n = counts[rows]
            within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
            out[np.repeat(out_ptr[rows], n) + within] = pairs[np.repeat(ptr[at], n) + within]
        for j, arr in held.items():
            out[out_ptr[j] : out_ptr[j + 1]] = arr
        return out, out_ptr

    def fetch(
        self, rowids: np.ndarray, *, parts: int = SPLIT_TAKE_PARTS, cached: bool = False
    ) -> Fetched:
        """The token lists of ``rowids`` (any order, repeats allowed), fetched for
        :meth:`read_ranges`: one take of the distinct rows in ascending order (neighbouring rows
        share a ranged GET on an object store), cut into up to ``parts`` concurrent takes. Rows
        in the long-document cache are left out (a document of millions of tokens running
        through many spans is not fetched again by each), unless ``cached`` (a fetch that
        outlives the cache's documents: a held table's)."""
        ids = np.unique(np.asarray(rowids, dtype=np.uint64))
        if self._cache and not cached:
            with self._lock:
                held = np.fromiter(self._cache.keys(), dtype=np.uint64, count=len(self._cache))
            ids = ids[~np.isin(ids, held)]
        started = time.perf_counter()
        mask = (np.zeros((0, 2), dtype=np.int64), np.zeros(len(ids) + 1, dtype=np.int64))
        if len(ids):
            col, mcol = self._take(ids, parts=parts)
            nbytes, chunks = col.nbytes, col.chunks
            del col  # the chunks go as they are copied: no second copy of a large fetch
            lists = join_token_lists(chunks, self.field)
            if mcol is not None:
                mask = self._pairs(mcol, ids)
        else:
            lists, nbytes = token_lists(pa.array([], self.field.type), self.field), 0
        values, offs, lengths = lists.values, lists.offsets, lists.lengths
        read = (len(ids), nbytes, time.perf_counter() - started)
        with self._lock:
            self.read_seconds += read[2]
            self.rows_read += read[0]
            self.bytes_read += read[1]
        if self.mask_column is None:
            return Fetched(rowids=ids, starts=offs[:-1], lengths=lengths, values=values, read=read)
        return Fetched(
            rowids=ids, starts=offs[:-1], lengths=lengths, values=values, read=read,
            mask_pairs=mask[0], mask_ptr=mask[1],
        )  # fmt: skip

    def _take(self, ids: np.ndarray, parts: int = SPLIT_TAKE_PARTS) -> tuple[Any, Any]:
        """The token column of rows ``ids`` (ascending) as one Arrow list array, and the loss-mask
        column's (in the same take; ``None`` without one). On an object store the take is split
        into up to ``parts`` runs of neighbouring rows taken at once: one take's requests are
        issued in waves, so parallel takes keep more GETs in flight."""
        column = self.token_column
        columns = [column] if self.mask_column is None else [column, self.mask_column]
        runs = [ids]
        if is_remote(self.uri):
            runs = split_rows(ids, min_rows=SPLIT_TAKE_ROWS, max_parts=parts)
        if len(runs) == 1:
            tables = [take(self.dataset, ids.tolist(), columns)]
        else:
            ds = self.dataset
            pool = self._take_pool(len(runs))
            tables = list(pool.map(lambda p: take(ds, p.tolist(), columns), runs))

        def joined(name: str) -> Any:
            if len(tables) == 1:
                return tables[0].column(name)
            chunks = [c for t in tables for c in t.column(name).chunks]
            return pa.chunked_array(chunks, type=tables[0].schema.field(name).type)

        return joined(column), None if self.mask_column is None else joined(self.mask_column)

    def _take_pool(self, threads: int) -> ThreadPoolExecutor:
        """The threads running concurrent takes, at least ``threads`` of them (a pool too
        small is replaced; the old one finishes its takes and goes)."""
        with self._lock:
            if self._pool is None or self._pool_size < threads:
                self._pool_size = max(threads, SPLIT_TAKE_PARTS)
                self._pool = ThreadPoolExecutor(self._pool_size, thread_name_prefix="take")
            return self._pool

    def reserve_takes(self, threads: int) -> None:
        """Make room for ``threads`` concurrent takes (fetches running at once x their parts)."""
        self._take_pool(threads)

    def _remember(self, rid: int, arr: np.ndarray, pairs: np.ndarray | None = None) -> None:
        if len(arr) > self.cache_tokens:
            arr = arr.copy()  # keep just this document, not the whole Arrow buffer
        with self._lock:
            if rid in self._cache:
                return
            self._cache[rid] = arr
            if pairs is not None:
                self._masks[rid] = pairs
            self._cached += len(arr)
            while self._cached > self.cache_tokens and len(self._cache) > 1:
                gone, old = self._cache.popitem(last=False)
                self._masks.pop(gone, None)
                self._cached -= len(old)


def check_cut_column(ds: Any, column: str, mixture: bool = False, *, units: bool = False) -> None:
    """Refuse a cut column the loader cannot use, naming the fix (a mixture reads the column
    per pool, like one selection).

    Raises:
        LoaderError: The table has no such column, it is not a list of offsets (plain or
            ranked), or ``units`` asks for a ranked column and it is plain.
    """
    from tokenloom.tokenize.structure import is_ranked

    if column not in ds.schema.names:
        raise LoaderError(
            f"no column {column!r}; add it with `tokenloom tokenize --table {ds.uri} "
            "--tokenizer SPEC --boundaries` (line breaks, column cut_points) or `--structure` "
            "(ranked, column cut_structure)"
        )
    t = ds.schema.field(column).type
    plain = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
    if not (plain or is_ranked(t)):
        raise LoaderError(
            f"cut column {column!r} is {t}, not a list of token offsets (list<int32>) or of "
            "ranked offsets (list<struct<offset, kind>>); pass --cut-column cut_points or "
            "cut_structure"
        )
    if units and not is_ranked(t):
        raise LoaderError(
            f"long_docs='units' needs a ranked cut column (sections), and {column!r} is {t}; add "
            f"one with `tokenloom tokenize --table {ds.uri} --tokenizer SPEC --structure` and "
            "pass --cut-column cut_structure"
        )


def read_cut_points(ds: Any, inputs: Any, column: str | None, window: int, mixture: bool) -> Any:
    """Cut points of the rows longer than a window (the only rows that are cut)."""
    if column is None:
        return None
    check_cut_column(ds, column, mixture)
    long = np.concatenate(
        [lo + np.flatnonzero(v.astype(np.int64) + 1 > window) for lo, v in inputs.n_tokens.blocks()]
        or [np.zeros(0, dtype=np.int64)]
    )
    if not long.size:
        return {}
    return take_cut_points(ds, inputs, column, long)


def take_cut_points(ds: Any, inputs: Any, column: str, positions: np.ndarray) -> CutPoints:
    """The cut points of the selection's rows at ``positions``, as CSR by row id."""
    table = take(ds, inputs.rowids[positions].tolist(), ["id", column])
    ids = table.column("id").to_numpy().astype(np.int64, copy=False)
    col = table.column(column).combine_chunks()
    del table
    # CSR by id, without a Python object per row; a null list is no cut point
    ranks = None
    if pa.types.is_struct(col.type.value_type):  # a ranked column: offset and kind
        offs = col.offsets.to_numpy().astype(np.int64, copy=False)
        values = col.values.field("offset").to_numpy(zero_copy_only=False)
        ranks = col.values.field("kind").to_numpy(zero_copy_only=False)
        if ranks.size and (int(ranks.min()) < 0 or int(ranks.max()) > 2):
            bad = int(ranks[(ranks < 0) | (ranks > 2)][0])
            raise LoaderError(
                f"cut column {column!r} holds kind {bad}; kinds are 0 (line), 1 (paragraph) "
                f"and 2 (section): compute it again with `tokenloom tokenize --table {ds.uri} "
                "--tokenizer SPEC --structure`"
            )
    else:
        values, offs = _list_values(col)
    counts = np.diff(offs)
    if col.null_count:
        counts[~col.is_valid().to_numpy(zero_copy_only=False)] = 0
    order = np.argsort(ids, kind="stable")
    counts = counts[order]
    ptr = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    at = np.repeat(offs[:-1][order] - ptr[:-1], counts) + np.arange(int(ptr[-1]))
    return CutPoints(
        ids[order], ptr, np.asarray(values)[at], None if ranks is None else np.asarray(ranks)[at]
    )


def _list_values(col: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """A list array's values (zero-copy where Arrow allows) and its ``(n + 1,)`` int64 offsets
    into them."""
    offs = col.offsets.to_numpy().astype(np.int64, copy=False)
    values = col.values.to_numpy(zero_copy_only=False) if len(col.values) else np.empty(0, np.int64)
    return values, offs
