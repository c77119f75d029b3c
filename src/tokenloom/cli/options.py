"""Options shared by several commands, declared once."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

__all__ = ["table_option", "json_option", "emit_json"]

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
