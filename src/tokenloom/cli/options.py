"""Options shared by several commands, declared once."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

__all__ = [
    "table_option",
    "json_option",
    "emit_json",
    "loader_options",
    "build_dataset",
    "parse_mixture_option",
]

table_option = click.option(
    "--table",
    "table",
    required=True,
    metavar="PATH",
    help="The tokenloom table: a local directory or an object-store URI Lance accepts.",
)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of text."
)


def emit_json(obj: Any) -> None:
    """Write ``obj`` as one JSON document on stdout."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def loader_options(func=None, *, position: bool = True):  # noqa: ANN001, ANN201
    """The PackedDataset options, declared once for every command that builds a loader.

    ``position=False`` leaves out ``--epoch`` and ``--version`` (for commands that pick their
    own place in the stream, like ``verify``). Use as ``@loader_options`` or
    ``@loader_options(position=False)``.
    """
    if func is None:
        return lambda f: loader_options(f, position=position)
    opts = [
        click.option(
            "--column", "token_column", default="input_ids", show_default=True, help="Token column."
        ),
        click.option("--filter", default=None, metavar="SQL", help="Rows to train on."),
        click.option("--seq-len", type=click.IntRange(min=1), default=1024, show_default=True),
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=8,
            show_default=True,
            help="Blocks per step (the global batch).",
        ),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option(
            "--packing",
            type=click.Choice(["concat", "best_fit"]),
            default="concat",
            show_default=True,
        ),
        click.option(
            "--fit-window",
            type=click.IntRange(min=1),
            default=1024,
            show_default=True,
            help="Best-fit look-ahead, in documents.",
        ),
        click.option(
            "--long-docs",
            type=click.Choice(["split", "window"]),
            default="split",
            show_default=True,
        ),
        click.option(
            "--window",
            type=click.IntRange(min=1),
            default=None,
            help="Window length for --long-docs window.",
        ),
        click.option(
            "--overlap",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Context-only tokens carried into the next window.",
        ),
        click.option(
            "--mixture",
            default=None,
            metavar="JSON|FILE",
            help='Pools: {"name": ["SQL filter", share, max_passes?], ...}.',
        ),
        click.option(
            "--budget-tokens",
            type=click.IntRange(min=1),
            default=None,
            help="Positions per mixture epoch.",
        ),
        click.option(
            "--cut-column",
            default=None,
            help="With --long-docs window: end windows at these offsets (cut_points).",
        ),
        click.option(
            "--block-order",
            type=click.Choice(["sequential", "interleave"]),
            default="sequential",
            show_default=True,
            help="Blocks of a global step: consecutive, or one from each of G stretches.",
        ),
    ]
    if position:
        opts += [
            click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True),
            click.option(
                "--version",
                "table_version",
                type=int,
                default=None,
                help="Pin a table version [default: latest].",
            ),
        ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def parse_mixture_option(value: str | None) -> Any:
    """``--mixture``: inline JSON or the path of a JSON file."""
    import os

    if not value:
        return None
    text = open(value).read() if os.path.exists(value) else value
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--mixture") from exc


def build_dataset(table: str, **kw: Any):  # noqa: ANN201 - PackedDataset
    """A PackedDataset (rank 0 of 1) from :func:`loader_options` values."""

    from tokenloom.loader import PackedDataset

    mixture = parse_mixture_option(kw.pop("mixture", None))
    return PackedDataset(
        table,
        kw.pop("token_column"),
        filter=kw.pop("filter"),
        seq_len=kw.pop("seq_len"),
        batch_size=kw.pop("batch_size"),
        seed=kw.pop("seed"),
        epoch=kw.pop("epoch"),
        version=kw.pop("table_version"),
        rank=0,
        world_size=1,
        packing=kw.pop("packing"),
        fit_window=kw.pop("fit_window"),
        long_docs=kw.pop("long_docs"),
        window=kw.pop("window"),
        overlap=kw.pop("overlap"),
        mixture=mixture,
        budget_tokens=kw.pop("budget_tokens"),
        cut_column=kw.pop("cut_column"),
        block_order=kw.pop("block_order", "sequential"),
    )
