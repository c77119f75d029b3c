"""Entry point of the ``tokenloom`` command: the group, its commands and the one error boundary.

The exit status is the truth, whatever was printed:

====  ======================================================================================
0     the command did what was asked
1     a library error (:class:`tokenloom.errors.TokenloomError`, one line on stderr), an
      object store that could not be reached (the endpoint named; run the command again), or a
      command that reports a failure (``verify`` with a failed check)
2     a usage error: an unknown option, a bad option value (out of range, empty, not finite,
      a directory that does not exist, or values a config refuses together), a missing argument
70    an unexpected error, i.e. a bug (``EX_SOFTWARE``); please report it
130   interrupted (Ctrl-C) or aborted
====  ======================================================================================

``TOKENLOOM_DEBUG=1`` shows the full traceback instead of the one-line message.
"""

from __future__ import annotations

import os
import sys

import click

from tokenloom import __version__
from tokenloom.cli.options import quiet_option, require_values
from tokenloom.errors import TokenloomError

__all__ = ["EXIT_BUG", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "cli", "main"]

EXIT_ERROR = 1
"""A library error, or a command that reports a failure."""
EXIT_USAGE = 2
"""A usage error (click's own code for them)."""
EXIT_BUG = 70
"""An unexpected exception: a bug (``EX_SOFTWARE`` of sysexits.h)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or an aborted prompt (128 + SIGINT)."""


class _Group(click.Group):
    """A group whose commands' return values never become exit statuses.

    ``standalone_mode=False`` makes :meth:`click.Command.main` *return* the code of a
    ``click.exceptions.Exit`` raised by a command (``verify`` on a failed check) instead of exiting
    with it; :func:`main` exits with that code. Returning ``None`` here keeps a command's
    accidental return value (say a result object) from being mistaken for such a code.
    """

    def invoke(self, ctx: click.Context) -> None:
        super().invoke(ctx)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  tokenloom corpus build --out corpus/
  tokenloom ingest corpus/*.jsonl --table corpus.lance
  tokenloom info --table corpus.lance
  tokenloom demo
  tokenloom --quiet train --table corpus.lance --out runs/tiny --json

Long jobs show a progress bar on a terminal and a progress line every
TOKENLOOM_PROGRESS_SECONDS (30) on stderr otherwise; --quiet or
TOKENLOOM_QUIET=1 turns both off. Set TOKENLOOM_DEBUG=1 to see tracebacks.""",
)
@click.version_option(__version__, prog_name="tokenloom")
@quiet_option
def cli() -> None:
    """tokenloom: an LLM pretraining corpus on one versioned Lance table."""


def _register() -> None:
    from tokenloom.cli import (
        adopt,
        backfill,
        bench,
        corpus,
        curate,
        demo,
        dev,
        gc,
        images,
        info,
        ingest,
        ledger,
        quarantine,
        refresh,
        runs,
        search,
        stats,
        tokenize,
        trace,
        verify,
    )

    modules = (
        corpus,
        ingest,
        adopt,
        info,
        refresh,
        backfill,
        stats,
        ledger,
        runs,
        verify,
        trace,
        quarantine,
        bench,
        demo,
        gc,
        dev,
        images,
    )
    for module in modules:
        cli.add_command(module.command)
    from tokenloom.cli import docloss, export
    from tokenloom.cli import train as train_cli

    commands = (*curate.commands, *tokenize.commands, *train_cli.commands, *export.commands)
    commands = (*commands, *docloss.commands)
    for command in (*commands, *search.commands):
        cli.add_command(command)
    require_values(cli)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI with tokenloom's error boundary; always ends the process with its status."""
    debug = os.environ.get("TOKENLOOM_DEBUG", "") not in ("", "0")
    try:
        # Not standalone: click would turn our exceptions into its own messages. The price is
        # that an ``Exit`` raised by a command comes back as a return value: keep it.
        status = cli.main(args=argv, prog_name="tokenloom", standalone_mode=False)
    except click.exceptions.Abort as exc:  # click turns Ctrl-C into Abort
        ctrl_c = isinstance(exc.__context__, KeyboardInterrupt)
        click.echo("interrupted" if ctrl_c else "aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:  # UsageError and its kin: 2; other click errors: 1
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:  # pragma: no cover - click returns it (see above)
        sys.exit(exc.exit_code)
    except TokenloomError as exc:
        if debug:
            raise
        option = getattr(exc, "option", None)
        if option:  # found only once the table is open, but about a value given by the user
            click.echo(f"Error: Invalid value for '{option}': {exc}", err=True)
            sys.exit(EXIT_USAGE)
        outage = _outage(exc, argv, detail=False)
        click.echo(f"error: {exc}" + (f"\n{outage}" if outage else ""), err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # the boundary: a bug should still end in one readable line
        if debug:
            raise
        outage = _outage(exc, argv)
        if outage is not None:  # the environment, not a bug
            click.echo(f"error: {outage}", err=True)
            sys.exit(EXIT_ERROR)
        click.echo(
            f"unexpected error: {type(exc).__name__}: {exc}\n"
            "rerun with TOKENLOOM_DEBUG=1 for the traceback, and please report it",
            err=True,
        )
        sys.exit(EXIT_BUG)
    sys.exit(status if isinstance(status, int) else 0)


def _outage(exc: BaseException, argv: list[str] | None, *, detail: bool = True) -> str | None:
    """The message for an object store that could not be reached, if that is what ``exc`` is."""
    # Imported on the error path only: keeps the start-up of every command light.
    from tokenloom.table.outage import options_from_argv, outage_message

    options = options_from_argv(sys.argv[1:] if argv is None else argv)
    return outage_message(exc, options, detail=detail)


if __name__ == "__main__":  # pragma: no cover
    main()
