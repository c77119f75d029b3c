"""The command line: help with examples everywhere, JSON outputs, exit codes, error boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from tests.conftest import run_cli, write_jsonl
from tokenloom.cli.main import cli


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, (*prefix, name))


@pytest.mark.parametrize(
    "path", [p for p, c in _all_commands(cli) if not isinstance(c, click.Group)], ids=" ".join
)
def test_every_command_has_help_with_examples(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    assert "tokenloom" in result.output.split("Examples:", 1)[1]


_run = run_cli


def test_ingest_and_info_json(tmp_path, paragraphs):
    write_jsonl(
        tmp_path / "a.jsonl",
        [{"text": p, "source": "docs"} for p in paragraphs[:20]] + [b"{broken", b'{"text": ""}'],
    )
    uri = str(tmp_path / "t.lance")
    proc = _run("ingest", str(tmp_path / "a.jsonl"), "--table", uri, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rows_written"] == 20 and out["version"] == 2
    assert out["rejected"] == {"empty_text": 1, "invalid_json": 1}
    assert os.path.exists(out["rejects_path"])

    proc = _run("info", "--table", uri, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["rows"] == 20 and info["version"] == 2
    assert [v["operation"] for v in info["versions"]] == ["create", "ingest"]
    assert {c["name"] for c in info["columns"]} == {"id", "text", "source", "n_chars", "meta"}
    assert info["rows_per_source"] == {"docs": 20}

    text = _run("info", "--table", uri).stdout
    assert "rows 20" in text and "ingest" in text and "docs" in text

    again = _run("ingest", str(tmp_path / "a.jsonl"), "--table", uri)
    assert again.returncode == 0 and "already ingested" in again.stdout


def test_errors_are_one_line_and_debug_shows_traceback(tmp_path):
    proc = _run("info", "--table", str(tmp_path / "missing.lance"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no tokenloom table at") and "Traceback" not in proc.stderr
    proc = _run("info", "--table", str(tmp_path / "missing.lance"), env={"TOKENLOOM_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_ingest_of_nothing_readable_exits_non_zero(tmp_path):
    write_jsonl(tmp_path / "bad.jsonl", [b"{nope"])
    proc = _run("ingest", str(tmp_path / "bad.jsonl"), "--table", str(tmp_path / "t.lance"))
    assert proc.returncode == 1
    assert "nothing could be ingested" in proc.stderr and "invalid_json=1" in proc.stderr


def test_import_tokenloom_stays_light():
    code = (
        "import sys, tokenloom, tokenloom.table, tokenloom.ingest, tokenloom.cli.main; "
        "print(sorted(m for m in ('torch', 'ray', 'lancedb', 'numba') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
