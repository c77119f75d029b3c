"""Options shared by several commands, declared once."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

__all__ = [
    "table_option",
    "storage_options_option",
    "json_option",
    "workers_option",
    "check_filter_option",
    "check_table_option",
    "filter_option",
    "version_option",
    "quiet_option",
    "emit_json",
    "loader_options",
    "loader_spec",
    "loader_table_option",
    "optional_table_option",
    "run_record",
    "given",
    "LOADER_KEYS",
    "parse_mixture_option",
    "existing_dir",
    "mib_to_bytes",
    "require_values",
    "usage_errors",
]


def check_table_option(ctx, param, value):  # noqa: ANN001, ANN201 - a click callback
    """Click callback of every table option: a malformed URI (``file:/x``, ``s3://`` without a
    bucket) is a usage error naming the option, before anything is created."""
    if value is None:
        return None
    from tokenloom.table.storage import StorageError, check_uri

    try:
        return check_uri(value)
    except StorageError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


table_option = click.option(
    "--table",
    "table",
    required=True,
    metavar="PATH",
    callback=check_table_option,
    help="The tokenloom table: a local directory or an object-store URI Lance accepts.",
)


def optional_table_option(help: str) -> Any:
    """``--table`` where another option can stand for it (``help`` says which); the same
    declaration as :data:`table_option`, not required."""
    return click.option(
        "--table", "table", default=None, metavar="PATH", help=help, callback=check_table_option
    )


loader_table_option = optional_table_option(
    "The tokenloom table: a local directory or an object-store URI Lance accepts "
    "[required unless --run names a training run, whose table is read]."
)
"""``--table`` of the commands that also take ``--run`` (the run's record names the table)."""


def given(ctx: click.Context, name: str) -> bool:
    """Whether the option whose keyword is ``name`` was given on the command line (or the
    environment), not left at its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def _parse_storage_options(ctx, param, value):  # noqa: ANN001, ANN202 - a click callback
    from tokenloom.table.storage import StorageError, parse_storage_options

    try:
        return parse_storage_options(value or ())
    except StorageError as exc:
        raise click.BadParameter(str(exc)) from exc


storage_options_option = click.option(
    "--storage-options",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_storage_options,
    help="Object-store option for Lance and tokenloom's side files (repeatable), e.g. "
    "aws_endpoint=http://127.0.0.1:8333, allow_http=true; the AWS_* environment fills the rest.",
)
"""``--storage-options KEY=VALUE`` (repeatable) as a dict; never stored in a record."""

workers_option = click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Backfill workers [default: CPU count, at most 8; 0 runs in this process].",
)
"""``--workers`` of every command that runs a backfill (one definition, one default)."""

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of text."
)
"""``--json`` of every command that prints figures (progress and warnings stay on stderr)."""


def check_filter_option(ctx, param, value):  # noqa: ANN001, ANN201 - a click callback
    """Click callback of every SQL filter option: a filter that is not one well-formed condition
    (a comment, unbalanced parentheses, a ``;``, an open string) is a usage error naming the
    option; whether it fits the table is checked when the table is open."""
    if value is None:
        return None
    from tokenloom.table.filters import FilterError, check_structure

    try:
        check_structure(value)
    except FilterError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def filter_option(help: str = "Rows to read.") -> Any:
    """``--filter SQL`` (``--where`` is the same option) of every command that selects rows,
    as the keyword argument ``filter``; ``help`` says what the rows are for."""
    return click.option(
        "--filter",
        "--where",
        "filter",
        default=None,
        metavar="SQL",
        callback=check_filter_option,
        help=f"{help} A SQL filter; --where is the same option.",
    )


def version_option(help: str = "Read this table version [default: latest].") -> Any:
    """``--version N`` of every command that reads a table: pin a table version (keyword
    argument ``table_version``); ``help`` says what is done with it."""
    return click.option(
        "--version",
        "table_version",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help=help,
    )


def _silence(ctx: click.Context, param: click.Parameter, value: bool) -> bool:  # noqa: ARG001
    if value:
        from tokenloom.progress import silenced

        ctx.with_resource(silenced())
    return value


quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_silence,
    help="Show no progress bars or progress lines (also TOKENLOOM_QUIET=1).",
)
"""``tokenloom --quiet CMD``: silences :mod:`tokenloom.progress` for the command."""


def emit_json(obj: Any) -> None:
    """Write ``obj`` as one JSON document on stdout."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def _default(name: str) -> Any:
    """A LoaderSpec / Recipe field's default: the CLI states no default of its own."""
    import dataclasses

    from tokenloom.loader.plan.recipe import Recipe
    from tokenloom.loader.plan.spec import LoaderSpec

    for cls in (LoaderSpec, Recipe):
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.default
    raise KeyError(name)


LOADER_KEYS = (
    "token_column",
    "filter",
    "seq_len",
    "global_batch",
    "seed",
    "drop_last",
    "lookahead",
    "block_order",
    "packing",
    "fit_window",
    "long_docs",
    "window",
    "overlap",
    "cut_column",
    "overlap_loss",
    "mixture",
    "budget_tokens",
    "eos_id",
    "table_version",
    "allow_missing",
    "order_by",
    "order_jitter",
    "loss_mask_column",
    *("group_by", "group_order", "group_name", "file_marker", "bos"),
)
"""The keyword arguments :func:`loader_options` adds to a command (:func:`loader_spec` takes
them back out)."""


RUN_HELP = (
    "Read every loader option from this training run's record (RUN/last.json, written by "
    "`tokenloom train --out RUN`, or RUN/step-N's): table, pinned version, filter, column, "
    "block length, batch, seed, recipe, mixture. A loader option given beside --run must "
    "equal the recorded value."
)


def loader_options(func=None, *, epoch: bool = False, run: bool = True):  # noqa: ANN001, ANN201
    """Every :class:`~tokenloom.loader.LoaderSpec` option, declared once for every command that
    builds a loader (train, verify, ledger, stats); defaults are the spec's.

    ``epoch=True`` adds ``--epoch`` (for commands that look at one epoch, like ``ledger``).
    ``run=True`` adds ``--run DIR``: the spec is a training run's recorded one (pair it with
    :data:`loader_table_option`; ``train`` continues a run with ``--resume`` instead). Use as
    ``@loader_options`` or ``@loader_options(epoch=True)``; turn the values into a spec with
    :func:`loader_spec`.
    """
    if func is None:
        return lambda f: loader_options(f, epoch=epoch, run=run)
    opts = [
        click.option(
            "--column",
            "token_column",
            default=_default("token_column"),
            show_default=True,
            help="Token column.",
        ),
        filter_option(),
        click.option(
            "--seq-len",
            type=click.IntRange(min=1),
            default=_default("seq_len"),
            show_default=True,
            help="Block length.",
        ),
        click.option(
            "--global-batch-size",
            "global_batch",
            type=click.IntRange(min=1),
            default=_default("global_batch"),
            show_default=True,
            help="Blocks per global step, over all ranks (each of W ranks packs G/W).",
        ),
        click.option(
            "--seed", type=click.IntRange(min=0), default=_default("seed"), show_default=True
        ),
        click.option(
            "--drop-last",
            is_flag=True,
            help="Leave out an epoch's incomplete last step instead of padding it.",
        ),
        click.option(
            "--lookahead/--no-lookahead",
            default=_default("lookahead"),
            show_default=True,
            help="Read one token past a block cut mid-document so its last label is real.",
        ),
        click.option(
            "--block-order",
            type=click.Choice(["interleave", "sequential"]),
            default=_default("block_order"),
            help="A global step takes one block from each of G stretches, or G consecutive "
            "[default: interleave; sequential with --order-by].",
        ),
        click.option(
            "--order-by",
            default=None,
            metavar="'COL [ASC|DESC] [NULLS FIRST|LAST], ...'",
            help="Curriculum: visit each epoch's rows sorted by these numeric/bool/time "
            "columns instead of shuffled (nulls and NaN last unless NULLS FIRST; ties in id "
            "order).",
        ),
        click.option(
            "--order-jitter",
            type=click.IntRange(min=1),
            default=_default("order_jitter"),
            show_default=True,
            metavar="N",
            help="With --order-by: shuffle each bucket of N consecutive documents of the sorted "
            "order by (seed, epoch) (1: the strict order).",
        ),
        click.option(
            "--packing",
            type=click.Choice(["concat", "best_fit"]),
            default=_default("packing"),
            show_default=True,
        ),
        click.option(
            "--fit-window",
            type=click.IntRange(min=1),
            default=_default("fit_window"),
            show_default=True,
            help="Best-fit look-ahead, in documents.",
        ),
        click.option(
            "--long-docs",
            type=click.Choice(["split", "window", "units"]),
            default=_default("long_docs"),
            show_default=True,
            help="units: windows that keep a section or function whole when it fits (needs "
            "--cut-column cut_structure).",
        ),
        click.option(
            "--window",
            type=click.IntRange(min=1),
            default=None,
            help="Window length for --long-docs window [default: --seq-len].",
        ),
        click.option(
            "--overlap",
            type=click.IntRange(min=0),
            default=_default("overlap"),
            show_default=True,
            help="Context-only tokens carried into the next window.",
        ),
        click.option(
            "--cut-column",
            default=None,
            help="With --long-docs window/units: end windows at these offsets (cut_points: "
            "line breaks; cut_structure: ranked section/paragraph/line boundaries).",
        ),
        click.option(
            "--overlap-loss",
            is_flag=True,
            default=False,
            help="Train the overlap's tokens again in later windows (default: context only).",
        ),
        click.option(
            "--mixture",
            default=None,
            metavar="JSON|FILE",
            help='Token-quota pools: {"name": ["SQL filter", share, max_passes?], ...}.',
        ),
        click.option(
            "--budget-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Positions per mixture epoch.",
        ),
        click.option(
            "--eos-id",
            type=click.IntRange(min=0),
            default=None,
            help="Separator id [default: the token column's tokenizer's EOS].",
        ),
        version_option("Pin a table version [default: latest]."),
        click.option(
            "--allow-missing",
            is_flag=True,
            help="Plan rows whose token count or filter column is not computed (after an "
            "append) instead of refusing; `tokenloom refresh` computes them.",
        ),
        click.option(
            "--loss-mask-column",
            default=None,
            metavar="COLUMN",
            help="Token spans per row (list<int32> of [start, end) pairs) whose targets get "
            "label -100, e.g. from `tokenloom backfill run --udf "
            "tokenloom.backfill.builtin:LossMask`.",
        ),
        click.option(
            "--group-by",
            default=None,
            metavar="COLUMN",
            help="Join the rows sharing this column's value (a package, a book) into one "
            "document: shuffled, packed and cut as one.",
        ),
        click.option(
            "--group-order",
            default=None,
            metavar="COLUMN|imports",
            help="Order of a group's rows: a column (then id), or imports (a Python module "
            "after the modules of its group it imports) [default: id].",
        ),
        click.option(
            "--group-name",
            default=None,
            metavar="COLUMN",
            help="The column naming each row (trace, {name} in --file-marker) [default: the "
            "--group-order column; path with imports; else id].",
        ),
        click.option(
            "--file-marker",
            default=None,
            metavar="TEXT",
            help="Text before each row's tokens, encoded by the column's tokenizer; {name} and "
            "{COLUMN} take the row's values, \\n and \\t are a newline and a tab "
            "(e.g. '<|file|> {name}\\n').",
        ),
        click.option(
            "--bos",
            is_flag=True,
            default=False,
            help="Start each document with the tokenizer's BOS id (refused when it has none).",
        ),
    ]
    if epoch:
        opts.append(
            click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True)
        )
    if run:
        opts.insert(0, click.option("--run", "run", default=None, metavar="RUN", help=RUN_HELP))
    for opt in reversed(opts):
        func = opt(func)
    return func


def group_option(values: dict[str, Any]) -> dict[str, Any] | None:
    """Pop ``--group-by``, ``--group-order``, ``--group-name``, ``--file-marker`` and ``--bos``
    out of ``values`` as a :class:`~tokenloom.loader.plan.spec.GroupSpec` mapping (``None``: none
    given)."""
    key, order = values.pop("group_by", None), values.pop("group_order", None)
    name, marker = values.pop("group_name", None), values.pop("file_marker", None)
    bos = bool(values.pop("bos", False))
    if key is None and order is None and name is None and marker is None and not bos:
        return None
    if marker is not None:
        marker = marker.replace("\\n", "\n").replace("\\t", "\t")
    return {"key": key, "order": order, "name": name, "marker": marker, "bos": bos}


def parse_mixture_option(value: str | None) -> Any:
    """``--mixture``: inline JSON or the path of a JSON file."""
    import os

    if not value:
        return None
    if os.path.exists(value):
        with open(value, encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = value
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON and not a file: {exc}", param_hint="--mixture") from exc


def loader_spec(table: str | None, options: dict[str, Any]) -> Any:
    """Pop :func:`loader_options`' values out of a command's keyword arguments into a
    :class:`~tokenloom.loader.LoaderSpec` (the remaining keys are the command's own).

    With ``--run DIR`` the spec is the run's recorded one (:func:`run_spec`); without it
    ``table`` is required.
    """
    from tokenloom.loader.plan.spec import LoaderSpec

    run = options.pop("run", None)
    values = {k: options.pop(k) for k in LOADER_KEYS if k in options}
    group = group_option(values)
    if run is not None:
        spec = run_spec(run, table, values)
        if group is not None:
            from tokenloom.loader.plan.epoch import PlanError
            from tokenloom.loader.plan.spec import GroupSpec

            with usage_errors(PlanError):
                same = GroupSpec.parse(group) == spec.group
            if not same:
                raise click.UsageError(
                    f"the grouping options differ from the run's ({spec.group}); drop them to "
                    "read the run's stream"
                )
        return spec
    if table is None:
        raise click.UsageError(
            "--table is required: pass --table PATH, or --run DIR to read the loader options "
            "(table included) from a training run's record"
        )
    values["version"] = values.pop("table_version", None)
    values["mixture"] = parse_mixture_option(values.get("mixture"))
    values["group"] = group
    from tokenloom.loader.plan.epoch import PlanError
    from tokenloom.table.filters import FilterError, check_structure

    with usage_errors(PlanError):
        spec = LoaderSpec.from_options(table=table, **values)

    for pool in spec.mixture or ():
        try:
            check_structure(pool.filter)
        except FilterError as exc:  # as --filter: a malformed one is a usage error
            raise click.BadParameter(f"pool {pool.name!r}: {exc}", param_hint="--mixture") from None
    check_loss_mask_option(spec)
    if spec.recipe.cut_column:
        _check_cut_column(spec)
    return spec


def check_loss_mask_option(spec: Any, storage_options: dict | None = None) -> None:
    """``--loss-mask-column``: a missing column or one of another type is a usage error
    (exit 2, naming the option). A table that cannot be opened here is left to the command,
    which reports it as it would without the option."""
    if spec.loss_mask_column is None:
        return
    from tokenloom.loader.pipeline.lossmask import LossMaskColumnError, check_mask_field

    try:
        import lance

        ds = lance.dataset(spec.table, version=spec.version, storage_options=storage_options)
        schema = ds.schema
    except Exception:  # noqa: BLE001 - the command opens the table again and says why
        return
    try:
        check_mask_field(schema, spec.loss_mask_column, spec.table)
    except LossMaskColumnError as exc:
        raise click.BadParameter(str(exc), param_hint="'--loss-mask-column'") from None


def _check_cut_column(spec: Any) -> None:
    """A ``--cut-column`` the table lacks, or of the wrong type, is a usage error (exit 2); a
    table that cannot be opened is left to the command to report."""
    from tokenloom.errors import TokenloomError
    from tokenloom.loader.pipeline.read import LoaderError, check_cut_column
    from tokenloom.table import Table
    from tokenloom.table.storage import is_remote

    if is_remote(spec.table):  # its credentials are the command's: it checks the column itself
        return
    try:
        ds = Table.open(spec.table, version=spec.version).dataset
    except (TokenloomError, OSError, ValueError):
        return
    try:
        check_cut_column(ds, spec.recipe.cut_column, units=spec.recipe.long_docs == "units")
    except LoaderError as exc:
        raise click.BadParameter(str(exc), param_hint="'--cut-column'") from None


def run_record(run: str, *, option: str = "--run") -> Any:
    """The :class:`~tokenloom.train.record.RunRecord` of the checkpoint ``run`` named by
    ``option``: a run directory (its latest checkpoint) or ``RUN/step-N``.

    Raises:
        click.BadParameter: ``run`` holds no record, or names a step the run did not keep (exit
            2, naming ``option`` and the steps kept).
        RecordError: The record is there but unreadable (exit 1, naming its path).
    """
    from tokenloom.train.layout import CheckpointNotFoundError
    from tokenloom.train.record import read_record, record_path

    try:
        path = record_path(run)
    except CheckpointNotFoundError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None
    if not os.path.isfile(path):
        what = "does not exist" if not os.path.exists(run) else f"holds no run record ({path})"
        raise click.BadParameter(
            f"{run!r} {what}; pass the --out directory of a `tokenloom train` run that has "
            "written a checkpoint (its last.json), or RUN/step-N",
            param_hint=f"'{option}'",
        )
    return read_record(run)


def _spelled(ctx: click.Context, key: str, value: Any) -> str:
    """How the option whose keyword is ``key`` was given, e.g. ``--seq-len 64``,
    ``--no-lookahead``."""
    for param in ctx.command.params:
        if param.name == key and isinstance(param, click.Option):
            if isinstance(value, bool) and (param.is_flag or param.secondary_opts):
                return param.opts[0] if value else (param.secondary_opts or param.opts)[0]
            return f"{param.opts[0]} {value}"
    return f"--{key.replace('_', '-')} {value}"


def run_changes(run: str | None) -> tuple[Any, ...]:
    """The stream changes recorded by the training run ``--run`` names (``()`` without
    ``--run``): with :func:`run_spec`'s spec, a planner lays out the run's own steps, the
    epochs its data changed in spliced (:mod:`tokenloom.loader.plan.change`)."""
    return run_record(run).changes if run is not None else ()


def run_spec(run: str, table: str | None, values: dict[str, Any]) -> Any:
    """The loader spec recorded by the training run ``run`` (``--run``), checked against the
    loader options given beside it.

    The rule: the record decides; an option given explicitly (not defaulted) is accepted only
    when it leaves the recorded spec unchanged, so a retyped flag can confirm the record but
    never silently reads another stream than the run's.

    Raises:
        click.UsageError: A given option differs from the record (exit 2, naming the option and
            the recorded value).
    """
    from tokenloom.loader.plan.epoch import PlanError
    from tokenloom.loader.plan.spec import absolute_uri
    from tokenloom.train.record import record_path

    ctx = click.get_current_context()
    record = run_record(run)
    spec = record.loader
    recorded = spec.to_dict()
    where = record_path(run)
    changes: dict[str, Any] = {k: v for k, v in values.items() if given(ctx, k)}
    if table is not None:
        changes["table"] = table
    for key, value in changes.items():
        field = {"table_version": "version"}.get(key, key)
        if key == "table":
            same = absolute_uri(value) == spec.table
        else:
            if key == "mixture":
                value = parse_mixture_option(value)
            try:
                same = spec.replace(**{field: value}) == spec
            except (PlanError, TypeError, ValueError):
                same = False
        if not same:
            shown = _spelled(ctx, key, changes[key])
            raise click.UsageError(
                f"{shown} differs from the {field} recorded by the run "
                f"({field} = {json.dumps(recorded.get(field))}, in {where}); drop "
                f"{shown.split()[0]} to read the run's stream, or drop --run and give every "
                "loader option yourself"
            )
    return spec


_REQUIRED: dict[type, type] = {}
_INT64_MAX = 2**63 - 1


def _required(kind: click.ParamType) -> click.ParamType:
    """``kind`` that also refuses an empty text, a number that is not finite, or an integer
    beyond 64 bits.

    No name, path, SQL filter, prompt or list a tokenloom option takes is empty, no count,
    size, rate or duration is NaN or infinite, and none exceeds what an int64 column, a numpy
    array or Lance can hold: such a value would reach the library and fail there as a bug (exit
    70) or be taken silently (an empty ``--text-field`` rejects every record), so it is refused
    here, as a usage error naming the option. The result is a copy of ``kind`` of a subclass of
    its class, so help texts (ranges, metavars) stay as they were.
    """
    base = type(kind)
    if base not in _REQUIRED:

        def convert(self: Any, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, str) and not value.strip():
                self.fail(
                    "an empty value is not allowed; give one or leave the option out", param, ctx
                )
            value = base.convert(self, value, param, ctx)
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(f"{value} is not a finite number", param, ctx)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT64_MAX:
                self.fail(f"{value} is out of range: at most {_INT64_MAX} (64 bits)", param, ctx)
            return value

        _REQUIRED[base] = type(f"Required{base.__name__}", (base,), {"convert": convert})
    new = copy.copy(kind)
    new.__class__ = _REQUIRED[base]
    return new


def require_values(command: click.Command) -> None:
    """Make every text, path and number parameter of ``command`` and its subcommands refuse an
    empty or non-finite value (see :func:`_required`): one rule for every option, present and
    future, instead of a check beside each one."""
    for param in command.params:
        kind = param.type
        checked = (
            click.types.StringParamType,
            click.Path,
            click.types.FloatParamType,
            click.types.IntParamType,
        )
        if isinstance(kind, checked) and type(kind) not in _REQUIRED.values():
            param.type = _required(kind)  # a FloatRange is a FloatParamType, an IntRange an Int
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            require_values(sub)


existing_dir = click.Path(exists=True, file_okay=False, dir_okay=True, path_type=str)
"""The type of an option naming a directory that must already exist (``--workdir``)."""


def mib_to_bytes(ctx: click.Context, param: click.Parameter, value: float | None) -> int | None:  # noqa: ARG001
    """A click callback: a size given in MiB (``--max-doc-mb``) as whole bytes, refusing a size
    under one byte (it would round to 0, a limit no record can meet)."""
    if value is None:
        return None
    size = int(value * (1 << 20))
    if size < 1:
        raise click.BadParameter(
            f"{value!r} MiB is under one byte (no record could pass); give at least "
            f"{1 / (1 << 20):.2g} MiB"
        )
    return size


@contextmanager
def usage_errors(*kinds: type[Exception]) -> Iterator[None]:
    """Report a library error of ``kinds`` raised while a config is built from the options as a
    usage error (exit 2), naming the options its message mentions.

    A config (a loader spec, a training config) validates the user's values in
    ``__post_init__``; the values came from the command line, so a refusal there is the
    user's to fix, not a data error. Wrap only the building of the config, not the work.
    """
    try:
        yield
    except kinds as exc:
        ctx = click.get_current_context(silent=True)
        message = str(exc)
        named = []
        for param in ctx.command.params if ctx is not None else ():
            words = {param.name or "", *(o.lstrip("-").replace("-", "_") for o in param.opts)}
            if any(w and re.search(rf"\b{re.escape(w)}\b", message) for w in words):
                named.append(max(param.opts, key=len))
        if named:
            raise click.BadParameter(message, param_hint=" / ".join(named)) from exc
        raise click.UsageError(message, ctx) from exc
