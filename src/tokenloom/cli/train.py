"""``tokenloom train`` and ``tokenloom sample``."""

from __future__ import annotations

import dataclasses
import os
import signal
import typing
from typing import Any

import click

from tokenloom.cli.options import (
    LOADER_KEYS,
    check_filter_option,
    check_loss_mask_option,
    check_table_option,
    emit_json,
    given,
    json_option,
    loader_options,
    loader_spec,
    parse_mixture_option,
    run_record,
    storage_options_option,
    usage_errors,
)
from tokenloom.loader.plan.change import DATA_CHANGES

__all__ = ["commands"]


def _option_type(f, hint) -> tuple[dict, str]:  # noqa: ANN001
    """click keywords for knob ``f`` whose annotation is ``hint`` (``X | None`` unwrapped)."""
    meta = f.metadata
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = typing.get_origin(args[0]) or args[0]
    if base is bool:
        return {"is_flag": True, "default": None}, ""
    if meta.get("multiple"):  # repeatable, each value a string the config parses
        return {"type": str, "default": None, "multiple": True}, ""
    if meta["choices"] is not None:
        kind: Any = click.Choice(list(meta["choices"]))
    elif base is int:
        kind = click.IntRange(min=meta["min"], max=meta["max"], min_open=meta["min_open"])
    elif base is float:
        kind = click.FloatRange(min=meta["min"], max=meta["max"], min_open=meta["min_open"])
    else:  # str, and tuples given as one comma-separated string (the config parses them)
        kind = str
    shown = f.default if f.default not in (None, ()) else ""
    return {"type": kind, "default": None}, str(shown)


def trainer_options(cls: type | None = None, callbacks: dict | None = None):  # noqa: ANN201
    """The ``--name`` options of every :func:`~tokenloom.train.config.knob` of ``cls``
    (:class:`~tokenloom.train.config.TrainConfig`): help, choices, range and the default shown
    come from the field, so a new trainer knob is one field. Every option defaults to ``None``
    (not given): the config's own default applies, and a resume tells what was given again."""
    from tokenloom.train.config import TrainConfig, knobs

    cls = cls or TrainConfig
    hints = typing.get_type_hints(cls)
    checks = _CALLBACKS if callbacks is None else callbacks

    def decorate(func):  # noqa: ANN001, ANN202
        for f in reversed(knobs(cls)):
            kw, shown = _option_type(f, hints[f.name])
            if f.metadata["metavar"]:
                kw["metavar"] = f.metadata["metavar"]
            if f.name in checks:
                kw["callback"] = checks[f.name]
            help_text = f.metadata["help"] + (f" [default: {shown}]" if shown else "")
            flag = f.metadata.get("flag") or f"--{f.name.replace('_', '-')}"
            func = click.option(flag, f.name, help=help_text, **kw)(func)
        return func

    return decorate


def _device_option(_ctx, _param, value):  # noqa: ANN001, ANN202 - a click callback
    return None if value is None else _device(value)


def _init_from_option(_ctx, _param, value):  # noqa: ANN001, ANN202 - a click callback
    """``--init-from``: a ``transformers`` folder, or ``RUN`` / ``RUN/step-N`` (resolved as
    every command resolves a checkpoint: a missing one is a usage error listing those kept)."""
    if value is None:  # click calls it for an option not given too: import nothing then
        return None
    from tokenloom.train.hf import is_hf_folder

    if not is_hf_folder(value):
        run_record(value, option="--init-from")
    return value


def _loss_slices_option(_ctx, _param, value):  # noqa: ANN001, ANN202 - a click callback
    """``--loss-slice NAME=SQL`` (repeatable) as ``(name, sql)`` pairs, well formed."""
    from tokenloom.train.slices import SliceError, parse_loss_slices

    try:
        return parse_loss_slices(value)
    except SliceError as exc:
        raise click.BadParameter(str(exc), param_hint="--loss-slice") from exc


def image_text_options(func):  # noqa: ANN001, ANN201
    """The image+text run's options (:class:`~tokenloom.vision.ImageTextSpec`): given
    ``--image-column``, ``train`` trains the tiny VLM on packed image+text blocks (the block's
    positions are ``--seq-len``)."""
    opts = [
        click.option("--image-column", default=None, metavar="COL",
                     help="Train the tiny VLM on image+text blocks: the encoded image column."),
        click.option("--prompt-column", default=None, metavar="COL",
                     help="Image+text: token column of the prompt (from `tokenloom tokenize "
                     "--text-column prompt --column prompt_ids`) [default: prompt_ids]."),
        click.option("--response-column", default=None, metavar="COL",
                     help="Image+text: token column of the response [default: response_ids]."),
        click.option("--width-column", default=None, metavar="COL",
                     help="Image+text: stored image width [default: width]."),
        click.option("--height-column", default=None, metavar="COL",
                     help="Image+text: stored image height [default: height]."),
        click.option("--image-cap", type=click.IntRange(min=1), default=None,
                     help="Image+text: most images per block [default: 4]."),
        click.option("--patch", type=click.IntRange(min=1), default=None,
                     help="Image+text: patch side, pixels [default: 16]."),
        click.option("--max-side", type=click.IntRange(min=1), default=None,
                     help="Image+text: longest image side after resizing [default: 64]."),
        click.option("--image-packing", type=click.Choice(["knapsack", "greedy"]), default=None,
                     help="Image+text: packing policy [default: knapsack]."),
        click.option("--on-error", type=click.Choice(["raise", "skip"]), default=None,
                     help="Image+text: a sample whose image does not decode stops the run, or "
                     "is skipped (its positions padding, counted) [default: raise]."),
    ]  # fmt: skip
    for opt in reversed(opts):
        func = opt(func)
    return func


IMAGE_KEYS = (
    "image_column",
    "prompt_column",
    "response_column",
    "width_column",
    "height_column",
    "image_cap",
    "patch",
    "max_side",
    "image_packing",
    "on_error",
)
"""The image+text options (keywords of :func:`image_text_options`)."""
_SHARED = ("table_version", "filter", "seq_len", "global_batch", "seed", "drop_last")
"""Loader options an image+text run takes too (the others are the token loader's)."""


def _image_spec_of(table: str, options: dict, image: dict):  # noqa: ANN202
    from tokenloom.vision.spec import ImageTextSpec

    named = {k: v for k, v in image.items() if v is not None}
    if "image_packing" in named:
        named["policy"] = named.pop("image_packing")
    fields = {"version": options.get("table_version"), "filter": options.get("filter"),
              "global_batch": options.get("global_batch"), "seed": options.get("seed"),
              "budget": options.get("seq_len"), "drop_last": options.get("drop_last")}  # fmt: skip
    return ImageTextSpec(table=table, **{k: v for k, v in fields.items() if v is not None}, **named)


def _image_config(ctx: click.Context, options: dict, image: dict, resume: bool, record):  # noqa: ANN001, ANN202, ARG001, E501
    """The TrainConfig of an image+text run (``--image-column``, or a resume of one)."""
    from tokenloom.loader.plan.epoch import PlanError
    from tokenloom.train.config import TrainConfig, TrainError

    table = options.pop("table")
    storage_options = options.pop("storage_options") or None
    out = options.pop("out")
    loader = {k: options.pop(k) for k in LOADER_KEYS if k in options}
    other = [k for k in loader if k not in _SHARED and given(ctx, k)]
    if other:
        flags = ", ".join("--" + k.replace("_", "-") for k in other)
        raise click.UsageError(
            f"{flags} belong to token tables; an image+text run (--image-column) packs blocks "
            "with --image-packing, --image-cap, --seq-len (positions per block): drop them"
        )
    own = _given_knobs(ctx, options)
    if record is not None:  # resume: the record's spec; options given again must match it
        spec = record.loader
        with usage_errors(PlanError):
            again = _image_spec_of(
                table or spec.table,
                {k: v for k, v in loader.items() if given(ctx, k)},
                {k: v for k, v in image.items() if given(ctx, k)},
            )
        want = {k: v for k, v in spec.to_dict().items() if k != "version"}
        have = {k: v for k, v in again.to_dict().items() if k != "version"}
        asked = {k for k in (*loader, *image) if given(ctx, k)} | ({"table"} if table else set())
        diff = [k for k in want if want[k] != have[k] and _asked(k, asked)]
        if diff:
            raise click.UsageError(
                f"the run was trained with {', '.join(f'{k}={want[k]!r}' for k in diff)}; a "
                "resume continues the same stream: drop the option(s) or start a new --out"
            )
        with usage_errors(TrainError):
            return TrainConfig.from_record(
                record, loader=spec, out=out, storage_options=storage_options, **own
            )
    if table is None:
        raise click.UsageError("--table is required (unless --resume continues a run)")
    with usage_errors(PlanError):
        spec = _image_spec_of(table, loader, image)
    if out is None:
        out = os.path.join("runs", f"vlm-{own.get('model') or 'tiny'}")
    with usage_errors(TrainError):
        return TrainConfig(loader=spec, out=out, storage_options=storage_options, **own)


def _asked(field: str, asked: set) -> bool:
    """Whether spec ``field`` was given again on a resume (by its option's keyword)."""
    alias = {"policy": "image_packing", "budget": "seq_len", "version": "table_version"}
    return alias.get(field, field) in asked


_CALLBACKS = {
    "val_filter": check_filter_option,
    "device": _device_option,
    "init_from": _init_from_option,
    "loss_slices": _loss_slices_option,
}
"""Checks of a knob's value that need the CLI (a malformed SQL filter, a device name): exit 2."""


@click.command(
    "train",
    epilog="""\b
Examples:
  tokenloom train --table corpus.lance --model tiny --seq-len 256 --global-batch-size 8 \\
      --steps 300 --filter "NOT is_dup AND id % 100 != 0" --val-filter "id % 100 = 0" \\
      --out runs/tiny
  tokenloom train --out runs/tiny --resume                 # every option from the record
  tokenloom train --table corpus.lance --out runs/long --steps 5000 --keep-every 1000 \
      --keep-last 3 --val-filter "id % 100 = 0" --keep-best   # runs/long/step-1000, ...
  tokenloom train --table corpus.lance --out runs/bf --packing best_fit --fit-window 256
  tokenloom train --table corpus.lance --out runs/win --long-docs window --window 256 \\
      --overlap 32 --cut-column cut_points
  tokenloom train --table corpus.lance --out runs/mix --mixture mix.json --budget-tokens 2000000
  tokenloom train --table corpus.lance --out runs/stage2 --init-from runs/mix \\
      --seq-len 512 --mixture stage2.json --budget-tokens 1000000 --steps 200
  tokenloom train --table corpus.lance --out runs/stage3 --init-from runs/stage2 \\
      --total-budget-tokens 5000000            # the steps the lineage has left
  tokenloom train --table corpus.lance --out runs/tb --log-to csv,tensorboard --json
  tokenloom train --table img.lance --image-column image --seq-len 96 --max-side 48 \\
      --global-batch-size 4 --on-error skip --out runs/vlm   # the tiny VLM on image+text
  tensorboard --logdir runs/tb/tensorboard                 # loss, lr, tok/s; runs/tb/metrics.csv
  torchrun --nproc-per-node 2 -m tokenloom.cli.main train --table corpus.lance \\
      --out runs/ddp --global-batch-size 16 --micro-batch-size 4 --epochs 1

\b
A progress bar (steps, ETA, loss) is shown on a terminal, a progress line every
TOKENLOOM_PROGRESS_SECONDS on stderr otherwise (`tokenloom --quiet train` for none).
With --json the log lines go to stderr and stdout holds one JSON object.""",
)
@click.option(
    "--table",
    default=None,
    metavar="PATH",
    callback=check_table_option,
    help="The table [a resume reads it from the record].",
)
@click.option(
    "--out",
    default=None,
    metavar="DIR",
    help="Run directory: last.json and the step-N checkpoints [default: runs/MODEL].",
)
@storage_options_option
@loader_options(run=False)
@image_text_options
@trainer_options()
@click.option("--plot", default=None, metavar="FILE", help="Write loss curves (PNG) at the end.")
@json_option
@click.option("--resume", is_flag=True, help="Continue OUT's checkpoint exactly.")
@click.option("--overwrite", is_flag=True, help="Replace a run already in --out.")
@click.option(
    "--allow-data-change",
    is_flag=True,
    help="On --resume: continue the cursor on other data (table version, filter, tokenizer, or "
    "a table rebuilt at the same URI) as is: the new data's plan from the same step, not exact.",
)
@click.option(
    "--data-change",
    type=click.Choice(DATA_CHANGES),
    default="refuse",
    show_default=True,
    help="On --resume, a table changed since the checkpoint: refuse (stay on the run's version; "
    "another version asked for is refused), or continue: move to the latest version (or "
    "--version) and finish the epoch with the rows not yet delivered that still pass plus the "
    "new ones; later epochs plan the new version. The record lists each version and its step.",
)
@click.option(
    "--reschedule",
    is_flag=True,
    help="On --resume: allow a different --steps/--epochs/--lr/--warmup-steps schedule.",
)
@click.option(
    "--reweight",
    is_flag=True,
    help="On --resume with a changed --mixture (shares or max_passes of the same pools): keep "
    "the quota each pool spent this epoch and plan the rest of its budget with the new shares.",
)
@click.option(
    "--exclude",
    "exclude",
    default=None,
    metavar="QUARANTINE",
    help="On --resume (of RUN, or of a kept RUN/step-N to rewind): leave the rows of `tokenloom "
    "quarantine --name QUARANTINE` out of the rest of the run, the stream otherwise unchanged.",
)
@click.pass_context
def train(
    ctx: click.Context,
    resume: bool,
    overwrite: bool,
    reschedule: bool,
    reweight: bool,
    exclude: str | None,
    allow_data_change: bool,
    data_change: str,
    plot: str | None,
    as_json: bool,
    **options,  # noqa: ANN003
) -> None:
    """Train GPT-2 straight from the table with document-isolated attention.

    Takes every loader option (packing, long documents, mixtures, block order); runs as one
    process or under torchrun (DDP: gloo on CPU, nccl on GPU). A resume needs only --out and
    --resume: the options come from the run's record, and one given again must match it.
    With --image-column it trains the tiny VLM on packed image+text blocks instead (prompt and
    response from token columns of `tokenloom tokenize --text-column`).
    """
    if data_change != "refuse" and not resume:
        raise click.BadParameter(
            f"--data-change {data_change} applies to --resume only: a new run plans the table "
            "as it is; pass --resume, or drop --data-change",
            param_hint="'--data-change'",
        )
    if data_change != "refuse" and allow_data_change:
        raise click.BadParameter(
            f"--data-change {data_change} and --allow-data-change exclude each other: "
            "--allow-data-change continues the cursor on the new data's plan as is; "
            f"--data-change {data_change} finishes the epoch exactly; pass one",
            param_hint="'--data-change'",
        )
    if (reweight or exclude is not None) and not resume:
        flag = "--reweight" if reweight else "--exclude"
        raise click.UsageError(f"{flag} changes a run's data mid-stream: it needs --resume")
    if reweight and exclude is not None:
        raise click.UsageError(
            "--reweight and --exclude are two changes: make one per resume (resume with one, "
            "let it checkpoint, then resume with the other)"
        )
    if (reweight or exclude is not None) and data_change != "refuse":
        raise click.UsageError(
            f"--data-change {data_change} and {'--reweight' if reweight else '--exclude'} are "
            "two changes: make one per resume"
        )
    rewind = None
    if resume and options.get("out") is not None:
        from tokenloom.train.layout import CheckpointNotFoundError, rewind_point

        try:
            rewind = rewind_point(options["out"])  # RUN/step-N: rewind RUN to step N
        except CheckpointNotFoundError as exc:
            raise click.BadParameter(str(exc), param_hint="'--out'") from None
    image = {k: options.pop(k) for k in IMAGE_KEYS}
    record = _image_record(options.get("out")) if resume else None
    if image["image_column"] is not None or record is not None:
        cfg = _image_config(ctx, options, image, resume, record)
    else:
        given_image = [k for k in IMAGE_KEYS if image[k] is not None]
        if given_image:
            flag = "--" + given_image[0].replace("_", "-")
            raise click.UsageError(
                f"{flag} applies to image+text runs: give --image-column COL (the encoded "
                "image column) to train the tiny VLM on image+text blocks"
            )
        cfg = _config(ctx, options, resume, reweight=reweight)
    if rewind is not None:
        cfg = dataclasses.replace(cfg, out=rewind.run)
    if record is None and image["image_column"] is None:
        _check_slices(cfg)
        check_loss_mask_option(cfg.loader, cfg.storage_options)  # on --resume too
    from tokenloom.table.core import Table

    Table.require(cfg.loader.table, storage_options=cfg.storage_options)
    # the trainer's imports (torch: seconds of CPU) after the checks, so a refusal is quick
    from tokenloom.loader.pipeline.exclude import ExcludeError
    from tokenloom.loader.plan.reweight import ReweightError
    from tokenloom.search.quarantine import QuarantineError
    from tokenloom.train.loop import train as run
    from tokenloom.train.runs import Interrupted

    try:
        result = run(
            cfg,
            resume=resume,
            overwrite=overwrite,
            reschedule=reschedule,
            allow_data_change=allow_data_change,
            data_change=data_change,
            reweight=reweight,
            exclude=exclude,
            rewind=rewind.step if rewind is not None else None,
            log=(lambda msg: click.echo(msg, err=True)) if as_json else click.echo,
            warn=lambda msg: click.echo(msg, err=True),
        )
    except (ReweightError, ExcludeError, QuarantineError) as exc:  # the new data: a usage error
        option = "--mixture" if isinstance(exc, ReweightError) else "--exclude"
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None
    except Interrupted as stopped:  # before the first step: no checkpoint to write
        name = signal.Signals(stopped.signum).name
        click.echo(f"stopped by {name} before the first step; no checkpoint written", err=True)
        raise click.exceptions.Exit(128 + stopped.signum) from None
    if int(os.environ.get("RANK") or 0) != 0:
        if result.interrupted:
            raise click.exceptions.Exit(128 + result.interrupted)
        return
    say = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    val = f", last val loss {result.val_losses[-1][1]:.4f}" if result.val_losses else ""
    last = f"{result.losses[-1]:.4f}" if result.losses else "n/a"
    say(
        f"done: step {result.step}, last loss {last}{val}, "
        f"{result.tokens / max(result.seconds, 1e-9):,.0f} tok/s, data wait "
        f"{100 * result.data_seconds / max(result.seconds, 1e-9):.1f}% of wall (+ "
        f"{result.startup_seconds:.1f} s loader start-up); checkpoint in {cfg.out}"
    )
    if as_json:
        emit_json(_summary(cfg, result, plot))
    if plot:
        from tokenloom.train.plot import plot_losses

        plot_losses(
            plot,
            result.history["train"],
            result.history["val"],
            title=f"{cfg.model} on {os.path.basename(cfg.loader.table.rstrip('/'))}",
        )
        say(f"loss curves: {plot}")
    if result.interrupted:  # checkpointed, but the run is not done: say so in the status
        raise click.exceptions.Exit(128 + result.interrupted)


def _image_record(out: str | None):  # noqa: ANN202
    """The record of the run in ``out`` when it is an image+text run, else ``None``."""
    if out is None:
        return None
    from tokenloom.train.record import RecordError, read_record
    from tokenloom.vision.spec import ImageTextSpec

    try:
        record = read_record(out)
    except RecordError:
        return None  # the token path reports it
    return record if isinstance(record.loader, ImageTextSpec) else None


def _device(value: str) -> str:
    """``--device``: a device name torch knows (whether this machine has it is the run's to
    say, exit status 1)."""
    from tokenloom.train.config import TrainError
    from tokenloom.train.dist import parse_device

    try:
        parse_device(value)
    except TrainError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from exc
    return value


def _check_slices(cfg) -> None:  # noqa: ANN001
    """Each ``--loss-slice`` filter planned on the table: an unknown column or invalid SQL is a
    usage error naming the option (before the run starts)."""
    from tokenloom.train.slices import SliceError, check_slices

    try:  # on every rank, so that all of them stop with the same status
        check_slices(
            cfg.loader.table,
            cfg.loss_slices,
            version=cfg.loader.version,
            storage_options=cfg.storage_options,
        )
    except SliceError as exc:
        raise click.BadParameter(str(exc), param_hint="--loss-slice") from exc


def _summary(cfg, result, plot: str | None) -> dict:  # noqa: ANN001
    """``train --json``: the run, this invocation's figures and the files it wrote."""
    from tokenloom.train.layout import step_name
    from tokenloom.train.metrics import CSV_NAME, TB_DIR

    files = {"checkpoint": os.path.join(cfg.out, step_name(result.step))}
    if "csv" in cfg.log_to:
        files["metrics_csv"] = os.path.join(cfg.out, CSV_NAME)
    if "tensorboard" in cfg.log_to:
        files["tensorboard"] = os.path.join(cfg.out, TB_DIR)
    if plot:
        files["plot"] = plot
    return {
        "out": cfg.out,
        "model": cfg.model,
        "table": cfg.loader.table,
        **result.to_json(),
        "files": files,
    }


def _config(ctx: click.Context, options: dict, resume: bool, *, reweight: bool = False):  # noqa: ANN202
    """The run's TrainConfig from the options given (a knob not given keeps TrainConfig's
    default), or on ``--resume`` from the run's record with the options given again laid over it
    (the loader and the resume checks then refuse a change that would break the exact
    continuation, naming it)."""
    from tokenloom.loader.plan.epoch import PlanError
    from tokenloom.train.config import TrainConfig, TrainError
    from tokenloom.train.record import read_record

    table = options.pop("table")
    storage_options = options.pop("storage_options") or None
    out = options.pop("out")
    if not resume:
        if table is None:
            raise click.UsageError("--table is required (unless --resume continues a run)")
        loader = loader_spec(table, options)
        own = _given_knobs(ctx, options)
        if out is None:
            model = own.get("model") or TrainConfig.__dataclass_fields__["model"].default
            out = os.path.join("runs", model)
        with usage_errors(TrainError):
            return TrainConfig(loader=loader, out=out, storage_options=storage_options, **own)
    if out is None:
        raise click.UsageError("--resume needs --out DIR (the run to continue)")
    record = read_record(out)
    given_loader = {k: options.pop(k) for k in LOADER_KEYS if k in options}
    changed = {k: v for k, v in given_loader.items() if given(ctx, k)}
    if table is not None:
        changed["table"] = table
    reordered = _check_reweight(record, changed, reweight)
    loader = record.loader
    if changed:
        spec_of = {**record.loader.to_dict(), "table": record.loader.table}
        spec_of.pop("spec_version", None)
        for key, value in changed.items():
            if key == "table_version":
                spec_of["version"] = value
            elif key == "mixture":
                spec_of["mixture"] = reordered or parse_mixture_option(value)
            else:
                spec_of[key] = value
        from tokenloom.loader.plan.spec import LoaderSpec

        with usage_errors(PlanError):
            loader = LoaderSpec.from_options(**spec_of)
    own = _given_knobs(ctx, options)
    with usage_errors(TrainError):
        return TrainConfig.from_record(
            record, loader=loader, out=out, storage_options=storage_options, **own
        )


def _check_reweight(record, changed: dict, reweight: bool):  # noqa: ANN001, ANN202
    """A changed ``--mixture`` on a resume needs ``--reweight`` and must keep the run's pools
    (usage errors naming the option); ``--reweight`` needs a changed mixture. Returns the new
    pools in the run's order (a pool's index seeds its passes and keys its counters), or
    ``None``."""
    from tokenloom.loader.plan.reweight import ReweightError, check_pools
    from tokenloom.loader.plan.spec import parse_pools

    if "mixture" not in changed:
        if reweight:
            raise click.UsageError(
                "--reweight re-plans the rest of the epoch with new shares: give the new "
                "mixture with --mixture new.json"
            )
        return None
    from tokenloom.loader.plan.epoch import PlanError

    try:
        new = parse_pools(parse_mixture_option(changed["mixture"]))
    except PlanError as exc:
        raise click.BadParameter(str(exc), param_hint="'--mixture'") from None
    if new == tuple(record.loader.mixture):
        return None  # the same mixture given again: nothing changes
    if not reweight:
        raise click.BadParameter(
            f"the run was trained with another mixture ({_pools(record.loader.mixture)}); "
            "pass --reweight to keep what each pool was fed this epoch and plan the rest of its "
            "budget with the new shares, or give the run's mixture again",
            param_hint="'--mixture'",
        )
    try:
        check_pools(record.loader.mixture, new)
    except ReweightError as exc:
        raise click.BadParameter(str(exc), param_hint="'--mixture'") from None
    by_name = {p.name: p for p in new}
    return tuple(by_name[p.name] for p in record.loader.mixture)


def _pools(pools) -> str:  # noqa: ANN001
    return ", ".join(f"{p.name} {p.share:g}" for p in pools) or "none"


def _given_knobs(ctx: click.Context, options: dict) -> dict:
    """The trainer knobs given on the command line; ``--epochs`` alone replaces ``--steps``."""
    own = {k: v for k, v in options.items() if given(ctx, k)}
    if "epochs" in own and "steps" not in own:
        own["steps"] = None
    if "steps" in own and "epochs" not in own:
        own["epochs"] = None
    if "total_budget_tokens" in own and "steps" not in own and "epochs" not in own:
        own["steps"] = None  # a lineage budget derives the steps (--steps only lowers them)
    return own


@click.command(
    "sample",
    epilog="""\b
Examples:
  tokenloom sample --run runs/tiny --prompt "In the beginning" --max-new-tokens 60
  tokenloom sample --run runs/tiny/step-200 --prompt "In the beginning" --temperature 0""",
)
@click.option(
    "--run", "--checkpoint", "checkpoint", required=True, metavar="RUN",
    help="The run's --out directory (its latest checkpoint) or RUN/step-N (--checkpoint is the "
    "same option).",
)  # fmt: skip
@click.option("--prompt", required=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=0.8,
    show_default=True,
    help="Sampling temperature (0: always the likeliest token).",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
def sample(
    checkpoint: str, prompt: str, max_new_tokens: int, temperature: float, seed: int
) -> None:
    """Continue a prompt with a trained checkpoint."""
    import torch

    from tokenloom.tokenize import load_tokenizer
    from tokenloom.train.checkpoint import load_run_model
    from tokenloom.train.model import generate

    run_record(checkpoint)  # a missing run is a usage error naming --run
    model, record = load_run_model(checkpoint)
    tok = load_tokenizer(record.tokenizer["name"])
    gen = torch.Generator().manual_seed(seed)
    ids = generate(
        model,
        tok.encode(prompt),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_id=record.tokenizer.get("eos_id"),
        generator=gen,
    )
    click.echo(prompt + tok.decode(ids))


commands = [train, sample]
