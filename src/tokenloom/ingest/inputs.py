"""Turn the paths given to ``tokenloom ingest`` into a list of input files, each of one kind.

A directory is expanded with a glob into text files (one document per file); other paths are
classified by extension. Paths that do not exist or have an unknown extension become rejections,
not exceptions, so one bad path never aborts the run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenloom.ingest.rejects import Reason, Reject

__all__ = [
    "InputFile",
    "discover",
    "fingerprint_bytes",
    "fingerprint_file",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = ("", ".gz", ".zst")
PARQUET_SUFFIXES = (".parquet", ".pq")
TEXT_SUFFIXES = (".txt", ".text", ".md")


@dataclass(frozen=True, kw_only=True, slots=True)
class InputFile:
    """One file to read."""

    path: str
    """Path as found (absolute)."""
    kind: str
    """``jsonl``, ``parquet`` or ``text`` (one document per file)."""
    compression: str = ""
    """``""``, ``".gz"`` or ``".zst"`` (JSONL only)."""
    default_source: str = ""
    """Source name used when neither ``--source`` nor the record names one."""
    relpath: str = ""
    """For text files found in a directory: the path relative to that directory."""


def _classify(path: Path) -> tuple[str, str] | None:
    name = path.name.lower()
    for comp in COMPRESSIONS:
        for suffix in JSONL_SUFFIXES:
            if name.endswith(suffix + comp):
                return "jsonl", comp
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet", ""
    if name.endswith(TEXT_SUFFIXES):
        return "text", ""
    return None


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    return name.split(".", 1)[0] or name


def discover(
    paths: Iterable[str | os.PathLike[str]], *, glob: str = "**/*.txt"
) -> tuple[list[InputFile], list[Reject]]:
    """Expand and classify input paths.

    Args:
        paths: Files (JSONL, optionally .gz/.zst; Parquet; .txt) and directories.
        glob: Pattern of the text files taken from each directory (one document per file).

    Returns:
        The input files in a deterministic order (arguments in order, directory entries sorted),
        and a rejection per path that cannot be read at all.
    """
    files: list[InputFile] = []
    rejects: list[Reject] = []
    for raw in paths:
        path = Path(os.path.abspath(os.path.expanduser(os.fspath(raw))))
        if path.is_dir():
            found = sorted(p for p in path.glob(glob) if p.is_file() or p.is_symlink())
            if not found:
                rejects.append(
                    Reject(
                        file=str(path),
                        reason=Reason.UNREADABLE_FILE,
                        detail=f"directory has no file matching {glob!r}; pass --glob",
                    )
                )
            for p in found:
                files.append(
                    InputFile(
                        path=str(p),
                        kind="text",
                        default_source=path.name,
                        relpath=str(p.relative_to(path)),
                    )
                )
            continue
        if not path.exists():
            rejects.append(
                Reject(file=str(path), reason=Reason.UNREADABLE_FILE, detail="no such file")
            )
            continue
        kind = _classify(path)
        if kind is None:
            rejects.append(
                Reject(
                    file=str(path),
                    reason=Reason.UNSUPPORTED_FORMAT,
                    detail="expected .jsonl/.ndjson/.json (optionally .gz/.zst), .parquet, "
                    ".txt or a directory of text files",
                )
            )
            continue
        files.append(
            InputFile(
                path=str(path),
                kind=kind[0],
                compression=kind[1],
                default_source=_stem(path),
                relpath=path.name,
            )
        )
    return files, rejects


def fingerprint_bytes(data: bytes) -> str:
    """The content fingerprint of an in-memory file."""
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def fingerprint_file(path: str, chunk: int = 1 << 22) -> str:
    """The content fingerprint of a file (BLAKE2b-160 of its raw bytes), read in chunks.

    Raises:
        OSError: when the file cannot be read.
    """
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
