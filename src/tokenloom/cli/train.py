"""``tokenloom train`` and ``tokenloom sample``."""

from __future__ import annotations

import os
import signal

import click

from tokenloom.cli.options import (
    LOADER_KEYS,
    check_filter_option,
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

__all__ = ["commands"]


@click.command(
    "train",
    epilog="""\b
Examples:
  tokenloom train --table corpus.lance --model tiny --seq-len 256 --global-batch-size 8 \\
      --steps 300 --filter "NOT is_dup AND id % 100 != 0" --val-filter "id % 100 = 0" \\
      --out runs/tiny
  tokenloom train --out runs/tiny --resume                 # every option from the record
  tokenloom train --table corpus.lance --out runs/bf --packing best_fit --fit-window 256
  tokenloom train --table corpus.lance --out runs/win --long-docs window --window 256 \\
      --overlap 32 --cut-column cut_points
  tokenloom train --table corpus.lance --out runs/mix --mixture mix.json --budget-tokens 2000000
  tokenloom train --table corpus.lance --out runs/stage2 --init-from runs/mix \\
      --seq-len 512 --mixture stage2.json --budget-tokens 1000000 --steps 200
  tokenloom train --table corpus.lance --out runs/stage3 --init-from runs/stage2 \\
      --total-budget-tokens 5000000            # the steps the lineage has left
  tokenloom train --table corpus.lance --out runs/tb --log-to csv,tensorboard --json
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
@click.option("--out", default=None, metavar="DIR", help="Run directory [default: runs/MODEL].")
@storage_options_option
@loader_options(run=False)
@click.option(
    "--model", type=click.Choice(["tiny", "small", "medium"]), default="tiny", show_default=True
)
@click.option(
    "--val-filter",
    default=None,
    metavar="SQL",
    callback=check_filter_option,
    help="Held-out rows for val loss.",
)
@click.option(
    "--micro-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Blocks per forward pass per process B [default: the process's whole share, G/W]; "
    "K = G / (B x processes) micro-batches are accumulated per step.",
)
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Optimizer steps [100].")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Instead of --steps.")
@click.option(
    "--stop-at",
    type=click.IntRange(min=1),
    default=None,
    help="End this invocation at this step (checkpointed); the schedule still runs to --steps.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="End this invocation (checkpointed) after this much training time.",
)
@click.option(
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=3e-3,
    show_default=True,
    help="Peak learning rate.",
)
@click.option("--min-lr-ratio", type=click.FloatRange(min=0, max=1), default=0.1, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(min=0), default=None, help="[5% of steps]")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.1, show_default=True)
@click.option(
    "--attention", type=click.Choice(["document", "causal"]), default="document", show_default=True
)
@click.option(
    "--kernel",
    type=click.Choice(["auto", "sdpa", "flex"]),
    default="auto",
    show_default=True,
    help="Document-mask kernel (auto: flex_attention on CUDA, SDPA mask otherwise).",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    callback=lambda _ctx, _param, value: _device(value),
    help="auto, cpu, cuda, cuda:1, ...",
)
@click.option(
    "--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True
)
@click.option("--compile", is_flag=True, help="torch.compile the model.")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--eval-batches", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--log-every", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--log-to",
    default=None,
    metavar="SINKS",
    callback=lambda _ctx, _param, value: _log_to(value),
    help="Also write the logged metrics to: csv (OUT/metrics.csv), tensorboard "
    "(OUT/tensorboard/); comma-separated.",
)
@click.option(
    "--loss-slice",
    "loss_slices",
    multiple=True,
    metavar="NAME=SQL",
    callback=lambda _ctx, _param, value: _loss_slices(value),
    help="Also report the training and validation loss of the rows under SQL as NAME "
    "(e.g. \"code=source = 'python_stdlib'\"); repeatable. Mixture pools are reported always.",
)
@click.option(
    "--provenance-log",
    is_flag=True,
    help="Each rank appends OUT/provenance-rankR.jsonl (what `tokenloom trace` recomputes).",
)
@click.option(
    "--init-from",
    default=None,
    metavar="DIR",
    help="Start from another run's weights (a new stage: new data, schedule and step count).",
)
@click.option(
    "--keep-optimizer", is_flag=True, help="With --init-from: keep its optimizer moments too."
)
@click.option(
    "--total-budget-tokens",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Cap the tokens (block positions) of the whole lineage, --init-from runs included: "
    "the run plans the steps that remain (--steps only lowers them).",
)
@click.option("--plot", default=None, metavar="FILE", help="Write loss curves (PNG) at the end.")
@json_option
@click.option("--resume", is_flag=True, help="Continue OUT's checkpoint exactly.")
@click.option("--overwrite", is_flag=True, help="Replace a run already in --out.")
@click.option(
    "--allow-data-change",
    is_flag=True,
    help="On --resume: continue the cursor on other data (table version, filter, tokenizer, or "
    "a table rebuilt at the same URI).",
)
@click.option(
    "--reschedule",
    is_flag=True,
    help="On --resume: allow a different --steps/--epochs/--lr/--warmup-steps schedule.",
)
@click.pass_context
def train(
    ctx: click.Context,
    resume: bool,
    overwrite: bool,
    reschedule: bool,
    allow_data_change: bool,
    plot: str | None,
    as_json: bool,
    **options,  # noqa: ANN003
) -> None:
    """Train GPT-2 straight from the table with document-isolated attention.

    Takes every loader option (packing, long documents, mixtures, block order); runs as one
    process or under torchrun (DDP: gloo on CPU, nccl on GPU). A resume needs only --out and
    --resume: the options come from the run's record, and one given again must match it.
    """
    from tokenloom.train.loop import train as run
    from tokenloom.train.runs import Interrupted

    cfg = _config(ctx, options, resume)
    _check_slices(cfg)
    try:
        result = run(
            cfg,
            resume=resume,
            overwrite=overwrite,
            reschedule=reschedule,
            allow_data_change=allow_data_change,
            log=(lambda msg: click.echo(msg, err=True)) if as_json else click.echo,
            warn=lambda msg: click.echo(msg, err=True),
        )
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


def _loss_slices(value: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``--loss-slice NAME=SQL`` (repeatable) as ``(name, sql)`` pairs, well formed."""
    from tokenloom.train.slices import SliceError, parse_loss_slices

    try:
        return parse_loss_slices(value)
    except SliceError as exc:
        raise click.BadParameter(str(exc), param_hint="--loss-slice") from exc


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


def _log_to(value: str | None) -> tuple[str, ...] | None:
    """``--log-to csv,tensorboard`` as a tuple (``None`` when not given)."""
    from tokenloom.train.metrics import parse_log_to

    if value is None:
        return None
    try:
        return parse_log_to(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--log-to") from exc


def _summary(cfg, result, plot: str | None) -> dict:  # noqa: ANN001
    """``train --json``: the run, this invocation's figures and the files it wrote."""
    from tokenloom.train.metrics import CSV_NAME, TB_DIR

    files = {"checkpoint": os.path.join(cfg.out, "last.pt")}
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


def _config(ctx: click.Context, options: dict, resume: bool):  # noqa: ANN202
    """The run's TrainConfig: from the options, or on ``--resume`` from the run's record with
    the options given again laid over it (the loader and the resume checks then refuse a
    change that would break the exact continuation, naming it)."""
    from tokenloom.loader.plan import PlanError
    from tokenloom.train.config import TrainConfig, TrainError
    from tokenloom.train.record import read_record

    table = options.pop("table")
    storage_options = options.pop("storage_options") or None
    if not resume:
        if table is None:
            raise click.UsageError("--table is required (unless --resume continues a run)")
        if options["out"] is None:
            options["out"] = os.path.join("runs", options["model"])
        if options["steps"] is None and options["epochs"] is None:
            if options["total_budget_tokens"] is None:  # a budget derives the steps
                options["steps"] = 100
        if options["log_to"] is None:
            options["log_to"] = ()
        loader = loader_spec(table, options)
        with usage_errors(TrainError):
            return TrainConfig(loader=loader, storage_options=storage_options, **options)
    if options["out"] is None:
        raise click.UsageError("--resume needs --out DIR (the run to continue)")
    record = read_record(options["out"])
    given_loader = {k: options.pop(k) for k in LOADER_KEYS if k in options}
    changed = {k: v for k, v in given_loader.items() if given(ctx, k)}
    if table is not None:
        changed["table"] = table
    loader = record.loader
    if changed:
        spec_of = {**record.loader.to_dict(), "table": record.loader.table}
        spec_of.pop("spec_version", None)
        for key, value in changed.items():
            if key == "table_version":
                spec_of["version"] = value
            elif key == "mixture":
                spec_of["mixture"] = parse_mixture_option(value)
            else:
                spec_of[key] = value
        from tokenloom.loader.spec import LoaderSpec

        with usage_errors(PlanError):
            loader = LoaderSpec.from_options(**spec_of)
    own = {k: v for k, v in options.items() if k != "out" and given(ctx, k)}
    if "steps" in own and "epochs" not in own:
        own["epochs"] = None
    if "epochs" in own and "steps" not in own:
        own["steps"] = None
    with usage_errors(TrainError):
        return TrainConfig.from_record(
            record, loader=loader, out=options["out"], storage_options=storage_options, **own
        )


@click.command(
    "sample",
    epilog="""\b
Examples:
  tokenloom sample --run runs/tiny --prompt "In the beginning" --max-new-tokens 60""",
)
@click.option(
    "--run", "--checkpoint", "checkpoint", required=True, metavar="DIR",
    help="The run's --out directory (--checkpoint is the same option).",
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
