"""The exit status is the truth: every way a command can end, checked through a real process.

``CliRunner`` runs click in standalone mode, which is not how ``tokenloom`` runs (``main()`` uses
``standalone_mode=False`` for its error boundary), so these tests start the real entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.ingest import ingest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(extra: dict | None = None) -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


_run = run_cli


# A command for each way a command can end, added to the real group in a real process.
BOUNDARY = textwrap.dedent(
    """
    import sys
    import click
    from tokenloom.cli.main import cli, main
    from tokenloom.errors import TokenloomError

    @cli.command("probe")
    @click.argument("how")
    def probe(how):
        if how == "ok":
            return {"a result": "object"}  # a return value is not an exit status
        if how == "one":
            return 1  # neither is an int
        if how == "exit3":
            raise click.exceptions.Exit(3)
        if how == "ctx-exit":
            click.get_current_context().exit(4)
        if how == "library":
            raise TokenloomError("the library says no")
        if how == "usage":
            raise click.UsageError("bad usage")
        if how == "bad-param":
            raise click.BadParameter("not like that", param_hint="--x")
        if how == "bug":
            raise RuntimeError("a bug")
        if how == "store-gone":
            raise OSError(
                "When reading 'b/t.lance/x': AWS Error NETWORK_CONNECTION during GetObject: "
                "curlCode: 7, Could not connect to server; Details: Failed to connect to "
                "127.0.0.1:9 after 0 ms"
            )
        if how == "interrupt":
            raise KeyboardInterrupt
        if how == "abort":
            raise click.Abort()

    main(sys.argv[1:])
    """
)


@pytest.mark.parametrize(
    ("how", "status", "stderr"),
    [
        ("ok", 0, ""),
        ("one", 0, ""),
        ("exit3", 3, ""),
        ("ctx-exit", 4, ""),
        ("library", 1, "error: the library says no\n"),
        ("usage", 2, "Error: bad usage"),
        ("bad-param", 2, "Invalid value for --x: not like that"),
        ("bug", 70, "unexpected error: RuntimeError: a bug"),
        ("store-gone", 1, "error: the object store at 127.0.0.1:9 could not be reached"),
        ("interrupt", 130, "interrupted"),
        ("abort", 130, "aborted"),
    ],
)
def test_every_way_to_end_has_its_status(how, status, stderr):
    proc = subprocess.run(
        [sys.executable, "-c", BOUNDARY, "probe", how],
        capture_output=True,
        text=True,
        env={k: v for k, v in _env().items() if not k.startswith("AWS_")},
        timeout=60,
    )
    assert proc.returncode == status, proc.stderr
    assert stderr in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_and_help_through_the_real_command(tmp_path):
    assert _run("info", "--no-such-option").returncode == 2
    assert _run("no-such-command").returncode == 2
    assert _run("stats", "--table", str(tmp_path / "t"), "--seq-len", "0").returncode == 2
    assert _run("--help").returncode == 0
    assert _run("--version").returncode == 0
    missing = _run("info", "--table", str(tmp_path / "missing.lance"))
    assert missing.returncode == 1 and missing.stderr.startswith("error: no tokenloom table")


def test_ingest_of_only_rejected_records_into_an_existing_table_exits_one(tmp_path):
    write_jsonl(tmp_path / "good.jsonl", [{"text": "a fine document"}])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "good.jsonl"], uri, progress=False)
    write_jsonl(tmp_path / "bad.jsonl", [b"{nope", b'{"text": ""}'])
    proc = _run("ingest", str(tmp_path / "bad.jsonl"), "--table", uri)
    assert proc.returncode == 1, proc.stdout
    assert "nothing could be ingested" in proc.stderr
    proc = _run("ingest", str(tmp_path / "bad.jsonl"), "--table", uri, "--json")
    assert proc.returncode == 1  # --json does not turn a failure into success
    proc = _run("ingest", str(tmp_path / "absent.jsonl"), "--table", uri)
    assert proc.returncode == 1


def test_verify_on_a_corrupted_table_exits_one(tmp_path):
    pytest.importorskip("torch")
    from tests.verify.tables import corrupt_table

    texts = real_paragraphs(24)
    bad = corrupt_table(tmp_path, texts, row=3)
    args = ("verify", "--table", bad, "--seq-len", "64", "--global-batch-size", "2", "--steps", "1")
    proc = _run(*args)
    assert "FAIL  token_ids" in proc.stdout
    assert "verify failed:" in proc.stderr
    assert proc.returncode == 1
    proc = _run(*args, "--json")
    assert '"passed": false' in proc.stdout
    assert proc.returncode == 1


def test_an_unreachable_object_store_is_status_1_naming_the_endpoint():
    """Nothing listens at the endpoint: the table is not "absent" (nobody can tell), and the
    store's failure is the environment's (1), not a bug (70)."""
    from tokenloom.dev.s3 import free_ports

    endpoint = f"http://127.0.0.1:{free_ports(1)[0]}"
    env = {"AWS_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    proc = _run("info", "--table", "s3://bucket/t.lance", env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"error: the object store at {endpoint} could not be reached" in proc.stderr
    assert "run the same command again" in proc.stderr
    assert "no tokenloom table" not in proc.stderr and "please report" not in proc.stderr


@pytest.mark.parametrize("command", [["train", "--steps", "1"], ["verify"]])
def test_a_missing_table_exits_one_before_importing_torch(tmp_path, command):
    # the real command in a real process; an exit hook reports whether torch was imported
    probe = textwrap.dedent(
        """
        import atexit, sys
        atexit.register(lambda: print("torch imported:", "torch" in sys.modules))
        from tokenloom.cli.main import main
        main(sys.argv[1:])
        """
    )
    missing = str(tmp_path / "nothing.lance")
    proc = subprocess.run(
        [sys.executable, "-c", probe, *command, "--table", missing]
        + (["--out", str(tmp_path / "run")] if command[0] == "train" else []),
        capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"no tokenloom table at {missing}" in proc.stderr
    assert "torch imported: False" in proc.stdout
    assert not (tmp_path / "run").exists()
