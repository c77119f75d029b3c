"""``tokenloom images``: the bundled image+text set and the padding of its packing policies."""

from __future__ import annotations

import click

from tokenloom.cli.options import (
    emit_json,
    filter_option,
    json_option,
    storage_options_option,
    table_option,
    version_option,
)

__all__ = ["command"]


@click.group(
    "images",
    epilog="""\b
Examples:
  tokenloom images build --out images/
  tokenloom images pack-stats --table img.lance --budget 256 --plot padding.png""",
)
def command() -> None:
    """The bundled image+text set and image+text packing statistics."""


@command.command(
    "build",
    epilog="""\b
Examples:
  tokenloom images build --out images/
  tokenloom ingest images/images.parquet --table img.lance \\
      --columns prompt,response,width,height
  tokenloom tokenize --table img.lance --tokenizer gpt2 --text-column prompt --column prompt_ids
  tokenloom tokenize --table img.lance --tokenizer gpt2 --text-column response \\
      --column response_ids""",
)
@click.option("--out", required=True, metavar="DIR", help="Folder for images.parquet.")
@click.option("--max-side", default=128, show_default=True, type=click.IntRange(min=8))
@click.option(
    "--bad-images",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Extra rows with a truncated JPEG (to see skips counted).",
)
@json_option
def build(out: str, max_side: int, bad_images: int, as_json: bool) -> None:
    """Write the bundled image+text set (photographs from the scikit-image wheel) as Parquet."""
    from tokenloom.vision.images import IMAGES, build_image_set

    path = build_image_set(out, max_side=max_side, bad_images=bad_images)
    samples = 3 * len(IMAGES) + bad_images
    if as_json:
        emit_json({"path": str(path), "samples": samples, "images": len(IMAGES)})
        return
    click.echo(f"wrote {samples} samples ({len(IMAGES)} images) to {path}")


@command.command(
    "pack-stats",
    epilog="""\b
Examples:
  tokenloom images pack-stats --table img.lance --budget 256 --plot padding.png""",
)
@table_option
@storage_options_option
@click.option("--budget", default=256, show_default=True, type=click.IntRange(min=2))
@click.option("--image-cap", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--patch", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--max-side", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--image-column", default="image", show_default=True)
@click.option(
    "--prompt-column",
    default="prompt_ids",
    show_default=True,
    help="Token column of the prompt (`tokenloom tokenize --text-column prompt --column "
    "prompt_ids`).",
)
@click.option("--response-column", default="response_ids", show_default=True)
@filter_option("The samples to pack.")
@version_option()
@click.option("--plot", default=None, metavar="PNG", help="Write a bar chart of the waste.")
@json_option
def pack_stats(
    table: str,
    storage_options: dict,
    budget: int,
    image_cap: int,
    patch: int,
    max_side: int,
    image_column: str,
    prompt_column: str,
    response_column: str,
    filter: str | None,
    table_version: int | None,
    plot: str | None,
    as_json: bool,
) -> None:
    """Padding of pad-to-longest vs greedy vs knapsack on the table's samples, from stored
    sizes and token counts only (no image is decoded)."""
    from tokenloom.cli.options import usage_errors
    from tokenloom.loader.plan.epoch import PlanError
    from tokenloom.vision.dataset import ImageTextStream
    from tokenloom.vision.spec import ImageTextSpec

    with usage_errors(PlanError):
        spec = ImageTextSpec(
            table=table, budget=budget, image_cap=image_cap, patch=patch, max_side=max_side,
            image_column=image_column, prompt_column=prompt_column,
            response_column=response_column, filter=filter, version=table_version,
            global_batch=1,
        )  # fmt: skip
    ledgers = ImageTextStream(spec, storage_options=storage_options).padding_by_policy(0)
    if plot:
        from tokenloom.vision.plot import plot_padding

        plot_padding(ledgers, plot)
    if as_json:
        emit_json(ledgers)
        return
    click.echo(
        f"{'policy':<16}{'blocks':>8}{'image tok':>11}{'text tok':>10}{'padding':>9}{'share':>8}"
    )
    for name, led in ledgers.items():
        click.echo(
            f"{name:<16}{led['blocks']:>8}{led['image_tokens']:>11}{led['text_tokens']:>10}"
            f"{led['padding']:>9}{led['padding_share']:>8.1%}"
        )
    if plot:
        click.echo(f"plot: {plot}")
