"""``tokenloom demo --s3``: the demo's stages on a local S3 server the command starts and stops,
with nothing written to the current directory and the environment restored. (Training, search
and trace on an S3 table are covered through the CLI by test_pipeline_s3.py.)"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from tokenloom.cli.main import cli
from tokenloom.dev.s3 import S3ServerError, weed_binary


def test_demo_runs_on_a_local_s3_server_it_starts_and_stops(tmp_path, monkeypatch):
    try:
        weed_binary()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("AWS_PROFILE", "someone-elses")
    monkeypatch.delenv("AWS_ENDPOINT", raising=False)
    before = dict(os.environ)
    result = CliRunner().invoke(
        cli, ["demo", "--s3", "--max-docs", "3", "--workers", "0", "--train-steps", "0"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "uploaded 7 files to s3://bucket/corpus/" in out
    assert "ingesting into s3://bucket/corpus.lance" in out and "21 rows" in out
    assert "backfill input_ids, n_tokens" in out  # every stage committed on the S3 table
    assert "local S3 server is stopped and the temporary work dir removed" in out
    assert dict(os.environ) == before  # AWS_* restored, AWS_PROFILE back
    assert os.listdir(cwd) == []
