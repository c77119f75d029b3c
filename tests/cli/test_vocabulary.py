"""One CLI vocabulary: the command tree is walked and every command's options are checked.

* every command that reads a table's rows takes ``--version`` (pin a version) and ``--filter``
  (or is listed below with the reason it does not);
* every command that prints figures takes ``--json``;
* a concept has one flag name across the tree (no ``--out`` here and ``--output`` there), and the
  shared options are the declarations of ``tokenloom.cli.options``, not local copies.

A new command must be classified here before this test passes.
"""

from __future__ import annotations

import click
import pytest

from tokenloom.cli.main import cli

READS_TABLE = {
    "info",
    "stats",
    "ledger",
    "verify",
    "train",
    "search",
    "contamination",
    "tokenizer train",
    "images pack-stats",
    "eval-task",
}
"""Commands that read a table's rows: each takes ``--version`` and ``--filter``."""

READS_WITHOUT = {
    ("info", "--filter"): "describes the table as stored (versions, column bytes, fragments), "
    "not a selection of rows; `stats --filter` describes a selection",
    ("trace", "--version"): "the checkpoint pins the table version its steps were read from",
    ("trace", "--filter"): "the checkpoint pins the filter; trace recomputes that plan",
    ("backfill status", "--version"): "reads the backfill jobs beside the table, not its rows",
    ("backfill status", "--filter"): "reads the backfill jobs beside the table, not its rows",
}
"""(command, option) a table-reading command lacks, with the reason."""

WRITES_TABLE = {
    "ingest",
    "adopt",
    "dedup",
    "score",
    "tokenize",
    "embed",
    "index",
    "refresh",
    "backfill run",
    "gc",
    "doc-loss",
}
"""Commands that change a table: they work on its latest version (no ``--version``)."""

NO_JSON = {
    "sample": "prints the generated text, no figures",
    "dev s3": "prints the server's address or shell `export` lines, no figures",
    "demo": "a narrated walk through every stage; each stage's own command has --json",
}
"""Commands without ``--json``, with the reason."""

SYNONYMS = {
    "--out": ("--output", "--out-dir", "--output-dir", "--outdir", "--dest"),
    "--columns": ("--cols",),
    "--column": ("--col", "--output-column", "--out-column"),
    "--text-column": ("--text-col",),
    "--version": ("--table-version", "--at-version", "--as-of"),
    "--json": ("--as-json", "--json-output"),
    "--workers": ("--num-workers", "--jobs", "-j", "--procs", "--processes"),
    "--steps": ("--num-steps", "--max-steps", "--iters"),
    "--seed": ("--random-seed",),
    "--storage-options": ("--storage-option", "--so"),
    "--workdir": ("--work-dir", "--tmpdir"),
    "--quiet": ("--silent", "--no-progress"),
}
"""The one flag of a concept, and the names that would be a second flag for it."""


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


COMMANDS = dict(_leaves(cli))


def _options(cmd: click.Command) -> dict[str, click.Option]:
    """Every flag name of the command → its option."""
    out = {}
    for param in cmd.params:
        if isinstance(param, click.Option):
            for flag in (*param.opts, *param.secondary_opts):
                out[flag] = param
    return out


def test_every_command_with_a_table_is_classified():
    touching = {n for n, c in COMMANDS.items() if "--table" in _options(c)}
    classified = READS_TABLE | WRITES_TABLE | {name for name, _ in READS_WITHOUT}
    assert touching - classified == set(), "classify the new command(s) in this test"
    assert classified - set(COMMANDS) == set(), "a classified command no longer exists"
    assert READS_TABLE & WRITES_TABLE == set()


@pytest.mark.parametrize("name", sorted(READS_TABLE | {n for n, _ in READS_WITHOUT}))
def test_every_table_reading_command_pins_a_version_and_filters(name):
    flags = _options(COMMANDS[name])
    for flag in ("--version", "--filter"):
        excused = READS_WITHOUT.get((name, flag))
        if excused is None:
            assert flag in flags, f"`tokenloom {name}` reads a table but has no {flag}"
        else:
            assert flag not in flags, f"`tokenloom {name}` has {flag}: drop its excuse"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_that_prints_figures_has_json(name):
    has = "--json" in _options(COMMANDS[name])
    if name in NO_JSON:
        assert not has, f"`tokenloom {name}` has --json now: drop it from NO_JSON"
    else:
        assert has, f"`tokenloom {name}` prints figures but has no --json"


def test_every_command_with_a_table_takes_storage_options():
    for name, cmd in COMMANDS.items():
        flags = _options(cmd)
        if "--table" not in flags:
            continue
        assert "--storage-options" in flags, f"`tokenloom {name}` lacks --storage-options"


def test_one_flag_name_per_concept():
    used = {flag: name for name, cmd in COMMANDS.items() for flag in _options(cmd)}
    used.update({flag: "(group)" for flag in _options(cli)})
    for canonical, others in SYNONYMS.items():
        clash = {o: used[o] for o in others if o in used}
        assert not clash, f"{canonical} is the flag for this concept; found {clash}"


def test_options_with_one_meaning_have_one_set_of_names():
    """The same keyword argument is always spelled with the same flags."""
    flags_of: dict[str, dict[tuple[str, ...], str]] = {}
    for name, cmd in COMMANDS.items():
        for param in cmd.params:
            # (several --fts/--vector/--hybrid flags setting one value are one choice)
            if isinstance(param, click.Option) and not (param.is_flag and not param.is_bool_flag):
                names = tuple(sorted((*param.opts, *param.secondary_opts)))
                flags_of.setdefault(param.name, {}).setdefault(names, name)
    mixed = {dest: spellings for dest, spellings in flags_of.items() if len(spellings) > 1}
    assert not mixed, f"one option spelled several ways (dest → flags → a command): {mixed}"


def _shared(name: str, flag: str) -> click.Option:
    return _options(COMMANDS[name])[flag]


def test_shared_options_come_from_one_declaration():
    """--json, --filter/--where, --version, --storage-options, --table: the declarations of
    tokenloom.cli.options (same names, keyword, type and callback) on every command."""
    reference = {
        "--json": _shared("info", "--json"),
        "--filter": _shared("search", "--filter"),
        "--version": _shared("search", "--version"),
        "--storage-options": _shared("info", "--storage-options"),
        "--table": _shared("info", "--table"),
    }

    def shape(opt: click.Option) -> tuple:
        kind = type(opt.type).__name__, getattr(opt.type, "min", None)
        callback = getattr(opt.callback, "__qualname__", None)
        return (tuple(opt.opts), opt.name, opt.is_flag, kind, opt.metavar, callback)

    for name, cmd in COMMANDS.items():
        flags = _options(cmd)
        for flag, ref in reference.items():
            if flag not in flags or (flag == "--table" and name == "train"):
                continue  # train's --table is optional: a resume reads it from the record
            assert shape(flags[flag]) == shape(ref), f"`tokenloom {name}` declares its own {flag}"
    assert reference["--filter"].opts == ["--filter", "--where"]
    assert reference["--json"].help == _shared("train", "--json").help


def test_quiet_is_one_option_of_the_group():
    assert "--quiet" in _options(cli)
    assert not [n for n, c in COMMANDS.items() if "--quiet" in _options(c)]
