"""``LoaderSpec``: every option of the training loader, defined once, validated once.

A spec says *which stream* a loader delivers: the table and its version, the rows (filter, token
column), the block length, the global batch, the seed, the packing recipe, the mixture. It does
not say *who reads it* (rank, world size, DataLoader workers) nor *where in it* (epoch, step):
those are the topology and the cursor, and the stream does not depend on them (★3).

Every consumer takes a spec whole: :class:`~tokenloom.loader.PackedDataset`, the
:class:`~tokenloom.loader.pipeline.planner.Planner` behind the ledger, ``verify`` and ``trace``, the
trainer's :class:`~tokenloom.train.loop.TrainConfig` and run record, and the CLI, which builds
one from one shared option set (:mod:`tokenloom.cli.options`). The module is pure: it imports
neither Lance nor torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenloom.loader.plan.epoch import PlanError, check_block_order
from tokenloom.loader.plan.recipe import Recipe
from tokenloom.loader.plan.schedule import share_weights
from tokenloom.loader.plan.stream.spec import StreamSpec, absolute_uri, check_int

__all__ = ["GroupSpec", "PoolSpec", "LoaderSpec", "parse_pools", "absolute_uri", "count_column_for"]

SPEC_VERSION = 1
"""Layout version of :meth:`LoaderSpec.to_dict`."""


_int = check_int


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolSpec:
    """One pool of a token-quota mixture."""

    name: str
    """The pool's name (in logs, the ledger and ``trace``)."""
    filter: str
    """SQL selecting the pool's rows (ANDed with the spec's ``filter``)."""
    share: float
    """Target share of the mixture's positions (``> 0``; shares are normalised by their sum)."""
    max_passes: int | None = None
    """Most passes over the pool's rows in one epoch (``None``: as many as its quota needs)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PlanError(f"a mixture pool needs a non-empty name, got {self.name!r}")
        if not isinstance(self.filter, str) or not self.filter.strip():
            raise PlanError(f"mixture pool {self.name!r} needs an SQL filter, got {self.filter!r}")
        share = self.share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1e9:
            raise PlanError(f"mixture pool {self.name!r}: share must be > 0, got {share!r}")
        object.__setattr__(self, "share", float(share))
        _int(f"mixture pool {self.name!r}: max_passes", self.max_passes, low=1, optional=True)

    def to_list(self) -> list[Any]:
        """``[filter, share]`` or ``[filter, share, max_passes]`` (the mixture file's form)."""
        out: list[Any] = [self.filter, self.share]
        return out + [self.max_passes] if self.max_passes is not None else out


def parse_pools(mixture: Any) -> tuple[PoolSpec, ...]:
    """Mixture pools from any of their spellings.

    Accepts ``None``/empty, a sequence of :class:`PoolSpec` (or of dicts with its fields), or
    the mixture-file mapping ``{name: [sql_filter, share] | [sql_filter, share, max_passes]}``.

    Raises:
        PlanError: A pool is malformed, or names repeat.
    """
    if not mixture:
        return ()
    pools: list[PoolSpec] = []
    if isinstance(mixture, Mapping):
        for name, spec in mixture.items():
            if isinstance(spec, PoolSpec):
                pools.append(spec)
                continue
            if isinstance(spec, Mapping):
                pools.append(PoolSpec(name=str(name), **spec))
                continue
            if isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) not in (2, 3):
                raise PlanError(
                    f"mixture pool {name!r} must be [sql_filter, share] or "
                    f"[sql_filter, share, max_passes], not {spec!r}"
                )
            flt, share, *cap = spec
            pools.append(
                PoolSpec(
                    name=str(name), filter=flt, share=share, max_passes=cap[0] if cap else None
                )
            )
    else:
        for item in mixture:
            pools.append(item if isinstance(item, PoolSpec) else PoolSpec(**dict(item)))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise PlanError(f"mixture pool names must be distinct, got {names}")
    return tuple(pools)


IMPORTS = "imports"
"""``GroupSpec.order`` value: order a group's Python files after the modules they import."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupSpec:
    """Rows joined into one training document (:mod:`~tokenloom.loader.plan.files`).

    With a ``key``, the selected rows sharing its value (a package, a book) become ONE document:
    they are shuffled as one, packed as one (one segment, one EOS at its end, cut like one long
    document), in the ``order`` of a column or, for Python files, of their imports. Each file
    may start with a marker and each document with the tokenizer's BOS: extra token ids, not
    stored in the table, counted apart by the ledger and checked by ``verify``. Without a key
    each row is its own document (markers and BOS only).
    """

    key: str | None = None
    """The column whose value groups rows (``None``: every row is its own document)."""
    order: str | None = None
    """How a group's rows are ordered: a column (ascending, then ``id``), or ``"imports"``:
    a Python module after the modules of its group it imports (ties and cycles by ``name``).
    ``None``: by ``id``."""
    name: str | None = None
    """The column naming each row (``trace``; ``{name}`` in ``marker``). ``None``: the order
    column, else ``path`` with ``order="imports"``, else ``id``."""
    marker: str | None = None
    """Text put before each row's tokens, encoded once per row by the column's tokenizer as
    ordinary text (``{name}`` and ``{COLUMN}`` are replaced by the row's values; a spelling such
    as ``<|file|>`` becomes the tokens its text encodes to). ``None``: no marker."""
    bos: bool = False
    """Start each document with the tokenizer's BOS id (refused when it defines none)."""

    def __post_init__(self) -> None:
        for what in ("key", "order", "name", "marker"):
            value = getattr(self, what)
            if value is not None and (not isinstance(value, str) or not value):
                raise PlanError(f"group {what} must be a non-empty string, got {value!r}")
        if not isinstance(self.bos, bool):
            raise PlanError(f"group bos must be True or False, got {self.bos!r}")
        if self.key is None and self.order is not None:
            raise PlanError(
                f"group order {self.order!r} orders the rows of a group; pass a key (--group-by)"
            )
        if self.key is None and self.marker is None and not self.bos:
            raise PlanError("a group spec needs a key (--group-by), a marker or bos")
        if self.marker is not None:
            import string

            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(self.marker) if f]
            except ValueError as exc:
                raise PlanError(f"group marker {self.marker!r}: {exc}") from None
            bad = [f for f in fields if not f.isidentifier()]
            if bad:
                raise PlanError(
                    f"group marker {self.marker!r}: {{{bad[0]}}} is not a column name; write "
                    "{name} or {COLUMN} (double braces for a literal brace)"
                )

    @property
    def name_column(self) -> str:
        """The column naming each row (see :attr:`name`)."""
        if self.name is not None:
            return self.name
        if self.order is not None:
            return "path" if self.order == IMPORTS else self.order
        return "id"

    def marker_columns(self) -> tuple[str, ...]:
        """Columns the marker reads (``name`` maps to :attr:`name_column`)."""
        if self.marker is None:
            return ()
        import string

        fields = {f for _, f, _, _ in string.Formatter().parse(self.marker) if f}
        return tuple(sorted(self.name_column if f == "name" else f for f in fields))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("key", "order", "name", "marker", "bos")}

    def describe(self) -> str:
        """A few words for logs."""
        out = f"grouped by {self.key}" if self.key else "one row per document"
        out += f" in {self.order} order" if self.order else ""
        out += f", marker {self.marker!r}" if self.marker else ""
        return out + (", BOS" if self.bos else "")

    @classmethod
    def parse(cls, value: Any) -> GroupSpec | None:
        """A group spec from ``None``, a :class:`GroupSpec` or its :meth:`to_dict` form."""
        if value is None or isinstance(value, GroupSpec):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"key", "order", "name", "marker", "bos"})
            if unknown:
                raise PlanError(f"unknown group option(s) {', '.join(unknown)}")
            return cls(**dict(value))
        raise PlanError(f"group must be a GroupSpec or a mapping, got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoaderSpec(StreamSpec):
    """Which stream of packed blocks a loader delivers (see the module docstring).

    ``table``, ``version``, ``filter``, ``global_batch`` (blocks per global step over all
    ranks), ``seed`` and ``drop_last`` (leave out the last incomplete step, its tokens counted
    as dropped, instead of completing it with whole padding blocks) are the common part
    (:class:`~tokenloom.loader.plan.stream.spec.StreamSpec`).
    """

    token_column: str = "input_ids"
    """The list column of token ids."""
    count_column: str | None = None
    """Its stored token counts; ``None``: ``n_tokens`` for ``input_ids``, else
    ``n_tokens_<suffix>`` (as ``tokenloom tokenize`` names them)."""
    seq_len: int = 1024
    """Positions per block ``L``."""
    lookahead: bool = True
    """Read one token past a block ending mid-document so its last label is real."""
    block_order: str | None = None
    """``interleave``: global slot ``j`` of step ``s`` holds block ``j*S + s`` (one block from
    each of ``G`` far-apart stretches of the stream, so a long document spreads over steps);
    ``sequential``: ``G`` consecutive blocks. ``None``: ``interleave``, or ``sequential`` with
    an ``order_by`` (interleaving would give every step blocks from the whole curriculum)."""
    recipe: Recipe = field(default_factory=Recipe)
    """How documents become blocks: packing, fit window, long-document policy, windows, cut
    column (:class:`~tokenloom.loader.plan.recipe.Recipe`)."""
    mixture: tuple[PoolSpec, ...] = ()
    """Token-quota pools (empty: one pool, the filter's rows)."""
    budget_tokens: int | None = None
    """Positions (tokens + EOS + padding) of a mixture epoch; ``None``: until the first pool
    capped by ``max_passes`` runs out."""
    eos_id: int | None = None
    """Separator after each document; ``None``: the token column's tokenizer's EOS."""
    pad_id: int | None = None
    """Padding id (always masked); ``None``: the tokenizer's pad, else ``eos_id``."""
    allow_missing: bool = False
    """Plan rows whose token count (or a column the filter reads) is not computed: null counts
    as zero-length, a null filter drops the row. Default: refuse, naming the command to run."""
    order_by: str | None = None
    """Curriculum: visit each epoch's rows sorted by these columns instead of shuffled, spelled
    ``"quality DESC"`` or ``"a DESC NULLS FIRST, b ASC"`` (:mod:`~tokenloom.loader.plan.order`:
    nulls and NaN last unless ``NULLS FIRST``; ties in ``id`` order). Stored canonical, every
    rule written out. ``None``: the uniform shuffle."""
    order_jitter: int = 1
    """With ``order_by``: the sorted documents are cut into buckets of this many, each shuffled
    by ``(seed, epoch)`` (1: the strict order)."""
    loss_mask_column: str | None = None
    """A column of token spans per row (``list<int32>`` of flat ``[start, end)`` pairs) whose
    targets get label ``-100`` (:mod:`~tokenloom.loader.pipeline.lossmask`); ``None``: no mask."""
    group: GroupSpec | None = None
    """Rows joined into one document, file markers and BOS (:class:`GroupSpec`); ``None``: each
    row is a document, as stored."""

    def __post_init__(self) -> None:
        StreamSpec.__post_init__(self)  # table, version, filter, global_batch, seed, drop_last
        for name in ("token_column", "count_column", "loss_mask_column"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise PlanError(f"{name} must be a column name, got {value!r}")
        if self.count_column is None:
            object.__setattr__(self, "count_column", count_column_for(self.token_column))
        if self.loss_mask_column in (self.token_column, self.count_column):
            raise PlanError(
                f"loss_mask_column {self.loss_mask_column!r} holds the token ids or their counts, "
                "not [start, end) token spans; name the mask (e.g. loss_mask)"
            )
        _int("seq_len", self.seq_len, low=1)
        _int("eos_id", self.eos_id, low=0, optional=True)
        _int("pad_id", self.pad_id, low=0, optional=True)
        for name in ("lookahead", "allow_missing"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_order()
        if not isinstance(self.recipe, Recipe):
            raise PlanError(f"recipe must be a Recipe, got {type(self.recipe).__name__}")
        if self.recipe.window is not None and self.recipe.window > self.seq_len:
            raise PlanError(
                f"window {self.recipe.window} is longer than seq_len {self.seq_len}; "
                f"a window must fit a block"
            )
        object.__setattr__(self, "mixture", parse_pools(self.mixture))
        _int("budget_tokens", self.budget_tokens, low=1, optional=True)
        if self.budget_tokens is not None and not self.mixture:
            raise PlanError("budget_tokens applies to a mixture only; pass mixture= or drop it")
        object.__setattr__(self, "group", GroupSpec.parse(self.group))
        if self.group is not None:
            other = [
                what
                for what, on in (
                    ("mixture", bool(self.mixture)),
                    ("order_by", self.order_by is not None),
                    ("loss_mask_column", self.loss_mask_column is not None),
                )
                if on
            ]
            if other:
                raise PlanError(
                    f"grouped rows (--group-by, --file-marker, --bos) are not combined with "
                    f"{', '.join(other)} yet; drop one of them"
                )

    def _check_order(self) -> None:
        from tokenloom.loader.plan.order import OrderError, format_order_by, parse_order_by

        _int("order_jitter", self.order_jitter, low=1)
        if self.order_by is None:
            if self.order_jitter != 1:
                raise PlanError(
                    f"order_jitter={self.order_jitter} applies to an order_by only; pass "
                    "order_by= (--order-by) or drop it"
                )
            order = "interleave" if self.block_order is None else self.block_order
        else:
            try:
                canonical = format_order_by(parse_order_by(self.order_by))
            except OrderError as exc:
                raise PlanError(str(exc)) from None
            object.__setattr__(self, "order_by", canonical)
            order = "sequential" if self.block_order is None else self.block_order
            if order == "interleave":
                raise PlanError(
                    f"order_by={canonical!r} needs block_order='sequential': interleave fills "
                    "every step with blocks from the whole epoch, which undoes the curriculum; "
                    "drop block_order (--block-order) or pass 'sequential'"
                )
        object.__setattr__(self, "block_order", check_block_order(order))

    # -- derived ------------------------------------------------------------------------------

    @property
    def unit(self) -> str:
        """A global step's items are blocks (``per_rank``: blocks each rank packs per step)."""
        return "blocks"

    @property
    def pool_names(self) -> tuple[str, ...]:
        """The pools' names (``("all",)`` without a mixture)."""
        return tuple(p.name for p in self.mixture) or ("all",)

    def replace(self, **changes: Any) -> LoaderSpec:
        """A copy with ``changes`` (validated again); recipe fields may be given flat."""
        recipe_keys = {f.name for f in dataclasses.fields(Recipe)}
        flat = {k: changes.pop(k) for k in list(changes) if k in recipe_keys}
        if flat:
            changes["recipe"] = dataclasses.replace(changes.get("recipe", self.recipe), **flat)
        return dataclasses.replace(self, **changes)

    def fingerprint_inputs(self) -> dict[str, Any]:
        """The spec's part of the plan's named inputs (the planner adds what it resolves from the
        table: the pinned version, tokenizer identity, EOS/pad ids, pool row digests).

        Defaults that older loaders did not record (concat packing, sequential order, no cut
        column) are left out, so their checkpoints still resume.
        """
        out: dict[str, Any] = {
            **self.stream_inputs(),
            "token_column": self.token_column,
            "seq_len": self.seq_len,
            "lookahead": self.lookahead,
            **self.recipe.fingerprint_inputs(),
        }
        if self.recipe.cut_column:
            out["cut_column"] = self.recipe.cut_column
        if self.block_order != "sequential":
            out["block_order"] = self.block_order
        if self.order_by is not None:  # absent otherwise: older checkpoints still resume
            from tokenloom.loader.plan.order import ORDER_ALGORITHM

            out["order_by"] = self.order_by
            out["order_jitter"] = self.order_jitter
            out["order_algorithm"] = ORDER_ALGORITHM
        if self.loss_mask_column:  # its name; its values are the table version's
            out["loss_mask_column"] = self.loss_mask_column
        if self.group is not None:  # absent otherwise: older checkpoints still resume
            from tokenloom.loader.plan.files import FILES_ALGORITHM

            out["group"] = {**self.group.to_dict(), "algorithm": FILES_ALGORITHM}
        return out

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (recipe flattened, pools as the mixture-file mapping)."""
        out: dict[str, Any] = {"spec_version": SPEC_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "recipe":
                out.update(dataclasses.asdict(value))
            elif f.name == "mixture":
                out["mixture"] = {p.name: p.to_list() for p in value} or None
            elif f.name == "group":
                if value is not None:  # absent otherwise: older records read the same
                    out["group"] = value.to_dict()
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoaderSpec:
        """Read :meth:`to_dict`'s form (unknown keys are an error naming them)."""
        data = dict(data)
        version = data.pop("spec_version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise PlanError(
                f"loader spec has layout version {version!r}; this tokenloom reads {SPEC_VERSION}"
            )
        return cls.from_options(**data)

    @classmethod
    def from_options(cls, **options: Any) -> LoaderSpec:
        """A spec from flat keyword options (recipe fields and ``mixture`` in any spelling).

        Raises:
            PlanError: An unknown option (named, with the known ones), or an invalid value.
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"recipe"}
        recipe_keys = {f.name for f in dataclasses.fields(Recipe)}
        unknown = sorted(set(options) - own - recipe_keys)
        if unknown:
            raise PlanError(
                f"unknown loader option(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(own | recipe_keys))}"
            )
        recipe = Recipe(**{k: options.pop(k) for k in list(options) if k in recipe_keys})
        return cls(recipe=recipe, **options)

    def describe(self) -> str:
        """One line for logs: the recipe, block length, batch, order and mixture."""
        r = self.recipe
        what = r.packing + (f"(fit {r.fit_window})" if r.packing == "best_fit" else "")
        if r.windows:
            what += f", {r.long_docs} {r.window or self.seq_len}+{r.overlap}"
            what += " (overlap trained)" if r.overlap_loss else ""
            what += f" cut at {r.cut_column}" if r.cut_column else ""
        pools = self._describe_mixture()
        return (
            f"{what}, {self.global_batch} x {self.seq_len} per step, {self.block_order} order, "
            f"seed {self.seed}"
            + (f", order by {self.order_by} jitter {self.order_jitter}" if self.order_by else "")
            + (f", mixture {pools}" if pools else "")
            + (f", {self.group.describe()}" if self.group is not None else "")
        )

    def _describe_mixture(self) -> str:
        """The pools' shares as the schedule holds them (normalised, rounded for reading) and
        the blocks each gives a global step (``floor`` or ``ceil`` of its exact quota)."""
        if not self.mixture:
            return ""
        G = self.global_batch
        try:
            w = share_weights([p.share for p in self.mixture])
        except PlanError:  # a share too small for the schedule: its planner says so
            total = sum(p.share for p in self.mixture)
            return ", ".join(f"{p.name} {_percent(p.share / total)}" for p in self.mixture)
        W = int(w.sum())
        parts = []
        for p, wp in zip(self.mixture, w.tolist(), strict=True):
            lo, hi = G * wp // W, -(-G * wp // W)
            parts.append(f"{p.name} {_percent(wp / W)} ({lo if lo == hi else f'{lo}-{hi}'})")
        return f"of each step's {G} blocks: " + ", ".join(parts)


def _percent(fraction: float) -> str:
    """``fraction`` as a person writes a percentage: ``40%``, ``33.3%``, ``0.01%``."""
    pct = 100.0 * fraction
    text = f"{pct:.1f}".rstrip("0").rstrip(".")
    if text == "0":  # a share under 0.05%: its first digits
        text = f"{pct:.1g}"
    return text + "%"


def count_column_for(token_column: str) -> str:
    """The token-count column stored beside a token column (``input_ids`` -> ``n_tokens``,
    ``input_ids_bpe`` -> ``n_tokens_bpe``, ``ids_x`` -> ``ids_x_n_tokens``)."""
    if token_column.startswith("input_ids"):
        return "n_tokens" + token_column[len("input_ids") :]
    return f"{token_column}_n_tokens"
