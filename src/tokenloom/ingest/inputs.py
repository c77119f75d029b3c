"""Turn the paths given to ``tokenloom ingest`` into a list of input files, each of one kind.

A directory is walked (without following symlinks that leave it, unless asked; counting symlink
loops) and its files matching a glob become text inputs (one document per file); other paths
are classified by extension. Paths that do not exist, cannot be listed, are not regular files
(devices, named pipes, sockets: never opened) or have an unknown extension become rejections,
not exceptions, so one bad path never aborts the run. The same file reached twice (a path given
twice, a symlink to a file inside the directory) is read once.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from tokenloom.ingest.hf import HF_SCHEME, hf_inputs, is_saved_dataset
from tokenloom.ingest.rejects import Reason, Reject, printable
from tokenloom.table.storage import filesystem, is_remote

__all__ = [
    "InputFile",
    "NotRegularFile",
    "discover",
    "fingerprint_bytes",
    "fingerprint_file",
    "open_regular",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "ARROW_SUFFIXES",
]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = ("", ".gz", ".zst")
PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow",)
TEXT_SUFFIXES = (".txt", ".text", ".md")


@dataclass(frozen=True, kw_only=True, slots=True)
class InputFile:
    """One file to read."""

    path: str
    """Path as found (absolute; may hold surrogate escapes of a non-UTF-8 name)."""
    kind: str
    """``jsonl``, ``parquet``, ``arrow`` (Arrow IPC, as ``datasets`` saves), ``text`` (one
    document per file) or ``lance`` (a Lance dataset's folder, read at :attr:`version`)."""
    compression: str = ""
    """``""``, ``".gz"`` or ``".zst"`` (JSONL only)."""
    default_source: str = ""
    """Source name used when neither ``--source`` nor the record names one (valid UTF-8)."""
    relpath: str = ""
    """For text files found in a directory: the path relative to that directory; else the file
    name (valid UTF-8: undecodable bytes of a name are written ``\\\\xNN``)."""
    escaped_name: bool = False
    """True when the name is not UTF-8 and ``relpath``/``default_source`` carry escapes."""
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """Object-store options for an ``s3://``-style ``path`` (never written anywhere)."""
    size: int = -1
    """Size in bytes when known from the listing (object-store inputs), else -1."""
    split: str = ""
    """The split of a file of a Hugging Face dataset folder (:mod:`tokenloom.ingest.hf`)."""
    version: int | None = None
    """A Lance dataset's version read (``kind == "lance"``), pinned when it is found."""


class NotRegularFile(OSError):
    """The path is a device, named pipe, socket or directory, not a regular file."""


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, storage_options: Mapping[str, str] | None = None) -> BinaryIO:
    """Open a regular file for binary reading; anything else is refused after ``fstat``.

    Opening is non-blocking, so a named pipe swapped in after discovery cannot hang the run.
    An object-store URI is opened through ``pyarrow.fs`` (a seekable file reading by ranges).

    Raises:
        NotRegularFile: for devices, pipes, sockets, directories.
        OSError: when the file cannot be opened.
    """
    if is_remote(path):
        fs, inner = filesystem(path, storage_options)
        return io.BufferedReader(_RemoteFile(fs.open_input_file(inner)), buffer_size=1 << 20)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{_file_kind(mode)}, not a regular file; not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _RemoteFile(io.RawIOBase):
    """A ``pyarrow.fs`` input file as a raw Python stream (ranged reads, seekable), so the
    readers' ``readline``/``read``/``seek`` behave as on a local file."""

    def __init__(self, native) -> None:  # noqa: ANN001 - a pyarrow NativeFile
        self._f = native

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        data = self._f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def size(self) -> int:
        return self._f.size()

    def close(self) -> None:
        self._f.close()
        super().close()


def _classify(name: str) -> tuple[str, str] | None:
    name = name.lower()
    for comp in COMPRESSIONS:
        for suffix in JSONL_SUFFIXES:
            if name.endswith(suffix + comp):
                return "jsonl", comp
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet", ""
    if name.endswith(ARROW_SUFFIXES):
        return "arrow", ""
    if name.endswith(TEXT_SUFFIXES):
        return "text", ""
    return None


def _stem(name: str) -> str:
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    return name.split(".", 1)[0] or name


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching relative paths (``/``-separated) like ``pathlib`` globs: ``**`` spans
    directories, ``*``/``?``/``[...]`` stay within one name."""
    parts = [p for p in pattern.split("/") if p]
    out: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        out.append(_translate(part) + ("" if last else "/"))
    return re.compile("".join(out), re.DOTALL)


def _translate(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := part.find("]", i + 2)) > 0:
            body = part[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def discover(
    paths: Iterable[str | os.PathLike[str]],
    *,
    glob: str = "**/*.txt",
    follow_symlinks: bool = False,
    storage_options: Mapping[str, str] | None = None,
    split: str | None = None,
) -> tuple[list[InputFile], list[Reject]]:
    """Expand and classify input paths.

    Args:
        paths: Files (JSONL, optionally .gz/.zst; Parquet; .txt) and directories. A symlink named
            here is followed.
        glob: Pattern of the text files taken from each directory (one document per file).
        follow_symlinks: Inside directories, follow symlinks that point outside the directory.
        storage_options: Options for object-store URIs among ``paths`` (``s3://bucket/x.jsonl``,
            or a prefix ``s3://bucket/dir/`` read like a directory of text files).
        split: The split read from Hugging Face dataset folders (``hf://DIR``, or a folder
            ``save_to_disk`` wrote); ``None``: every split. See :mod:`tokenloom.ingest.hf`.

    Returns:
        The input files in a deterministic order (arguments in order, directory entries sorted),
        and a rejection per path that cannot be read at all.
    """
    files: list[InputFile] = []
    rejects: list[Reject] = []
    seen: set[tuple[int, int]] = set()
    pattern = glob_regex(glob)
    for raw in paths:
        if os.fspath(raw).startswith(HF_SCHEME):
            _discover_hf(os.fspath(raw), split, seen, files, rejects)
            continue
        if is_remote(os.fspath(raw)):
            _discover_remote(os.fspath(raw), glob, pattern, storage_options, files, rejects)
            continue
        path = os.path.abspath(os.path.expanduser(os.fspath(raw)))
        try:
            st = os.stat(path)
        except OSError as exc:
            rejects.append(_stat_reject(path, exc))
            continue
        if stat.S_ISDIR(st.st_mode) and is_saved_dataset(path):
            _discover_hf(path, split, seen, files, rejects)
            continue
        if stat.S_ISDIR(st.st_mode) and is_lance_dataset(path):
            found = lance_input(path)
            if isinstance(found, Reject):
                rejects.append(found)
            elif (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                files.append(found)
            continue
        if stat.S_ISDIR(st.st_mode):
            found = _walk(path, st, pattern, follow_symlinks, seen, rejects)
            if found is None:
                rejects.append(
                    Reject(
                        file=path,
                        reason=Reason.UNREADABLE_FILE,
                        detail=f"directory has no file matching {glob!r}; pass --glob",
                    )
                )
            files.extend(found or [])
            continue
        name = os.path.basename(path)
        kind = _classify(name)
        if not stat.S_ISREG(st.st_mode):
            detail = f"{_file_kind(st.st_mode)}, not a regular file; not opened"
            rejects.append(Reject(file=path, reason=Reason.UNSUPPORTED_FORMAT, detail=detail))
            continue
        if kind is None:
            rejects.append(
                Reject(
                    file=path,
                    reason=Reason.UNSUPPORTED_FORMAT,
                    detail="expected .jsonl/.ndjson/.json (optionally .gz/.zst), .parquet, "
                    ".arrow, .txt, a directory of text files or an hf:// dataset folder",
                )
            )
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue  # the same file named twice is read once
        seen.add((st.st_dev, st.st_ino))
        shown = printable(name)
        files.append(
            InputFile(
                path=path,
                kind=kind[0],
                compression=kind[1],
                default_source=_stem(shown),
                relpath=shown,
                escaped_name=shown != name,
            )
        )
    return files, rejects


def _discover_remote(
    uri: str,
    glob: str,
    pattern: re.Pattern[str],
    storage_options: Mapping[str, str] | None,
    files: list[InputFile],
    rejects: list[Reject],
) -> None:
    """One object-store input: an object classified by its name, or a prefix whose objects
    matching ``glob`` are text files (one document each)."""
    from pyarrow import fs as pafs

    try:
        fs, path = filesystem(uri, storage_options)
        info = fs.get_file_info(path)
    except OSError as exc:
        rejects.append(Reject(file=uri, reason=Reason.UNREADABLE_FILE, detail=str(exc)))
        return
    if info.type == pafs.FileType.File:
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        kind = _classify(name)
        if kind is None:
            rejects.append(
                Reject(
                    file=uri,
                    reason=Reason.UNSUPPORTED_FORMAT,
                    detail="expected .jsonl/.ndjson/.json (optionally .gz/.zst), .parquet, "
                    ".txt or a prefix of text files",
                )
            )
            return
        files.append(
            InputFile(
                path=uri, kind=kind[0], compression=kind[1], default_source=_stem(name),
                relpath=name, storage_options=storage_options, size=info.size or 0,
            )
        )  # fmt: skip
        return
    if info.type != pafs.FileType.Directory:
        rejects.append(Reject(file=uri, reason=Reason.UNREADABLE_FILE, detail="no such object"))
        return
    scheme = uri.split("://", 1)[0]
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if entry.type != pafs.FileType.File:
            continue
        rel = entry.path[len(path.rstrip("/")) + 1 :]
        if pattern.fullmatch(rel):
            found.append((f"{scheme}://{entry.path}", rel, entry.size or 0))
    if not found:
        detail = f"prefix has no object matching {glob!r}; pass --glob"
        rejects.append(Reject(file=uri, reason=Reason.UNREADABLE_FILE, detail=detail))
        return
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for full, rel, size in sorted(found):
        files.append(
            InputFile(
                path=full, kind="text", default_source=name, relpath=rel,
                storage_options=storage_options, size=size,
            )
        )  # fmt: skip


def _discover_hf(
    raw: str,
    split: str | None,
    seen: set[tuple[int, int]],
    files: list[InputFile],
    rejects: list[Reject],
) -> None:
    """The data files of a local Hugging Face dataset folder (:mod:`tokenloom.ingest.hf`)."""
    root = os.path.abspath(os.path.expanduser(raw.removeprefix(HF_SCHEME)))
    if not os.path.isdir(root):
        detail = (
            "hf:// takes a local dataset folder (no download); fetch one with `huggingface-cli "
            "download --repo-type dataset NAME --local-dir DIR`, then ingest hf://DIR"
        )
        rejects.append(Reject(file=raw, reason=Reason.UNREADABLE_FILE, detail=detail))
        return
    found, problems = hf_inputs(root, split)
    rejects.extend(problems)
    name = printable(os.path.basename(root.rstrip(os.sep)) or root)
    for path, rel, file_split in found:
        try:
            st = os.stat(path)
        except OSError as exc:
            rejects.append(_stat_reject(path, exc))
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        kind = _classify(os.path.basename(path)) or ("arrow", "")
        shown = printable(rel)
        files.append(
            InputFile(
                path=path, kind=kind[0], compression=kind[1], default_source=name,
                relpath=shown, escaped_name=shown != rel, split=file_split,
            )
        )  # fmt: skip
    if not found and not problems:
        detail = "no .parquet, .arrow or .jsonl data file in this dataset folder"
        rejects.append(Reject(file=root, reason=Reason.UNREADABLE_FILE, detail=detail))


def is_lance_dataset(path: str) -> bool:
    """Whether the local directory ``path`` holds a Lance dataset (a LanceDB table's too)."""
    return os.path.isdir(os.path.join(path, "_versions"))


def lance_input(path: str, version: int | None = None) -> InputFile | Reject:
    """The input of the Lance dataset at ``path``, pinned to ``version`` (default: its latest),
    or the rejection saying why it cannot be read."""
    import lance

    try:
        ds = lance.dataset(path, version=version)
        pinned = int(ds.version)
        size = sum(
            os.path.getsize(os.path.join(path, "data", f.path))
            for frag in ds.get_fragments()
            for f in frag.data_files()
        )
    except Exception as exc:  # noqa: BLE001 - any failure to open: the dataset is unreadable
        detail = f"not a readable Lance dataset: {type(exc).__name__}: {str(exc)[:300]}"
        return Reject(file=path, reason=Reason.UNREADABLE_FILE, detail=detail)
    name = os.path.basename(path.rstrip(os.sep))
    shown = printable(name)
    return InputFile(
        path=path,
        kind="lance",
        default_source=_stem(shown),
        relpath=shown,
        escaped_name=shown != name,
        size=size,
        version=pinned,
    )


def fingerprint_lance(inp: InputFile) -> str:
    """The content fingerprint of a Lance dataset at the version ``inp`` pins: its schema and
    the names, sizes and deletion files of its data files (Lance never rewrites a data file in
    place, so these name the content without reading it)."""
    import json

    import lance

    ds = lance.dataset(inp.path, version=inp.version)
    parts = [ds.schema.to_string(show_schema_metadata=False)]
    for frag in ds.get_fragments():
        meta = frag.metadata
        deletion = getattr(meta, "deletion_file", None)
        parts.append(
            json.dumps(
                [
                    [f.path, os.path.getsize(os.path.join(inp.path, "data", f.path))]
                    for f in frag.data_files()
                ]
                + [str(deletion) if deletion is not None else None]
            )
        )
    return "lance:" + fingerprint_bytes("\n".join(parts).encode())


def _stat_reject(path: str, exc: OSError) -> Reject:
    if exc.errno == errno.ELOOP:
        return Reject(file=path, reason=Reason.SYMLINK_LOOP, detail=str(exc.strerror))
    if exc.errno == errno.ENOENT:
        detail = "dangling symlink" if os.path.islink(path) else "no such file"
        return Reject(file=path, reason=Reason.UNREADABLE_FILE, detail=detail)
    return Reject(file=path, reason=Reason.UNREADABLE_FILE, detail=f"{exc.strerror or exc}")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _walk(
    root: str,
    root_stat: os.stat_result,
    pattern: re.Pattern[str],
    follow_symlinks: bool,
    seen: set[tuple[int, int]],
    rejects: list[Reject],
) -> list[InputFile] | None:
    """Matching regular files under ``root`` (sorted by path); ``None`` when nothing matched."""
    real_root = os.path.realpath(root)
    visited = {(root_stat.st_dev, root_stat.st_ino)}
    stack = [(root, "")]
    found: list[tuple[str, str]] = []
    matched = False
    while stack:
        directory, rel = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            matched = True
            detail = f"directory cannot be listed: {exc.strerror or exc}"
            rejects.append(Reject(file=directory, reason=Reason.UNREADABLE_FILE, detail=detail))
            continue
        for entry in entries:
            relpath = rel + entry.name
            wanted = pattern.fullmatch(relpath) is not None
            try:
                link = entry.is_symlink()
                st = os.stat(entry.path) if link else entry.stat(follow_symlinks=False)
            except OSError as exc:
                if link and (wanted or exc.errno == errno.ELOOP):
                    matched = True
                    rejects.append(_stat_reject(entry.path, exc))
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or wanted):
                continue
            if link and not follow_symlinks:
                target = os.path.realpath(entry.path)
                if not _inside(target, real_root):
                    matched = True
                    detail = f"points to {target}, outside {root}; --follow-symlinks to read it"
                    rejects.append(
                        Reject(file=entry.path, reason=Reason.SYMLINK_OUTSIDE_ROOT, detail=detail)
                    )
                    continue
            key = (st.st_dev, st.st_ino)
            if is_dir:
                if key in visited:
                    matched = True
                    detail = "directory reached a second time through a symlink; not walked again"
                    rejects.append(
                        Reject(file=entry.path, reason=Reason.SYMLINK_LOOP, detail=detail)
                    )
                    continue
                visited.add(key)
                stack.append((entry.path, relpath + "/"))
                continue
            matched = True
            if not stat.S_ISREG(st.st_mode):
                detail = f"{_file_kind(st.st_mode)}, not a regular file; not opened"
                rejects.append(
                    Reject(file=entry.path, reason=Reason.UNSUPPORTED_FORMAT, detail=detail)
                )
                continue
            if key in seen:
                continue  # the same file reached twice (a symlink to it) is read once
            seen.add(key)
            found.append((entry.path, relpath))
    if not matched:
        return None
    name = os.path.basename(root.rstrip(os.sep)) or root
    out = []
    for path, relpath in sorted(found):
        shown = printable(relpath)
        # Data shards (JSONL, Parquet) selected by --glob are read as data, not as one text each.
        kind = _classify(os.path.basename(path))
        data = kind is not None and kind[0] in ("jsonl", "parquet", "arrow")
        out.append(
            InputFile(
                path=path,
                kind=kind[0] if data else "text",
                compression=kind[1] if data else "",
                default_source=printable(name),
                relpath=shown,
                escaped_name=shown != relpath or printable(name) != name,
            )
        )
    return out


def fingerprint_bytes(data: bytes) -> str:
    """The content fingerprint of an in-memory file."""
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def fingerprint_file(
    path: str, chunk: int = 1 << 22, *, storage_options: Mapping[str, str] | None = None
) -> str:
    """The content fingerprint of a regular file (BLAKE2b-160 of its raw bytes), read in chunks.

    Raises:
        OSError: when the file cannot be read (:class:`NotRegularFile` when it is not a file).
    """
    h = hashlib.blake2b(digest_size=20)
    with open_regular(path, storage_options) as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
