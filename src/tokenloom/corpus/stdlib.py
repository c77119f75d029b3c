"""The running Python's standard library sources: one document per ``*.py`` file.

Files are taken in sorted path order from ``sysconfig.get_paths()["stdlib"]``, leaving out
``site-packages`` and test directories, files over :data:`MAX_FILE_BYTES` and, past
:data:`MAX_FILES`, the rest. The result depends on the interpreter: the manifest records its
version.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenloom.corpus.document import CorpusDocument, Record, Skipped

__all__ = ["EXCLUDED_DIRS", "MAX_FILE_BYTES", "MAX_FILES", "stdlib_dir", "read_stdlib"]

EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)
"""Directory names skipped at any depth (``test``, ``lib2to3/tests``, ``idlelib/idle_test``)."""
MAX_FILE_BYTES = 200_000
"""Bigger files are mostly data tables (``pydoc_data/topics.py``), so they are skipped."""
MAX_FILES = 800
"""Enough code for a varied source (3.11 has ~730 files below the size limit)."""


def stdlib_dir() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def _python_files(root: Path) -> list[str]:
    """``/``-separated paths of the ``*.py`` files under ``root``, sorted, excluded dirs pruned."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        rel = Path(dirpath).relative_to(root)
        found.extend((rel / name).as_posix() for name in filenames if name.endswith(".py"))
    return sorted(found)


def read_stdlib() -> Iterator[Record]:
    """Yield one document per standard library file, in sorted path order.

    Yields:
        A :class:`CorpusDocument` with meta ``path`` (relative to the stdlib directory),
        ``module`` (dotted name) and ``package`` (its top-level package); or :class:`Skipped`
        (``too_large``, ``not_utf8``, ``empty``, ``over_file_cap``).
    """
    root = stdlib_dir()
    taken = 0
    for rel in _python_files(root):
        path = root / rel
        if taken >= MAX_FILES:
            yield Skipped(ref=rel, reason="over_file_cap")
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            yield Skipped(ref=rel, reason="too_large")
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            yield Skipped(ref=rel, reason="not_utf8")
            continue
        if not text.strip():
            yield Skipped(ref=rel, reason="empty")
            continue
        module = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        taken += 1
        package = module.split(".")[0]  # the top-level package (a module of its own: itself)
        yield CorpusDocument(text=text, meta={"path": rel, "module": module, "package": package})
