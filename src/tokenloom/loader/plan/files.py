"""Rows joined into one document: a group's files in order, with markers and a BOS.

With a :class:`~tokenloom.loader.plan.spec.GroupSpec` the plan's documents are *groups*: group
``g`` is the tokens of its rows (files) in their order, each file preceded by its *prefix* (the
group's BOS before the first file, then the file's marker), never stored in the table. The plan
sees a group as one row of ``len(group)`` tokens (its id is ``g``, its count the sum of its
files' tokens and prefixes), so every recipe shuffles, packs and cuts a group exactly as one
long document: one segment, one EOS at its end, windows across its files.

:class:`Files` holds the layout, CSR by group, and maps a group's token range back to its
pieces (:meth:`Files.unfold`): which file (table row) and which of its tokens, or which marker
tokens. The reader fills a group's tokens from those pieces, ``trace`` and ``verify`` read
them, the ledger counts the marker tokens apart. :func:`import_order` orders a group's Python
files after the modules they import. Pure numpy (and :mod:`ast`).
"""

from __future__ import annotations

import ast
import heapq
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenloom.loader.plan.epoch import PlanError
from tokenloom.loader.plan.window import CutPoints

__all__ = [
    "FILES_ALGORITHM",
    "Files",
    "Pieces",
    "import_order",
    "module_name",
    "group_cuts",
    "ragged",
]

FILES_ALGORITHM = "files-v1"
"""Identity of the group layout (prefix = BOS of the first file + marker; import order rule);
part of the plan fingerprint of a grouped spec."""

MARKER = 1
""":attr:`Pieces.kind` of marker (prefix) tokens; 0 is a file's own tokens."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Pieces:
    """Stretches of groups cut at their files' edges, in order (see :meth:`Files.unfold`)."""

    stretch: np.ndarray
    """``(K,)`` int64: the stretch each piece belongs to (ascending)."""
    kind: np.ndarray
    """``(K,)`` int8: 0 a file's tokens, :data:`MARKER` prefix tokens."""
    member: np.ndarray
    """``(K,)`` int64: the file (index into :attr:`Files.rows`)."""
    lo: np.ndarray
    """``(K,)`` int64: first token, in the file's own tokens (kind 0) or its prefix (kind 1)."""
    hi: np.ndarray
    """``(K,)`` int64: end of the range."""
    at: np.ndarray
    """``(K,)`` int64: where the piece starts in its group (document) coordinates."""

    def __len__(self) -> int:
        return int(self.stretch.shape[0])


@dataclass(frozen=True, kw_only=True, eq=False)
class Files:
    """A selection's rows as groups (documents) of files, CSR (see the module docstring).

    Args:
        rows: ``(R,)`` int64 table ids of the files, group after group, each group in order.
        at: ``(R,)`` int64 their positions in the selection (the plan inputs of the rows).
        gptr: ``(G + 1,)`` int64: group ``g``'s files are ``rows[gptr[g]:gptr[g + 1]]``.
        n_tokens: ``(R,)`` int64 stored token counts of the files.
        pptr: ``(R + 1,)`` int64: file ``m``'s prefix is ``prefix[pptr[m]:pptr[m + 1]]``.
        prefix: ``(P,)`` int64 prefix token ids (BOS, markers).
        bos: The BOS id put before each group's first file, or ``None``.
    """

    rows: np.ndarray
    at: np.ndarray
    gptr: np.ndarray
    n_tokens: np.ndarray
    pptr: np.ndarray
    prefix: np.ndarray
    bos: int | None = None
    starts: np.ndarray = field(init=False, repr=False)
    """``(R + 1,)`` int64: where each file (its prefix first) starts in the concatenation of
    all groups; group ``g`` starts at ``starts[gptr[g]]``."""

    def __post_init__(self) -> None:
        R = self.rows.shape[0]
        for name, n in (("at", R), ("n_tokens", R), ("pptr", R + 1)):
            if getattr(self, name).shape != (n,):
                raise PlanError(f"files: {name} must hold {n} values")
        if self.gptr.shape[0] < 1 or self.gptr[0] != 0 or self.gptr[-1] != R:
            raise PlanError("files: gptr must run from 0 to the number of files")
        if self.pptr[0] != 0 or self.pptr[-1] != self.prefix.shape[0]:
            raise PlanError("files: pptr must run from 0 to the number of prefix tokens")
        starts = np.zeros(R + 1, dtype=np.int64)
        np.cumsum(np.diff(self.pptr) + self.n_tokens, out=starts[1:])
        object.__setattr__(self, "starts", starts)

    @property
    def groups(self) -> int:
        return int(self.gptr.shape[0] - 1)

    @property
    def group_ids(self) -> np.ndarray:
        """``(G,)`` int64: the plan's row id of each group (its index)."""
        return np.arange(self.groups, dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """``(G,)`` int64 tokens of each group (files and prefixes): the plan's counts."""
        s = self.starts[self.gptr]
        return s[1:] - s[:-1]

    @property
    def prefix_tokens(self) -> int:
        """Prefix (BOS and marker) tokens of all groups."""
        return int(self.prefix.shape[0])

    def group_of(self, members: np.ndarray) -> np.ndarray:
        """The group of each file index."""
        return np.searchsorted(self.gptr, np.asarray(members, dtype=np.int64), side="right") - 1

    def prefix_of(self, member: int) -> np.ndarray:
        """File ``member``'s prefix ids."""
        return self.prefix[self.pptr[member] : self.pptr[member + 1]]

    def unfold(self, groups: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> Pieces:
        """Tokens ``[starts[i], stops[i])`` of group ``groups[i]``, cut into pieces of one
        file's tokens or one file's prefix each, in order (vectorised: no per-stretch Python).

        Raises:
            PlanError: A group id or range is outside the layout.
        """
        g = np.asarray(groups, dtype=np.int64)
        a = np.asarray(starts, dtype=np.int64)
        b = np.asarray(stops, dtype=np.int64)
        if g.size and (int(g.min()) < 0 or int(g.max()) >= self.groups):
            raise PlanError(f"files: group id outside 0..{self.groups - 1}")
        if g.size and bool(((a < 0) | (b < a) | (b > self.lengths[g])).any()):
            raise PlanError("files: a token range lies outside its group")
        base = self.starts[self.gptr[g]]
        A, B = base + a, base + b
        live = B > A
        first = np.searchsorted(self.starts, A, side="right") - 1
        last = np.searchsorted(self.starts, B, side="left") - 1
        count = np.where(live, last - first + 1, 0)
        stretch = np.repeat(np.arange(g.shape[0], dtype=np.int64), count)
        within = np.arange(stretch.shape[0], dtype=np.int64) - np.repeat(
            np.cumsum(count) - count, count
        )
        member = first[stretch] + within
        m0 = self.starts[member]  # the file's prefix starts here
        m1 = m0 + (self.pptr[member + 1] - self.pptr[member])  # its tokens start here
        m2 = self.starts[member + 1]
        lo_all, hi_all = A[stretch], B[stretch]
        # two candidate pieces per (stretch, file): its prefix, then its tokens
        p_lo, p_hi = np.maximum(lo_all, m0), np.minimum(hi_all, m1)
        f_lo, f_hi = np.maximum(lo_all, m1), np.minimum(hi_all, m2)
        K = stretch.shape[0]
        kind = np.tile(np.array([MARKER, 0], dtype=np.int8), K)
        lo = np.stack([p_lo - m0, f_lo - m1], axis=1).reshape(-1)
        hi = np.stack([p_hi - m0, f_hi - m1], axis=1).reshape(-1)
        at = np.stack([p_lo, f_lo], axis=1).reshape(-1) - np.repeat(base[stretch], 2)
        keep = hi > lo
        return Pieces(
            stretch=np.repeat(stretch, 2)[keep],
            kind=kind[keep],
            member=np.repeat(member, 2)[keep],
            lo=lo[keep],
            hi=hi[keep],
            at=at[keep],
        )

    def marker_counts(
        self, groups: np.ndarray, starts: np.ndarray, stops: np.ndarray
    ) -> np.ndarray:
        """``(S,)`` int64 prefix (marker and BOS) tokens within each range."""
        p = self.unfold(groups, starts, stops)
        m = p.kind == MARKER
        return np.bincount(
            p.stretch[m], weights=(p.hi - p.lo)[m], minlength=len(np.asarray(groups))
        ).astype(np.int64)

    def fill(
        self, pieces: Pieces, offsets: np.ndarray, file_tokens: np.ndarray, file_offsets: np.ndarray
    ) -> np.ndarray:
        """The ranges' tokens, concatenated (``offsets``: ``(S + 1,)`` of the ranges), from
        ``file_tokens`` (the file pieces' tokens, in piece order, at ``file_offsets``) and the
        prefixes: one scatter per kind."""
        total = int(offsets[-1])
        dtype = file_tokens.dtype if file_tokens.size else np.dtype(np.int64)
        out = np.empty(total, dtype=dtype)
        n = pieces.hi - pieces.lo
        # where each piece lands: its stretch's start plus the pieces before it in the stretch
        ends = np.cumsum(n)
        before = ends - n
        first = np.searchsorted(pieces.stretch, pieces.stretch, side="left")
        dest = offsets[pieces.stretch] + before - before[first] if len(n) else before
        for kind in (0, MARKER):
            sel = np.flatnonzero(pieces.kind == kind)
            if not sel.size:
                continue
            k = n[sel]
            step = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
            into = np.repeat(dest[sel], k) + step
            if kind == 0:
                src = np.repeat(file_offsets[:-1], k) + step
                out[into] = file_tokens[src]
            else:
                src = np.repeat(self.pptr[pieces.member[sel]] + pieces.lo[sel], k) + step
                out[into] = self.prefix[src].astype(dtype, copy=False)
        return out


def ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    step = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + step


def group_cuts(
    files: Files,
    positions: np.ndarray,
    read: Callable[[np.ndarray], CutPoints] | None,
) -> CutPoints:
    """The cut points of the groups at ``positions`` (their ids): each file's own cut points
    (``read``: the rows' cut points by selection position, ``None``: none) moved to where its
    tokens lie in the group, and a section boundary (rank 2) where each file but the first
    starts (before its prefix): a window of a group ends at a file's edge when one is in reach.
    """
    g = np.unique(np.asarray(positions, dtype=np.int64))
    count = files.gptr[g + 1] - files.gptr[g]
    members = ragged(files.gptr[g], count)
    owner = np.repeat(g, count)
    base = files.starts[files.gptr[owner]]
    tok0 = files.starts[members] + np.diff(files.pptr)[members] - base  # file tokens start
    edge = files.starts[members] - base  # file (prefix) starts
    vals = [edge[edge > 0]]
    grp = [owner[edge > 0]]
    ranks: list[np.ndarray] | None = [np.full(int((edge > 0).sum()), 2, dtype=np.int8)]
    if read is not None and members.size:
        cuts = read(files.at[members])
        lo, hi = cuts.segments(files.rows[members])
        k = hi - lo
        idx = np.repeat(lo, k) + (
            np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
        )
        inner = cuts.values[idx].astype(np.int64) + np.repeat(tok0, k)
        keep = inner > np.repeat(tok0, k)  # an offset 0 is the file's start: its edge already
        vals.append(inner[keep])
        grp.append(np.repeat(owner, k)[keep])
        if cuts.ranks is not None:
            ranks.append(cuts.ranks[idx][keep])  # type: ignore[union-attr]
        else:
            ranks = None
    values = np.concatenate(vals)
    owners = np.concatenate(grp)
    order = np.lexsort((values, owners))
    values, owners = values[order], owners[order]
    ptr = np.zeros(g.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(np.searchsorted(g, owners), minlength=g.shape[0]), out=ptr[1:])
    kinds = np.concatenate(ranks)[order] if ranks is not None else None
    return CutPoints(g, ptr, values, kinds)


def module_name(path: str) -> tuple[str, bool]:
    """``("json.decoder", False)`` for ``json/decoder.py``; ``("json", True)`` for
    ``json/__init__.py`` (a package)."""
    p = path.replace("\\", "/")
    p = p[: -len(".py")] if p.endswith(".py") else p
    parts = [s for s in p.split("/") if s]
    if parts and parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import[ \t]+[\w.])", re.M)


def _import_nodes(text: str) -> list[ast.stmt]:
    """The import statements of a source, at any depth: each line that starts one (with its
    parenthesised or backslash-continued lines) parsed by :mod:`ast` alone. Parsing the whole
    file gives the same statements for ordinary code and costs ~10x more; a line inside a string
    that reads as an import statement counts as one, and a line that does not parse is skipped.
    """
    out: list[ast.stmt] = []
    for match in _IMPORT_LINE.finditer(text):
        start = match.start()
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        while end < len(text) and (
            text[start:end].count("(") > text[start:end].count(")")
            or text[start:end].rstrip().endswith("\\")
        ):
            nxt = text.find("\n", end + 1)
            end = len(text) if nxt < 0 else nxt
        try:
            out.extend(ast.parse(text[start:end].strip()).body)
        except (SyntaxError, ValueError):  # not an import after all (or not Python 3)
            continue
    return out


def _imports(text: str, module: str, is_package: bool) -> list[tuple[str, ...]]:
    """What a module's source imports: per imported name, the dotted names it may mean, most
    specific first (``from a import b``: the submodule ``a.b``, else ``a``; ``import a.b``:
    ``a.b``, else ``a``); relative imports resolved."""
    out: list[tuple[str, ...]] = []
    package = module if is_package else module.rpartition(".")[0]

    def up(name: str) -> tuple[str, ...]:
        parts = name.split(".")
        return tuple(".".join(parts[:k]) for k in range(len(parts), 0, -1))

    for node in _import_nodes(text):
        if isinstance(node, ast.Import):
            out.extend(up(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = ".".join(p for p in (base, node.module or "") if p)
            else:
                target = node.module or ""
            if not target:
                continue
            out.extend((f"{target}.{alias.name}", *up(target)) for alias in node.names)
    return out


def import_order(paths: Sequence[str], texts: Sequence[str]) -> np.ndarray:
    """The order of one group's Python files: a module after the modules of the group it
    imports (``import a.b`` and ``from a import b`` need the module ``a.b`` when the group holds
    it, else ``a``), ties by path; a cycle is broken at its smallest path. Returns positions
    into ``paths``.
    """
    n = len(paths)
    names = [module_name(p) for p in paths]
    index: dict[str, int] = {}
    for i in sorted(range(n), key=lambda i: paths[i]):
        index.setdefault(names[i][0], i)
    needs: list[set[int]] = [set() for _ in range(n)]
    for i, (text, (mod, pkg)) in enumerate(zip(texts, names, strict=True)):
        for meanings in _imports(text or "", mod, pkg):
            for name in meanings:  # the most specific module of the group it names
                j = index.get(name)
                if j is not None:
                    if j != i:
                        needs[i].add(j)
                    break
    waiting = [len(s) for s in needs]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, s in enumerate(needs):
        for j in s:
            users[j].append(i)
    ready = [(paths[i], i) for i in range(n) if not waiting[i]]
    heapq.heapify(ready)
    done = [False] * n
    out: list[int] = []
    while len(out) < n:
        if not ready:  # only cycles are left: break one at its smallest path
            i = _cycle_head(needs, done, paths)
            waiting[i] = 0
            heapq.heappush(ready, (paths[i], i))
        _, i = heapq.heappop(ready)
        if done[i]:
            continue
        done[i] = True
        out.append(i)
        for u in users[i]:
            if not done[u]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (paths[u], u))
    return np.asarray(out, dtype=np.int64)


def _cycle_head(needs: list[set[int]], done: list[bool], paths: Sequence[str]) -> int:
    """The smallest path among the files of a cycle that waits on nothing outside itself (a
    file that only waits on a cycle is not one of them)."""
    memo: dict[int, set[int]] = {}

    def reach(i: int) -> set[int]:
        if i not in memo:
            seen, todo = set(), [i]
            while todo:
                for j in needs[todo.pop()]:
                    if not done[j] and j not in seen:
                        seen.add(j)
                        todo.append(j)
            memo[i] = seen
        return memo[i]

    left = sorted((i for i in range(len(done)) if not done[i]), key=lambda i: paths[i])
    for i in left:
        if all(i in reach(j) for j in reach(i)):
            return i
    return left[0]  # not reached: a file waiting only on placed files would be ready
