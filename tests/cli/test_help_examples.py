"""Every command, groups included, shows examples in ``--help``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tokenloom.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def _walk(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        yield (*prefix, name), cmd
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, (*prefix, name))


def test_every_command_and_group_has_examples() -> None:
    missing = []
    for path, _cmd in _walk(cli):
        out = CliRunner().invoke(cli, [*path, "--help"])
        assert out.exit_code == 0, (path, out.output)
        if "Examples:" not in out.output:
            missing.append(" ".join(path))
    assert missing == []


@pytest.mark.parametrize("group", ["backfill", "bench", "tokenizer"])
def test_group_help_through_the_real_command(group: str) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", group, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert out.returncode == 0 and f"tokenloom {group} " in out.stdout.split("Examples:")[1]


def test_one_vocabulary_filter_and_version_on_every_reading_command() -> None:
    """``--filter`` on every command that selects rows, ``--version`` on every one that reads."""
    selecting = [
        ("search",),
        ("contamination",),
        ("backfill", "run"),
        ("tokenizer", "train"),
        ("stats",),
        ("ledger",),
        ("verify",),
        ("train",),
    ]
    reading = [("info",), ("search",), ("contamination",), ("tokenizer", "train"), ("stats",),
               ("ledger",), ("verify",)]  # fmt: skip
    for path in selecting:
        out = CliRunner().invoke(cli, [*path, "--help"])
        assert "--filter" in out.output, path
    for path in reading:
        out = CliRunner().invoke(cli, [*path, "--help"])
        assert "--version" in out.output, path
