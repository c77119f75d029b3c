"""Shared fixtures: small real texts and tables built through the real APIs."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterable

import pytest

# make test runs two test processes on two cores, each starting `tokenloom train` subprocesses:
# with torch's default (a thread per core) every step oversubscribes the cores, and the tiny
# models' steps, too small to gain from a second thread, ran 2-3x slower. One thread each, for
# this process and every subprocess it starts (a value already set is kept).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def real_paragraphs(n: int = 200) -> list[str]:
    """Distinct real English paragraphs: docstrings of standard-library functions."""
    import collections
    import json as json_mod
    import os.path
    import shutil
    import statistics
    import textwrap

    seen: set[str] = set()
    out: list[str] = []
    for module in (os.path, shutil, json_mod, statistics, textwrap, collections, inspect):
        for name in sorted(vars(module)):
            doc = inspect.getdoc(getattr(module, name))
            if doc and len(doc) > 40 and doc not in seen:
                seen.add(doc)
                out.append(doc)
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} docstrings available, {n} requested")
    return out[:n]


def write_jsonl(path: os.PathLike[str] | str, records: Iterable[object]) -> None:
    """Write records (dicts, or raw ``bytes`` lines) as JSONL."""
    with open(path, "wb") as fh:
        for rec in records:
            if isinstance(rec, bytes):
                fh.write(rec.rstrip(b"\n") + b"\n")
            else:
                fh.write(json.dumps(rec, ensure_ascii=False).encode("utf-8") + b"\n")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The checkout's root: on a subprocess's path so it can import ``tests.*`` helpers."""


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 300, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """``tokenloom ARGS`` in a real subprocess (so its exit status is what a shell sees), with
    the repository importable; text output captured."""
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        timeout=timeout,
        cwd=cwd,
    )


def invoke(*args: str) -> str:
    """``tokenloom ARGS`` in this process (click's runner), which must succeed; its stdout.

    For the steps a test builds on, whose success and output are what it reads: no new
    interpreter pays the imports (torch's alone are seconds of CPU a process). Exit statuses
    other than 0, signals and kills go through :func:`run_cli`, as a shell sees them.
    """
    from click.testing import CliRunner

    from tokenloom.cli.main import cli

    out = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.stdout


@pytest.fixture(scope="session")
def paragraphs() -> list[str]:
    return real_paragraphs(200)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a test marked ``slow`` run first, each file's tests in their order.

    ``make test`` hands out whole files (``--dist loadfile --no-loadscope-reorder``) to two
    workers in this order; with the long files first, the workers end on short ones together,
    where xdist's own order (most tests first) left the few-test, minutes-long training files
    to the end, on one worker while the other had nothing left.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: a file's tests keep their order
