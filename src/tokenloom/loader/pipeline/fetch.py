"""Rows fetched ahead of packing on an object store: spans of read groups, one sorted take each.

On an object store what a read costs is set by how close the rows of one ``take`` lie in the
table: Lance merges reads of one file closer than ~64 KiB into one ranged GET, so a take of many
rows of a shuffled epoch needs far fewer GETs (and fetches fewer bytes it does not use) than the
same rows in many small takes. The rows a pack group needs are few (a group holds about 256
stretches, a few MB once packed into int64 blocks), so the reads are decoupled from packing:

* a **span** is consecutive read groups of one pipeline; the distinct rows of all its groups are
  fetched with one take in ascending row order (:meth:`TokenReader.fetch`, cut into a few
  concurrent takes of neighbouring rows) and held as raw token lists (:class:`Fetched`), which
  cost a sixteenth of the packed blocks made from them;
* :class:`FetchAhead` keeps the spans after the one being packed in flight, up to a depth, and
  (in the training process) goes on into the next epoch's first spans while the current epoch
  ends, so the store is never idle at an epoch boundary;
* a table whose tokens fit the fetch budget
  (:func:`~tokenloom.loader.pipeline.readahead.resident_reads`) is **held**: its whole
  selection is fetched once, in row order, and serves every span of every epoch (spans of a
  share ``f`` of a shuffled epoch fetch the whole file between their rows: ``1 / f`` the bytes
  they use). A pipeline whose held fetch is not in yet packs its first read group from that
  group's own rows (a **lead**: one take of a few hundred rows, taken before the whole fetch
  starts), so the first steps do not wait for the whole table; the next groups wait for it
  (more leads, about a GET per row, only slowed the whole fetch they compete with: measured
  through 20 ms, 0.3-1.3M tokens delivered meanwhile, the table held 1-2 s later).

The read order changes; the stream does not: every group is still packed from exactly the token
ranges its plan names, in the same order (a row a span lacks is taken when its group is built).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tokenloom.loader.pipeline.read import Fetched, TokenReader

__all__ = ["FetchAhead", "SpanKey", "cut_spans"]


def cut_spans(groups: int, per_span: int) -> list[range]:
    """Indices of ``groups`` read groups cut into spans of ``per_span`` consecutive groups.

    Returns:
        ``ceil(groups / per_span)`` ranges of group indices (the last one may be shorter).
    """
    per = max(int(per_span), 1)
    return [range(lo, min(lo + per, groups)) for lo in range(0, groups, per)]


@dataclass(frozen=True)
class SpanKey:
    """Which pipeline a span belongs to: its epoch and the read groups' layout. Hashed once:
    it keys every span's lookups, and hashing its groups (a pair per read group of the epoch)
    cost ~40 us a lookup, several a group."""

    epoch: int
    groups: tuple[tuple[int, int], ...]
    """``(start, stop)`` steps of each read group of the pipeline."""
    per_span: int
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.epoch, self.groups, self.per_span)))

    def __hash__(self) -> int:
        return self._hash


class FetchAhead:
    """Fetches spans of read groups ahead of the groups being packed.

    Args:
        reader: The process's :class:`TokenReader`.
        depth: Spans fetched at once, the one being packed included (``>= 1``).
        parts: Concurrent takes each span's take is cut into.
    """

    def __init__(self, reader: TokenReader, *, depth: int, parts: int) -> None:
        self.reader = reader
        self.depth = max(int(depth), 1)
        self.parts = max(int(parts), 1)
        self._pool = ThreadPoolExecutor(self.depth, thread_name_prefix="tokenloom-fetch")
        reader.reserve_takes((self.depth + 1) * self.parts)
        self._lock = threading.Lock()
        self._futures: dict[tuple[SpanKey, int], Future] = {}
        self._key: SpanKey | None = None
        self._spans: list[range] = []
        self._rows: Callable[[int], np.ndarray] | None = None
        self._next: tuple[SpanKey, list[range], Callable[[int], np.ndarray]] | None = None
        self.carried = 0
        """Spans a pipeline found fetched already by the one before it (the epoch boundary)."""
        self._held_rows: Callable[[], np.ndarray] | None = None
        self._held_fetch: Callable[[np.ndarray, int], Fetched] | None = None
        self._held: Future | None = None
        self._held_in = False  # the held fetch is complete: no lead is asked for any more
        self._held_counted = False
        self._hold_pool: ThreadPoolExecutor | None = None
        self._leads: dict[tuple[SpanKey, int], tuple[Future, bool]] = {}
        """Leads by pipeline and group: the fetch, and whether its group carries its read."""
        self.lead_rows = 0
        """Distinct rows the leads of the held fetch (the latest one) fetched."""
        self.leads = 0
        """Read groups served from their own rows while the held fetch ran."""

    def start(
        self,
        key: SpanKey,
        rows: Callable[[int], np.ndarray],
        *,
        following: Callable[[], tuple[SpanKey, Callable[[int], np.ndarray]] | None] | None = None,
        held: Callable[[], np.ndarray] | None = None,
        held_fetch: Callable[[np.ndarray, int], Fetched] | None = None,
    ) -> None:
        """A pipeline starts: its read groups (``key``) and ``rows(g)``, the stable row ids
        read group ``g`` needs. Spans fetched ahead for this very pipeline (by the previous
        one's ``following``) are kept, every other is dropped. ``following`` names the pipeline
        expected after this one (the next epoch) once this one has nothing left to fetch.
        ``held``: the table is held whole, ``held()`` being the stable row ids of its whole
        selection (the same for every epoch of one version): one fetch of them serves every
        span, fetched once and kept while the fetcher lives; the first group asked for while it
        runs is served from its own rows (a lead). ``held_fetch(rows, parts)`` fetches them
        (default: :meth:`TokenReader.fetch`; DataLoader workers share one copy through the plan
        store)."""
        with self._lock:
            for k in [k for k in self._futures if k[0] != key]:
                self._futures.pop(k).cancel()
            for k in [k for k in self._leads if k[0] != key]:
                self._leads.pop(k)[0].cancel()
            self.carried += len(self._futures)
            if held is None:
                self._held, self._held_in = None, False
            elif self._held is not None:
                self.carried += 1  # the held rows serve this pipeline too
            self._held_rows = held
            self._held_fetch = held_fetch
            self._key, self._rows = key, rows
            self._spans = cut_spans(len(key.groups), key.per_span)
            self._following = following
            self._next = None

    def resize(self, *, depth: int, parts: int) -> None:
        """Fetch ``depth`` spans at once from now on, each cut into ``parts`` takes."""
        depth, parts = max(int(depth), 1), max(int(parts), 1)
        if depth != self.depth:
            old, self._pool = self._pool, ThreadPoolExecutor(depth, "tokenloom-fetch")
            old.shutdown(wait=False)  # its fetches run to the end; their futures are kept
        self.depth, self.parts = depth, parts
        self.reader.reserve_takes((depth + 1) * parts)

    def put(self, span: int, fetched: Fetched) -> Future:
        """Span ``span`` of the current pipeline, fetched already (the sizing probe; a held
        table: read group ``span``'s lead); its (done) future."""
        future: Future = Future()
        future.set_result(fetched)
        assert self._key is not None
        with self._lock:
            if self._held_rows is not None:
                # once the held fetch is in (a small table), it counted this lead's rows
                self._leads[(self._key, span)] = (future, not self._held_in)
                if not self._held_in:
                    self.lead_rows += len(fetched.rowids)
                    self.leads += 1
            else:
                self._futures[(self._key, span)] = future
        return future

    def span_rows(self, span: int) -> np.ndarray:
        """The stable row ids span ``span`` of the current pipeline needs (a held table: read
        group ``span``'s, its lead)."""
        assert self._rows is not None
        if self._held_rows is not None:
            return self._rows(span)
        return np.concatenate([self._rows(g) for g in self._spans[span]])

    @property
    def holding(self) -> bool:
        """Whether the table is held whole (one fetch serves every span)."""
        return self._held_rows is not None

    @property
    def per_span(self) -> int:
        """Read groups per span of the current pipeline (a held table: 1, a lead's)."""
        if self._held_rows is not None:
            return 1
        return self._key.per_span if self._key is not None else 1

    def span_of(self, group: int) -> int:
        return group // self._key.per_span if self._key is not None else 0

    def hold(self) -> None:
        """A held table: start its fetch now (else the first :meth:`get` does)."""
        with self._lock:
            if self._held_rows is not None and self._held is None:
                self._hold()

    def get(self, group: int) -> tuple[Future, bool]:
        """The fetch read group ``group`` is packed from, with the spans after it submitted up
        to the depth (into the next pipeline's first spans once this one's are all in flight),
        and whether this group carries its read cost (a span's first group; a held table's
        fetch: the first group packed from it; a lead: its group)."""
        span = self.span_of(group)
        with self._lock:
            if self._held_rows is not None:
                if self._held is None:
                    self._hold()
                assert self._key is not None and self._held is not None
                lead = self._leads.get((self._key, group))
                if lead is None and not self._held_in and group == 0:
                    lead = self._lead(group)
                if lead is not None:
                    return lead
                first, self._held_counted = not self._held_counted, True
                return self._held, first
            for s in range(span, span + self.depth):
                self._submit(s)
            assert self._key is not None
            return self._futures[(self._key, span)], group % self._key.per_span == 0

    def done(self, group: int) -> None:
        """Read group ``group`` is built: its span (or its lead) is dropped after its last
        group."""
        key = self._key
        if key is None:
            return
        if self._held_rows is not None:
            with self._lock:
                self._leads.pop((key, group), None)
            return
        span = self.span_of(group)
        if group == self._spans[span].stop - 1:
            with self._lock:
                self._futures.pop((key, span), None)

    def close(self) -> None:
        """Drop every span and stop the fetch threads (fetches running finish first)."""
        with self._lock:
            for future in [*self._futures.values(), *(f for f, _ in self._leads.values())]:
                future.cancel()
            self._futures.clear()
            self._leads.clear()
            if self._held is not None:
                self._held.cancel()
            self._held, self._held_in = None, False
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._hold_pool is not None:
            self._hold_pool.shutdown(wait=False, cancel_futures=True)

    def _hold(self) -> None:
        """Submit the held table's fetch (under the lock), on a thread of its own so that the
        leads never wait behind it. The read it reports leaves out the rows the leads asked
        for (those groups counted their own), so a run counts each row used once."""
        assert self._held_rows is not None
        rows_of, parts, fetch_all = self._held_rows, self.parts, self._held_fetch
        if fetch_all is None:
            # every row, those the long-document cache holds now included (they leave it)
            reader = self.reader
            fetch_all = lambda ids, parts: reader.fetch(ids, parts=parts, cached=True)  # noqa: E731
        self._held_in, self._held_counted, self.lead_rows = False, False, 0
        if self._hold_pool is None:
            self._hold_pool = ThreadPoolExecutor(1, thread_name_prefix="tokenloom-hold")

        def fetch() -> Fetched:
            fetched = fetch_all(rows_of(), parts)
            with self._lock:
                self._held_in = True
                lead = min(self.lead_rows, len(fetched.rowids))
            rows, nbytes, secs = fetched.read
            left = max(rows - lead, 0)  # a shared copy mapped, not fetched: nothing
            read = (left, int(nbytes * left / rows) if rows else 0, secs)
            return dataclasses.replace(fetched, read=read)

        self._held = self._hold_pool.submit(fetch)

    def _lead(self, group: int) -> tuple[Future, bool]:
        """Submit read group ``group``'s lead: a fetch of its own rows (under the lock). A
        lead that starts once the held fetch is in is served by it (it reads nothing)."""
        assert self._key is not None and self._rows is not None
        rows = np.unique(self._rows(group))
        parts, held = self.parts, self._held

        def fetch() -> Fetched:
            with self._lock:
                late = self._held_in
                if not late:  # the held fetch, when in, leaves these rows out of its read
                    self.lead_rows += len(rows)
                    self.leads += 1
            if late and held is not None:
                return dataclasses.replace(held.result(), read=(0, 0, 0.0))
            return self.reader.fetch(rows, parts=parts)

        future = self._pool.submit(fetch)
        self._leads[(self._key, group)] = (future, True)
        return future, True

    def _submit(self, span: int) -> None:
        """Submit span ``span`` (past the last one: the following pipeline's), under the lock.
        Its rows are worked out in the fetch thread, not here."""
        assert self._key is not None and self._rows is not None
        if span < len(self._spans):
            key, spans, rows_of = self._key, self._spans, self._rows
        else:
            if self._following is None:
                return
            if self._next is None:
                nxt = self._following()
                if nxt is None:
                    self._following = None
                    return
                key, rows_of = nxt
                self._next = (key, cut_spans(len(key.groups), key.per_span), rows_of)
            key, spans, rows_of = self._next
            span -= len(self._spans)
            if span >= len(spans):
                return
        if (key, span) in self._futures:
            return
        groups = spans[span]

        def fetch() -> Fetched:
            return self.reader.fetch(np.concatenate([rows_of(g) for g in groups]), parts=self.parts)

        self._futures[(key, span)] = self._pool.submit(fetch)
