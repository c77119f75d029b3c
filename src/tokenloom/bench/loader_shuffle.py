"""The shuffle each loader actually gives, read from the batches it delivers over two epochs.

Every loader of ``bench loader`` delivers ``(B, L)`` token blocks, not document ids, and many
(pre-packed copies, Ray, litdata) lose the ids on the way. The synthetic corpus makes them
recoverable from the tokens themselves: token ids are uniform below EOS, so a document's first
:data:`KEY_TOKENS` tokens (62 bits) identify it (:func:`doc_index`). A document *start* in a
block is its position 0 or a position right after an EOS; looking each up in the index gives the
documents a loader delivered, in the order it delivered them (:func:`delivered_docs`), with no
change to the loader. Documents shorter than :data:`KEY_TOKENS` tokens, and starts cut by a
block's end, are not identified (the coverage says how many were).

Two figures per loader (:func:`shuffle_figures`):

* ``movement``: the mean over documents of ``|p1 - p0|``, their positions in epochs 0 and 1
  each normalised to ``[0, 1)``: 0 when every epoch has the same order, 1/3 for independent
  uniform random permutations;
* ``batch_shards``: distinct source shards (ranges of :data:`SHARD_DOCS` consecutive document
  ids, a Parquet row group, about one Lance read span) a batch's documents come from, mean over
  batches, beside ``batch_shards_uniform``: the same figure expected of a uniform random draw of
  as many documents (equal: as mixed as a global shuffle; far below: batches from few shards).

:func:`run_shuffle_quality` drives every loader of a run on a small corpus (``--shuffle-docs``)
for two epochs, each in a fresh process, and attaches the figures to the speed run's results.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenloom.bench.loader_data import EOS_ID, CorpusSpec, corpus_chunks

if TYPE_CHECKING:
    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_cases import CaseSpec
    from tokenloom.bench.loader_report import LoaderBench

__all__ = [
    "KEY_TOKENS",
    "SHARD_DOCS",
    "DocIndex",
    "ShuffleQuality",
    "doc_index",
    "delivered_docs",
    "shuffle_figures",
    "check_batch",
    "measure_shuffle",
    "run_isolated",
    "run_shuffle_quality",
    "format_shuffle",
]

KEY_TOKENS = 4
"""Leading tokens that identify a document (4 x 15.6 bits: no collision in practice)."""
SHARD_DOCS = 1024
"""Documents per source shard of the ``batch_shards`` figure."""
_EPOCHS_CAP = 3.0
"""Stop a loader after this many epochs' worth of document starts (loaders that drop some)."""


@dataclass(frozen=True)
class DocIndex:
    """Sorted document keys and their ids (see :func:`doc_index`)."""

    keys: np.ndarray
    """``(n,)`` uint64, sorted."""
    ids: np.ndarray
    """``(n,)`` int64, the document of each key."""
    docs: int
    """Documents of the corpus (the identifiable ones are ``len(keys)``)."""


def _keys(rows: np.ndarray) -> np.ndarray:
    """``(n, KEY_TOKENS)`` token ids -> ``(n,)`` uint64 keys (16 bits per token)."""
    out = np.zeros(rows.shape[0], dtype=np.uint64)
    for j in range(KEY_TOKENS):
        out = (out << np.uint64(16)) | rows[:, j].astype(np.uint64)
    return out


def _index(keys: np.ndarray, ids: np.ndarray, docs: int) -> DocIndex:
    order = np.argsort(keys, kind="stable")
    keys, ids = keys[order], ids[order]
    dup = np.zeros(keys.shape[0], dtype=bool)  # a key two documents share names neither
    same = keys[1:] == keys[:-1]
    dup[1:] |= same
    dup[:-1] |= same
    return DocIndex(keys=keys[~dup], ids=ids[~dup], docs=docs)


def doc_index(spec: CorpusSpec) -> DocIndex:
    """The key of every document of the corpus with at least :data:`KEY_TOKENS` tokens."""
    keys, ids = [], []
    for first, lens, values in corpus_chunks(spec):
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        ok = lens >= KEY_TOKENS
        at = starts[ok][:, None] + np.arange(KEY_TOKENS)
        keys.append(_keys(values[at]))
        ids.append(np.flatnonzero(ok) + first)
    return _index(np.concatenate(keys), np.concatenate(ids).astype(np.int64), spec.docs)


def delivered_docs(batch: np.ndarray, index: DocIndex, *, eos_id: int = EOS_ID) -> np.ndarray:
    """The documents whose start is in ``batch`` (``(B, L)`` tokens), in row-major order.

    A start is a row's position 0 or a position after an EOS, with :data:`KEY_TOKENS` tokens
    of the row from there on; one whose key is not in the index (a row starting mid-document)
    is not a start.
    """
    rows, length = batch.shape
    if length < KEY_TOKENS:
        return np.zeros(0, dtype=np.int64)
    usable = length - KEY_TOKENS + 1
    cand = np.zeros((rows, usable), dtype=bool)
    cand[:, 0] = True
    cand[:, 1:] = batch[:, : usable - 1] == eos_id
    r, c = np.nonzero(cand)
    at = c[:, None] + np.arange(KEY_TOKENS)
    keys = _keys(batch[r[:, None], at].reshape(-1, KEY_TOKENS))
    pos = np.searchsorted(index.keys, keys)
    pos = np.minimum(pos, max(index.keys.shape[0] - 1, 0))
    hit = index.keys[pos] == keys if index.keys.shape[0] else np.zeros(keys.shape[0], bool)
    return index.ids[pos[hit]]


@dataclass(frozen=True, kw_only=True)
class ShuffleQuality:
    """The shuffle figures of one loader (see the module)."""

    label: str
    movement: float | None = None
    """Mean normalised ``|position in epoch 1 - position in epoch 0|`` (uniform: 1/3)."""
    coverage: float | None = None
    """Share of the corpus's documents identified in both epochs."""
    batch_shards: float | None = None
    """Distinct source shards per batch (mean over the batches of the two epochs)."""
    batch_shards_uniform: float | None = None
    """What a uniform random draw of as many documents per batch gives (mean)."""
    batch_docs: float | None = None
    """Documents starting per batch (mean)."""
    batches: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _occurrence(ids: np.ndarray) -> np.ndarray:
    """For each entry, how many earlier entries hold the same id (0 for a first sighting)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    new = np.ones(sorted_ids.shape[0], dtype=bool)
    new[1:] = sorted_ids[1:] != sorted_ids[:-1]
    group_start = np.maximum.accumulate(np.where(new, np.arange(sorted_ids.shape[0]), 0))
    rank = np.empty_like(order)
    rank[order] = np.arange(sorted_ids.shape[0]) - group_start
    return rank


def _uniform_shards(m: np.ndarray, docs: int, shard_docs: int) -> np.ndarray:
    """Expected distinct shards hit by ``m`` documents drawn uniformly without replacement."""
    shards = -(-docs // shard_docs)
    size = docs / shards
    miss = np.exp(m * np.log1p(-min(size / docs, 1.0 - 1e-12)))  # (1 - s/N)^m
    return shards * (1.0 - miss)


def shuffle_figures(
    batches: Iterable[np.ndarray], docs: int, *, shard_docs: int = SHARD_DOCS, label: str = ""
) -> ShuffleQuality:
    """The figures of a loader from the document ids of its batches, in delivery order.

    Args:
        batches: Each batch's delivered document ids (see :func:`delivered_docs`); a document's
            first sighting is epoch 0, its second epoch 1, later ones are ignored.
        docs: Documents of the corpus (positions are normalised by the documents seen in each
            epoch; the coverage by ``docs``).
        shard_docs: Consecutive ids per source shard.
    """
    parts = [np.asarray(b, dtype=np.int64) for b in batches]
    if not parts or not sum(p.shape[0] for p in parts):
        return ShuffleQuality(label=label, batches=len(parts), error="no document identified")
    batch_of = np.repeat(np.arange(len(parts)), [p.shape[0] for p in parts])
    ids = np.concatenate(parts)
    occ = _occurrence(ids)
    first, second = occ == 0, occ == 1
    movement = coverage = None
    if second.any():
        pos = np.empty(ids.shape[0], dtype=np.float64)
        pos[first] = np.arange(first.sum()) / first.sum()
        pos[second] = np.arange(second.sum()) / second.sum()
        p0 = np.full(docs, np.nan)
        p1 = np.full(docs, np.nan)
        p0[ids[first]] = pos[first]
        p1[ids[second]] = pos[second]
        both = ~np.isnan(p0) & ~np.isnan(p1)
        movement = float(np.abs(p1[both] - p0[both]).mean())
        coverage = float(both.sum() / docs)
    keep = first | second  # the two epochs
    shard = ids[keep] // shard_docs
    per_batch = batch_of[keep]
    pairs = np.unique(np.stack([per_batch, shard]), axis=1)
    distinct = np.bincount(pairs[0], minlength=len(parts))
    m = np.bincount(per_batch, minlength=len(parts))
    nonempty = m > 0
    return ShuffleQuality(
        label=label,
        movement=movement,
        coverage=coverage,
        batch_shards=float(distinct[nonempty].mean()),
        batch_shards_uniform=float(_uniform_shards(m[nonempty], docs, shard_docs).mean()),
        batch_docs=float(m[nonempty].mean()),
        batches=len(parts),
    )


def check_batch(spec: CaseSpec, batch: Any) -> None:
    """Rows of ``L`` tokens, at most ``B`` of them: an epoch's last batch may be short (MDS)."""
    rows, length = (tuple(batch.shape) + (0, 0))[:2]
    if batch.ndim != 2 or length != spec.seq_len or not 0 < rows <= spec.batch_size:
        raise AssertionError(f"{spec.label}: batch shape {tuple(batch.shape)}")


def measure_shuffle(spec: CaseSpec, corpus: CorpusSpec, *, shard_docs: int = SHARD_DOCS) -> dict:
    """Drive ``spec``'s loader (in this process) until it delivered two epochs' documents.

    Stops when every identifiable document was seen twice, or after :data:`_EPOCHS_CAP` epochs'
    worth of starts (a loader that drops some documents never delivers them).
    """
    from tokenloom.bench.loader_cases import SOURCES, _Notes

    index = doc_index(corpus)
    wanted = index.keys.shape[0]
    seen = np.zeros(corpus.docs, dtype=np.int8)
    parts: list[np.ndarray] = []
    started = time.perf_counter()
    it = SOURCES[spec.kind](spec, _Notes())
    total = 0
    try:
        for batch in it:
            check_batch(spec, batch)
            got = delivered_docs(np.asarray(batch), index, eos_id=spec.eos_id)
            parts.append(got)
            total += got.shape[0]
            np.add.at(seen, got, 1)
            seen = np.minimum(seen, 2)
            if (seen >= 2).sum() >= wanted or total >= _EPOCHS_CAP * wanted:
                break
    finally:
        it.close()
    figures = shuffle_figures(parts, corpus.docs, shard_docs=shard_docs, label=spec.label)
    return replace(figures, seconds=time.perf_counter() - started).to_json()


def _child(target: Callable[..., dict], args: tuple, results: mp.Queue) -> None:
    try:
        results.put(("ok", target(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported as the loader's error
        tail = "".join(traceback.format_exception(exc)[-4:])
        results.put(("error", f"{type(exc).__name__}: {exc}\n{tail}"))
    # the result is on the pipe before anything (a library's exit hook) can end the process
    results.close()
    results.join_thread()


def run_isolated(target: Callable[..., dict], args: tuple, timeout_s: float) -> tuple[str, Any]:
    """``target(*args)`` in a fresh spawned process (a loader's workers, Ray and memory stay
    its own): ``("ok", its dict)`` or ``("error", why)``, stopped after ``timeout_s``."""
    from tokenloom.bench.loader import _kill_tree

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_child, args=(target, args, results), name="tokenloom-bench")
    proc.start()
    deadline = time.monotonic() + timeout_s
    outcome: tuple[str, Any] | None = None
    while outcome is None:
        try:
            outcome = results.get(timeout=0.2)
        except queue_mod.Empty:
            if not proc.is_alive():
                outcome = ("error", f"the loader's process exited ({proc.exitcode}) silently")
            elif time.monotonic() > deadline:
                outcome = ("error", f"stopped: not done within {timeout_s:.0f}s")
    proc.join(timeout=60)
    if proc.is_alive():
        _kill_tree(proc.pid)
        proc.join()
    return outcome


def _run_isolated(spec: CaseSpec, corpus: CorpusSpec, timeout_s: float) -> ShuffleQuality:
    kind, payload = run_isolated(measure_shuffle, (spec, corpus), timeout_s)
    if kind == "ok":
        return ShuffleQuality(**payload)
    return ShuffleQuality(label=spec.label, error=str(payload).splitlines()[0])


def run_shuffle_quality(
    config: LoaderBenchConfig,
    bench: LoaderBench,
    docs: int,
    *,
    log: Callable[[str], None] = lambda _msg: None,
    timeout_s: float = 900.0,
) -> list[ShuffleQuality]:
    """Every loader of ``config`` on a ``docs``-document corpus for two epochs; the figures are
    also added to the matching results of ``bench`` (``figures["shuffle"]``)."""
    from tokenloom.bench.loader import build_inputs, plan_cases

    # the long-document table is another corpus: its documents are not in the small one's index
    only = tuple(name for name in config.only if name != "long")
    if not only:
        return []
    small = replace(config, docs=docs, cache=("warm",), only=only)
    log(f"shuffle quality: {docs:,} documents, two epochs per loader")
    paths = {name: built.path for name, built in build_inputs(small, log).items()}
    out = []
    for spec in plan_cases(small, paths):
        log(f"shuffle of {spec.label} ...")
        # no time budget: the loader runs until its two epochs are delivered
        quality = _run_isolated(replace(spec, steps=None), small.corpus, timeout_s)
        out.append(quality)
        if quality.error:
            log(f"  FAILED: {quality.error}")
        else:
            log(f"  movement {_fmt(quality.movement)}, shards/batch {_fmt(quality.batch_shards)}")
        bench.attach(spec.label, "shuffle", quality.to_json())
    return out


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_shuffle(qualities: list[ShuffleQuality], bench: LoaderBench) -> str:
    """A table of the shuffle figures beside each loader's tokens/s (the speed run's)."""
    speed = {r.label: r.tokens_per_s for r in bench.primary if r.ok and r.cache == bench.cache}
    lines = [
        "shuffle quality (two epochs on the small corpus; movement: 0 = same order every epoch, "
        "0.333 = independent uniform shuffles; shards/batch: distinct ranges of "
        f"{SHARD_DOCS} ids per batch vs a uniform draw)",
        f"{'loader':<62} {'tok/s':>8} {'movement':>9} {'coverage':>9} {'shards/batch':>13} "
        f"{'uniform':>8} {'docs/batch':>10}",
    ]
    for q in qualities:
        tps = speed.get(q.label)
        tok = "n/a" if tps is None else f"{tps / 1e6:.2f}M"
        if q.error:
            lines.append(f"{q.label:<62} {tok:>8} failed: {q.error}")
            continue
        lines.append(
            f"{q.label:<62} {tok:>8} {_fmt(q.movement):>9} {_fmt(q.coverage):>9} "
            f"{_fmt(q.batch_shards, 1):>13} {_fmt(q.batch_shards_uniform, 1):>8} "
            f"{_fmt(q.batch_docs, 1):>10}"
        )
    return "\n".join(lines)
