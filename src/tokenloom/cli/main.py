"""Entry point of the ``tokenloom`` command: the group, its commands and the one error boundary.

Library errors (:class:`tokenloom.errors.TokenloomError`) become a one-line message on stderr and
exit status 1. ``TOKENLOOM_DEBUG=1`` shows the full traceback instead.
"""

from __future__ import annotations

import os
import sys

import click

from tokenloom import __version__
from tokenloom.errors import TokenloomError

__all__ = ["cli", "main"]


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  tokenloom corpus build --out corpus/
  tokenloom ingest corpus/*.jsonl --table corpus.lance
  tokenloom info --table corpus.lance
  tokenloom demo

Set TOKENLOOM_DEBUG=1 to see tracebacks.""",
)
@click.version_option(__version__, prog_name="tokenloom")
def cli() -> None:
    """tokenloom: an LLM pretraining corpus on one versioned Lance table."""


def _register() -> None:
    from tokenloom.cli import (
        backfill,
        bench,
        corpus,
        curate,
        demo,
        info,
        ingest,
        ledger,
        search,
        stats,
        tokenize,
        trace,
        verify,
    )

    for module in (corpus, ingest, info, backfill, stats, ledger, verify, trace, bench, demo):
        cli.add_command(module.command)
    from tokenloom.cli import train as train_cli

    for command in (*curate.commands, *tokenize.commands, *train_cli.commands, *search.commands):
        cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI with tokenloom's error boundary."""
    debug = os.environ.get("TOKENLOOM_DEBUG", "") not in ("", "0")
    try:
        cli.main(args=argv, prog_name="tokenloom", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except TokenloomError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # the boundary: a bug should still end in one readable line
        if debug:
            raise
        click.echo(
            f"unexpected error: {type(exc).__name__}: {exc}\n"
            "rerun with TOKENLOOM_DEBUG=1 for the traceback, and please report it",
            err=True,
        )
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
