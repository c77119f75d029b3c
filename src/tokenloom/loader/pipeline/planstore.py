"""``PlanStore``: a plan's inputs and epoch layouts built once per node, mapped by every process.

Every rank and every DataLoader worker of a job computes the same plan from the same stored
counts (★3). For a large selection the layout (:attr:`~tokenloom.loader.plan.epoch.EpochPlan.order`
and ``marks``, about 4 bytes per document) is worth building once per machine: the first process
to ask takes a file lock, builds it, writes it under a temporary name and renames it into place
(atomic); every other process waits on the lock, then maps the same files read-only, so the
page cache holds one copy for the whole node.

Files live in a node-local directory (``$TOKENLOOM_PLAN_CACHE``, default
``<tmp>/tokenloom-plans-<uid>``), under a key of the selection's contents (a digest of its ids
and counts, the layout format and the permutation recipe) and ``(seed, epoch)``. What is read
back is what would be computed: the key pins every input of the layout, and a mapped layout
whose sizes disagree with the selection is rebuilt. Building epoch ``e`` removes the layouts of
epochs ``<= e - keep_epochs`` of the same selection and seed (a process still mapping one keeps
its pages until it unmaps them). Small selections (under ``min_docs`` rows) are planned in
memory: the plan costs milliseconds and a file per epoch would only add I/O.

The plan's *inputs* (the ``id``, ``n_tokens`` and ``_rowid`` columns a table scan yields, see
:func:`~tokenloom.loader.pipeline.inputs.scan_plan_inputs`) are shared the same way by
:meth:`PlanStore. arrays`: the first process to resolve a selection scans the table under the lock
and writes the columns' parts (``inputs/<key>/<column>.<part>.npy`` plus ``meta.json``), the others
map them. Their key is
a digest of what the scan depends on (table URI, version and data files, filter, columns,
options; see :func:`~tokenloom.loader.pipeline.inputs.plan_inputs_key`), not of the contents, which
are not known before the scan. Inputs are not pruned: one set per (table version, selection).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tokenloom.loader.plan.compact import CompactInts, count_nonzero
from tokenloom.loader.plan.epoch import MARK_EVERY
from tokenloom.loader.plan.shuffle import PERMUTATION_ALGORITHM

__all__ = [
    "PlanStore",
    "PLAN_CACHE_ENV",
    "LAYOUT_FORMAT",
    "SHARE_MIN_DOCS",
    "default_plan_dir",
    "open_arrays",
]

PLAN_CACHE_ENV = "TOKENLOOM_PLAN_CACHE"
"""Environment variable naming the node-local plan directory (``off`` or empty: no store)."""

LAYOUT_FORMAT = f"epoch-layout-v1;marks={MARK_EVERY};{PERMUTATION_ALGORITHM}"
"""Identity of what a stored layout holds (part of its key)."""

SHARE_MIN_DOCS = 1 << 20
"""Selections from this many rows are shared through the store; smaller ones stay in memory."""

_DIGESTS_KEPT = 8  # selections whose digest a store remembers (pools of a mixture, epochs)
_HASH_CHUNK = 1 << 20  # elements converted at a time while hashing (no full-size temporary)
_KEY = re.compile(r"^[0-9a-f]{8,64}$")


def default_plan_dir() -> str | None:
    """``$TOKENLOOM_PLAN_CACHE``, or ``<tmp>/tokenloom-plans-<uid>``; ``None`` when it is set
    to ``off`` or empty (plans then stay in each process's memory)."""
    env = os.environ.get(PLAN_CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else env
    return os.path.join(tempfile.gettempdir(), f"tokenloom-plans-{os.getuid()}")


class PlanStore:
    """A node-local directory of epoch layouts (see the module docstring).

    Args:
        root: The directory (created on first use); it must be on a local file system.
        min_docs: Selections with fewer rows are planned in memory.
        keep_epochs: Layouts of the same selection and seed kept on disk: building epoch ``e``
            removes those of epochs ``<= e - keep_epochs``.
    """

    def __init__(self, root: str, *, min_docs: int = SHARE_MIN_DOCS, keep_epochs: int = 2) -> None:
        if keep_epochs < 1 or min_docs < 0:
            raise ValueError(f"need keep_epochs >= 1 and min_docs >= 0 ({keep_epochs}, {min_docs})")
        self.root = os.path.abspath(os.path.expanduser(root))
        self.min_docs = int(min_docs)
        self.keep_epochs = int(keep_epochs)
        self.built = 0
        """Layouts this process built and wrote."""
        self.mapped = 0
        """Layouts this process mapped from files (its own included)."""
        self.inputs_built = 0
        """Sets of plan inputs (:meth:`arrays`) this process built and wrote."""
        self.inputs_mapped = 0
        """Sets of plan inputs this process mapped from files (its own included)."""
        self._digests: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, str]] = {}

    @classmethod
    def default(cls) -> PlanStore | None:
        """The store at :func:`default_plan_dir`, or ``None`` when it is switched off."""
        root = default_plan_dir()
        return None if root is None else cls(root)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_digests"] = {}  # a worker re-hashes its own arrays; never pickle them here
        for counter in ("built", "mapped", "inputs_built", "inputs_mapped"):
            state[counter] = 0  # the counters are per process
        return state

    def writable(self) -> bool:
        """Whether the store's directory exists or can be created, and can be written."""
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError:
            return False
        return os.access(self.root, os.W_OK)

    def selection_key(self, ids: Any, lens: Any) -> str:
        """Digest of a selection's ids and counts and of :data:`LAYOUT_FORMAT` (remembered per
        array pair, so each epoch of the same selection hashes it once). A
        :class:`~tokenloom.loader.plan.compact.CompactInts` column is hashed by its encoding (a
        function of its values, several times smaller than their int64 bytes)."""
        memo = (id(ids), id(lens))
        hit = self._digests.get(memo)
        if hit is not None and hit[0] is ids and hit[1] is lens:
            return hit[2]
        h = hashlib.sha256(LAYOUT_FORMAT.encode())
        for arr in (ids, lens):
            if isinstance(arr, CompactInts):  # its encoding is a function of its values
                h.update(f"compact:{arr.digest()};".encode())
                continue
            h.update(str(arr.shape[0]).encode() + b";")
            for lo in range(0, arr.shape[0], _HASH_CHUNK):  # the int64 bytes, whatever the dtype
                part = np.ascontiguousarray(arr[lo : lo + _HASH_CHUNK], dtype=np.int64)
                h.update(memoryview(part).cast("B"))
        key = h.hexdigest()[:24]
        self._digests[memo] = (ids, lens, key)
        while len(self._digests) > _DIGESTS_KEPT:
            self._digests.pop(next(iter(self._digests)))
        return key

    def path(
        self,
        ids: np.ndarray,
        lens: np.ndarray,
        *,
        seed: int,
        epoch: int,
        variant: str | None = None,
    ) -> str:
        """Directory of the layout of this selection and ``(seed, epoch)`` (``variant``: the
        digest of a curriculum order, :attr:`~tokenloom.loader.plan.order.Ordering.digest`)."""
        name = f"s{seed}-e{epoch}" + (f"-o{variant}" if variant else "")
        return os.path.join(self.root, self.selection_key(ids, lens), name)

    def layout(
        self,
        ids: np.ndarray,
        lens: np.ndarray,
        *,
        seed: int,
        epoch: int,
        build: Callable[..., tuple[np.ndarray, np.ndarray]],
        variant: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(order, marks)`` of an epoch: mapped from the store, built there first if absent.

        Args:
            ids: ``(N,)`` int64 ids of the selection.
            lens: ``(N,)`` int64 counts of the selection.
            seed: The job's seed.
            epoch: The epoch.
            build: Computes ``(order, marks)`` (called by at most one process per node). It is
                passed ``alloc(n, dtype)``, which returns the ``(n,)`` array to write the order
                into: the store's file mapped for writing (so the order being built lives in
                the page cache once, not also in the builder's heap), or a plain array.
            variant: A digest of what else the order depends on (a curriculum's sorted order
                and buckets), kept apart from the uniform order of the same selection.

        Returns:
            Read-only arrays, memory-mapped (or in memory below ``min_docs`` rows).
        """
        if ids.shape[0] < self.min_docs:
            return build(_alloc)
        final = self.path(ids, lens, seed=seed, epoch=epoch, variant=variant)
        parent = os.path.dirname(final)
        lock = self._lock(final, "planning")
        if lock is None:
            return build(_alloc)
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per node; the others wait, then map
            mapped = self._open(final, lens) if os.path.isdir(final) else None
            if mapped is None:
                order, marks = self._build_in_place(final, build)
                self._prune(parent, seed, epoch)
                self.built += 1
                mapped = self._open(final, lens)
                if mapped is None:  # pragma: no cover - only a broken file system gets here
                    return order, marks
        self.mapped += 1
        return mapped

    def _lock(self, final: str, fallback: str) -> Any:
        """The lock file beside ``final`` (its folder created), or ``None`` with a warning that
        the caller is ``fallback`` in memory because the store is not writable."""
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            return open(final + ".lock", "a+b")  # noqa: SIM115 - the caller closes it (with)
        except OSError as exc:
            warnings.warn(
                f"plan store {self.root} is not writable ({exc}); {fallback} in memory "
                f"(set {PLAN_CACHE_ENV} to a local writable directory, or 'off')",
                stacklevel=3,
            )
            return None

    def arrays(
        self,
        key: str,
        build: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]],
        *,
        folder: str = "inputs",
        min_rows: int | None = None,
        keep: int | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any], str | None]:
        """Named 1-D arrays and a small JSON ``meta``: mapped from the store, built there
        first if absent (the plan's inputs, see the module docstring; a held token column,
        :mod:`~tokenloom.loader.pipeline.fetch`, in ``folder="held"``).

        Args:
            key: What ``build`` computes, as a hex digest of everything it depends on.
            build: Computes ``(arrays, meta)``; ``meta["rows"]`` is the rows they describe
                (called by at most one process per node, unless there are fewer rows than
                ``min_rows``, by default ``min_docs``: then every process builds its own).
            folder: The store's folder of such sets.
            keep: Once a set is written, only the ``keep`` newest sets of ``folder`` are kept
                (a process mapping a removed one keeps its pages); ``None``: all.

        Returns:
            ``(arrays, meta, path)``: read-only mapped arrays and the directory they live in,
            or the built arrays and ``None`` (small, or the store is not writable).
        """
        if not _KEY.match(key):
            raise ValueError(f"store keys are hex digests, got {key!r}")
        least = self.min_docs if min_rows is None else int(min_rows)
        final = os.path.join(self.root, folder, key)
        what = "the plan inputs" if folder == "inputs" else f"the {folder} arrays"
        lock = self._lock(final, f"keeping {what}")
        if lock is None:
            return (*build(), None)
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one scan per node; the others wait, then map
            found = open_arrays(final) if os.path.isdir(final) else None
            if found is None:
                shutil.rmtree(final, ignore_errors=True)  # unreadable leftovers
                arrays, meta = build()
                if int(meta["rows"]) < least:
                    return arrays, meta, None
                self._write(final, arrays, meta)
                self.inputs_built += folder == "inputs"
                if keep is not None:
                    self._keep_newest(os.path.dirname(final), keep, final)
                found = open_arrays(final)
                if found is None:  # pragma: no cover - only a broken file system gets here
                    return arrays, meta, None
        self.inputs_mapped += folder == "inputs"
        return (*found, final)

    def _open(self, final: str, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            order = np.asarray(np.load(os.path.join(final, "order.npy"), mmap_mode="r"))
            marks = np.asarray(np.load(os.path.join(final, "marks.npy"), mmap_mode="r"))
        except (OSError, ValueError):
            order = marks = None
        n = count_nonzero(lens)
        if (
            order is None
            or marks is None
            or order.shape != (n,)
            or marks.shape != (-(-n // MARK_EVERY) + 1,)
            or int(marks[-1]) != int(lens.sum()) + n
        ):
            shutil.rmtree(final, ignore_errors=True)  # unreadable or not this selection's
            return None
        return order, marks

    @classmethod
    def _build_in_place(
        cls, final: str, build: Callable[..., tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Build a layout whose order is written straight into ``order.npy`` of a temporary
        folder (mapped for writing), then write the marks and rename the folder to ``final``."""
        tmp = _tmp_name(final)
        os.makedirs(tmp)
        try:
            path = os.path.join(tmp, "order.npy")

            def alloc(n: int, dtype: Any) -> np.ndarray:
                return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n,))

            order, marks = build(alloc)
            if isinstance(order, np.memmap) and os.path.exists(path):
                order.flush()
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            else:  # the builder made its own array
                cls._save(path, order)
            cls._save(os.path.join(tmp, "marks.npy"), marks)
            os.rename(tmp, final)  # atomic: a reader sees the whole layout or none
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return order, marks

    @staticmethod
    def _save(path: str, arr: np.ndarray) -> None:
        with open(path, "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def _write(cls, final: str, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None) -> None:
        tmp = _tmp_name(final)
        os.makedirs(tmp)
        try:
            for name, arr in arrays.items():
                cls._save(os.path.join(tmp, f"{name}.npy"), arr)
            if meta is not None:
                with open(os.path.join(tmp, "meta.json"), "w") as f:
                    json.dump({**meta, "arrays": sorted(arrays)}, f)
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(tmp, final)  # atomic: a reader sees the whole layout or none
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @staticmethod
    def _keep_newest(parent: str, keep: int, current: str) -> None:
        """Remove all but the ``keep`` newest sets of ``parent`` (``current`` always kept)."""
        sets = []
        for name in os.listdir(parent):
            path = os.path.join(parent, name)
            if _KEY.match(name) and os.path.isdir(path) and path != current:
                try:
                    sets.append((os.stat(path).st_mtime, path))
                except OSError:
                    continue
        for _, path in sorted(sets, reverse=True)[max(keep - 1, 0) :]:
            shutil.rmtree(path, ignore_errors=True)
            try:
                os.unlink(path + ".lock")
            except OSError:
                pass

    def _prune(self, parent: str, seed: int, epoch: int) -> None:
        pattern = re.compile(rf"s{seed}-e(\d+)(?:-o[0-9a-f]+)?(\.lock)?$")
        for name in os.listdir(parent):
            m = pattern.match(name)
            if m and int(m.group(1)) <= epoch - self.keep_epochs:
                path = os.path.join(parent, name)
                if m.group(2):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                else:
                    shutil.rmtree(path, ignore_errors=True)


def _tmp_name(final: str) -> str:
    return f"{os.path.dirname(final)}/.{os.path.basename(final)}.{secrets.token_hex(6)}.tmp"


def _alloc(n: int, dtype: Any) -> np.ndarray:
    return np.empty(n, dtype=dtype)


def open_arrays(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays and meta :meth:`PlanStore.arrays` wrote at ``path``, mapped read-only; ``None``
    when they are missing, unreadable or not 1-D."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        names = meta.pop("arrays")
        arrays = {
            n: np.asarray(np.load(os.path.join(path, f"{n}.npy"), mmap_mode="r")) for n in names
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(a.ndim != 1 for a in arrays.values()):
        return None
    return arrays, meta
