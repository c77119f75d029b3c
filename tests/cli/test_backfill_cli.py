"""``tokenloom backfill run`` and ``status`` through the real command line."""

from __future__ import annotations

import json

from tests.conftest import run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table

_run = run_cli


def test_backfill_run_and_status(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:60]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)

    proc = _run(
        "backfill",
        "run",
        "--table",
        uri,
        "--udf",
        "tokenloom.backfill.builtin:n_words",
        "--column",
        "words",
        "--workers",
        "2",
        "--unit-rows",
        "20",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["columns"] == ["words"] and out["rows"] == 60 and out["units"] == 8
    assert Table.open(uri).count_rows("words > 0") == 60

    again = _run(
        "backfill",
        "run",
        "--table",
        uri,
        "--udf",
        "tokenloom.backfill.builtin:n_words",
        "--column",
        "words",
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout

    status = json.loads(_run("backfill", "status", "--table", uri, "--json").stdout)
    assert len(status) == 1
    assert status[0]["state"] == "committed" and status[0]["units_remaining"] == 0
    assert status[0]["version"] == out["version"]
    text = _run("backfill", "status", "--table", uri).stdout
    assert "committed" in text and "8/8" in text

    bad = _run("backfill", "run", "--table", uri, "--udf", "tokenloom.backfill.builtin:nope")
    assert bad.returncode == 1 and "cannot load UDF" in bad.stderr


def test_any_udf_failure_is_status_1_naming_the_udf_and_row(tmp_path, paragraphs):
    """A UDF raising what does not unpickle, even a ``BaseException`` (as a Rust panic is), in
    spawned workers or inline: status 1 with the UDF and the first failing row id, never 70."""
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:40]])
    uri = str(tmp_path / "t.lance")
    version = ingest([tmp_path / "a.jsonl"], uri, progress=False).version
    for workers in ("2", "0"):
        proc = _run(
            "backfill", "run", "--table", uri, "--udf", "tests.backfill.udfs:panics_on_21",
            "--workers", workers, "--unit-rows", "10",
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert "UDF panics_on_21 v1 failed on row id 21: NativePanic: native code gave up" in (
            proc.stderr
        )
        assert "please report" not in proc.stderr and "Traceback" not in proc.stderr
    proc = _run(
        "backfill", "run", "--table", uri, "--udf", "tests.backfill.udfs:BrokenSetup",
        "--workers", "2",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "UDF BrokenSetup v1 could not be set up: FileNotFoundError: model.bin" in proc.stderr
    assert Table.open(uri).latest_version == version
