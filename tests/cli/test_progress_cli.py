"""Progress through the CLI: plain periodic lines on stderr when it is not a terminal, nothing
with ``--quiet`` or ``TOKENLOOM_QUIET=1``, and stdout's JSON untouched either way."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli, write_jsonl

FAST = {"TOKENLOOM_PROGRESS_SECONDS": "0.01", "TOKENLOOM_QUIET": ""}
"""A period short enough that even a job of a fraction of a second prints lines."""


@pytest.fixture(scope="module")
def table(tmp_path_factory, paragraphs):
    tmp = tmp_path_factory.mktemp("progress")
    write_jsonl(tmp / "docs.jsonl", [{"text": p, "source": "docs"} for p in paragraphs[:60]])
    uri = str(tmp / "t.lance")
    proc = run_cli("ingest", str(tmp / "docs.jsonl"), "--table", uri, "--json", env=FAST)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # any progress went to stderr
    return uri


def test_score_prints_progress_lines_on_stderr_and_clean_json_on_stdout(table):
    proc = run_cli("score", "--table", table, "--workers", "0", "--json", env=FAST)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["rows"] == 60 and result["by_rule"] and set(result["by_source"]) == {"docs"}
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("backfill quality")]
    assert lines, proc.stderr
    assert all("\r" not in ln and "rows" in ln and "elapsed" in ln for ln in lines)
    assert "60/60 rows (100%)" in lines[-1]  # the last line: the job done


@pytest.mark.parametrize("quiet", [["--quiet"], ["-q"], []], ids=["--quiet", "-q", "env"])
def test_quiet_silences_progress(table, quiet):
    env = {**FAST, "TOKENLOOM_QUIET": "" if quiet else "1"}
    proc = run_cli(*quiet, "score", "--table", table, "--workers", "0", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"] == 60
    assert proc.stderr == ""


def test_score_text_output_lists_rules_and_sources(table):
    proc = run_cli("--quiet", "score", "--table", table, "--workers", "0")
    assert proc.returncode == 0, proc.stderr
    assert "rows failing each rule:" in proc.stdout and "per source" in proc.stdout
    assert "  docs " in proc.stdout
