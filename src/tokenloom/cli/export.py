"""``tokenloom export`` (a trained model as a ``transformers`` folder) and ``tokenloom
eval-task`` (a local lm-eval task from a table's held-out rows)."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    check_filter_option,
    emit_json,
    json_option,
    run_record,
    storage_options_option,
    table_option,
    version_option,
)

__all__ = ["commands"]


@click.command(
    "export",
    epilog="""\b
Examples:
  tokenloom export --checkpoint runs/tiny --format hf --out hf/tiny
  tokenloom export --checkpoint runs/tiny/step-200 --out hf/tiny-200
  python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained('hf/tiny')"
  tokenloom train --table corpus.lance --out runs/next --init-from hf/tiny

\b
Writes config.json, model.safetensors, the tokenizer files when the token
column's tokenizer has a Hugging Face form (GPT-2's is rewritten as its
tokenizer.json; a tokenizer.json is copied), and tokenloom.json (the run).""",
)
@click.option(
    "--checkpoint", "--run", "checkpoint", required=True, metavar="RUN",
    help="The run's --out directory (its latest checkpoint) or RUN/step-N.",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["hf"]), default="hf", show_default=True,
    help="hf: a transformers GPT-2 folder (GPT2LMHeadModel).",
)  # fmt: skip
@click.option("--out", required=True, metavar="DIR", help="The folder to write.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it holds anything.")
@json_option
def export(checkpoint: str, fmt: str, out: str, overwrite: bool, as_json: bool) -> None:
    """Write a trained model as a transformers GPT-2 folder (AutoModelForCausalLM loads it)."""
    from tokenloom.errors import require

    require("torch", extra="train")
    from tokenloom.train.hf import export_hf

    run_record(checkpoint, option="--checkpoint")  # a missing run is a usage error
    result = export_hf(checkpoint, out, overwrite=overwrite) | {"format": fmt}
    if as_json:
        emit_json(result)
        return
    click.echo(f"exported {checkpoint} to {result['out']}: {', '.join(result['files'])}")
    if not result["tokenizer_files"]:
        click.echo(
            f"no tokenizer files: {result['tokenizer_note']}; give transformers the tokenizer "
            "yourself (AutoTokenizer.from_pretrained(...))",
            err=True,
        )


@click.command(
    "eval-task",
    epilog="""\b
Examples:
  tokenloom eval-task --table corpus.lance --filter "id % 100 = 0" --out tasks/ --limit 200
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 lm_eval --model hf \\
      --model_args pretrained=hf/tiny,dtype=float32 --tasks tokenloom_heldout \\
      --include_path tasks/ --device cpu --batch_size 1""",
)
@table_option
@storage_options_option
@version_option()
@click.option(
    "--filter", "--where", "filter", required=True, metavar="SQL", callback=check_filter_option,
    help="The held-out rows (a run's --val-filter).",
)  # fmt: skip
@click.option("--out", required=True, metavar="DIR", help="Where the YAML and JSONL go.")
@click.option(
    "--task-name", default="tokenloom_heldout", show_default=True, help="The lm-eval task name."
)
@click.option(
    "--limit", "-k", type=click.IntRange(min=1), default=None, help="At most N rows (lowest ids)."
)
@json_option
def eval_task(
    table: str,
    storage_options: dict,
    table_version: int | None,
    filter: str,
    out: str,
    task_name: str,
    limit: int | None,
    as_json: bool,
) -> None:
    """Write a local lm-eval task (rolling log-likelihood: perplexity) of held-out rows."""
    from tokenloom.train.evaltask import write_eval_task

    result = write_eval_task(
        table, filter=filter, out=out, name=task_name, limit=limit, version=table_version,
        storage_options=storage_options or None,
    )  # fmt: skip
    if as_json:
        emit_json(result)
        return
    left = f" ({result['empty_left_out']} empty left out)" if result["empty_left_out"] else ""
    click.echo(f"task {result['task']}: {result['rows']} rows{left} -> {result['yaml']}")
    click.echo(f"run: {result['command']}")


commands = [export, eval_task]
