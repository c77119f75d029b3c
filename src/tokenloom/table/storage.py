"""Object-store access for everything that is not the Lance table itself.

Lance reads and writes the table. What tokenloom keeps *beside* it (ingest inputs, rejects,
backfill units and job records, curation lookups) goes through ``pyarrow.fs`` with the same
options, so one set of storage options (``--storage-options KEY=VALUE`` or the ``AWS_*``
environment) serves both, and an object-store table never writes to the current directory.

Options use Lance's names (``aws_endpoint``, ``aws_region``, ``allow_http``,
``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``); the ``AWS_*``
environment fills what is not given explicitly. Resolving the environment once, in the process
that parses the command, is what lets a worker on another machine (a Ray node) open the table
without that environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from tokenloom.errors import TokenloomError

__all__ = [
    "StorageError",
    "check_uri",
    "is_remote",
    "join",
    "parse_storage_options",
    "resolve_storage_options",
    "filesystem",
    "read_bytes",
    "write_bytes",
    "exists",
    "list_names",
    "delete",
    "delete_tree",
]


class StorageError(TokenloomError):
    """Bad storage options, or an object store that cannot be reached."""


_ALIASES = {
    "endpoint": "aws_endpoint",
    "endpoint_url": "aws_endpoint",
    "aws_endpoint_url": "aws_endpoint",
    "aws_endpoint_url_s3": "aws_endpoint",
    "region": "aws_region",
    "aws_default_region": "aws_region",
    "access_key_id": "aws_access_key_id",
    "secret_access_key": "aws_secret_access_key",
    "session_token": "aws_session_token",
    "aws_allow_http": "allow_http",
}

_ENV = (
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
)
"""Environment variables taken into the resolved options (explicit options win)."""


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_NO_AUTHORITY = frozenset({"file", "memory"})
"""Schemes whose URIs may have an empty authority (``file:///abs``, ``memory://``)."""
_KNOWN = _NO_AUTHORITY | {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf", "http", "https"}


def check_uri(uri: str | os.PathLike[str]) -> str:
    """``uri`` unchanged when it is a plain path or a well-formed URI; else an error.

    A text that starts like a URI (``scheme:``) must go on with ``//``: ``file:/abs/t.lance``,
    ``s3:/bucket/t`` or ``s3:bucket/t`` would otherwise be taken for a *relative local path* and a
    directory named ``file:`` or ``s3:`` created in the current directory. An object-store URI
    names its bucket (``s3://`` alone does not); a ``file://`` URI names a path on this machine
    (``file:///abs/t.lance``). A local name holding a colon is written ``./name:x``.

    Raises:
        StorageError: naming the text, the rule and the spelling that works.
    """
    text = os.fspath(uri)
    if not isinstance(text, str):
        raise StorageError(f"a table URI must be text, not {type(text).__name__}")
    found = _SCHEME.match(text)
    if found is None or (os.name == "nt" and len(found.group(1)) == 1):  # a drive letter
        return text
    scheme, rest = found.group(1), text[found.end() :]
    kind = scheme.lower()
    if not rest.startswith("//"):
        tail = rest.lstrip("/")
        fix = f"file:///{tail}` or `/{tail}" if kind == "file" else f"{scheme}://{tail}"
        local = "" if kind in _KNOWN else f", or `./{text}` for a local name holding a colon"
        raise StorageError(
            f"{text!r} is not a well-formed URI: '{scheme}:' must be followed by '//' (it would "
            f"be read as a local path relative to the current directory); write `{fix}`{local}"
        )
    authority, _, path = rest[2:].partition("/")
    if kind == "file":
        if authority not in ("", "localhost"):
            raise StorageError(
                f"{text!r} names the host {authority!r}: a file URI is a path on this machine, "
                f"written with three slashes (`file:///{rest[2:]}`)"
            )
        if not path.strip("/"):
            raise StorageError(f"{text!r} names no path; write `file:///ABSOLUTE/PATH`")
    elif kind not in _NO_AUTHORITY and not authority:
        raise StorageError(
            f"{text!r} names no bucket: write `{scheme}://BUCKET/PATH` (e.g. "
            f"`{scheme}://my-bucket/corpus.lance`)"
        )
    return text


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an object store (``s3://``, ``gs://``, ...), not a local path."""
    text = os.fspath(uri)
    return "://" in text and not text.startswith("file://")


def join(uri: str, *parts: str) -> str:
    """``uri`` and ``parts`` joined with ``/`` (a local path is joined with ``os.path.join``)."""
    if not is_remote(uri):
        return os.path.join(uri, *parts)
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def _canonical(key: str) -> str:
    key = key.strip().lower()
    return _ALIASES.get(key, key)


def parse_storage_options(pairs: Iterable[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` into a dict with Lance's key names.

    Raises:
        StorageError: for an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise StorageError(
                f"storage option {item!r} is not KEY=VALUE; e.g. "
                "--storage-options aws_endpoint=http://127.0.0.1:8333"
            )
        out[_canonical(key)] = value
    return out


def resolve_storage_options(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The options to use for ``uri``: the ``AWS_*`` environment overlaid with the explicit
    ``storage_options`` (keys canonicalised). Empty for local paths and without any option."""
    explicit = {_canonical(k): str(v) for k, v in (storage_options or {}).items()}
    if not is_remote(uri):
        return explicit
    out: dict[str, str] = {}
    if uri.startswith(("s3://", "s3a://")):
        for name in _ENV:
            value = os.environ.get(name)
            if value:
                out.setdefault(_canonical(name), value)
    out.update(explicit)
    endpoint = out.get("aws_endpoint", "")
    if endpoint.startswith("http://") and "allow_http" not in out:
        out["allow_http"] = "true"  # an http endpoint was asked for: allow it
    return out


def _s3(options: Mapping[str, str]):  # noqa: ANN202 - pyarrow.fs.S3FileSystem
    from pyarrow import fs as pafs

    kwargs: dict = {}
    endpoint = options.get("aws_endpoint")
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        kwargs["endpoint_override"] = rest if rest else endpoint
        kwargs["scheme"] = scheme if rest else "https"
    if options.get("aws_access_key_id"):
        kwargs["access_key"] = options["aws_access_key_id"]
        kwargs["secret_key"] = options.get("aws_secret_access_key", "")
        if options.get("aws_session_token"):
            kwargs["session_token"] = options["aws_session_token"]
    kwargs["region"] = options.get("aws_region", "us-east-1")
    if options.get("aws_virtual_hosted_style_request", "").lower() == "true":
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**kwargs)


_FS_CACHE: dict[tuple, object] = {}


def filesystem(uri: str, storage_options: Mapping[str, str] | None = None):  # noqa: ANN201
    """A ``pyarrow.fs`` file system for ``uri`` and the path inside it.

    Returns:
        ``(FileSystem, path)``; a local path comes back absolute on the local file system.
    """
    from pyarrow import fs as pafs

    if not is_remote(uri):
        path = uri[len("file://") :] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    scheme, _, rest = uri.partition("://")
    options = resolve_storage_options(uri, storage_options)
    if scheme in ("s3", "s3a"):
        key = ("s3", tuple(sorted(options.items())))
        if key not in _FS_CACHE:
            _FS_CACHE[key] = _s3(options)
        return _FS_CACHE[key], rest.rstrip("/")
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # noqa: BLE001 - named in one line
        raise StorageError(f"cannot open {uri}: {exc}") from exc
    return fs, path


def read_bytes(uri: str, storage_options: Mapping[str, str] | None = None) -> bytes:
    """The whole object or file at ``uri``.

    Raises:
        FileNotFoundError: when there is nothing at ``uri``.
    """
    fs, path = filesystem(uri, storage_options)
    with fs.open_input_stream(path, compression=None) as fh:
        return fh.read()


def write_bytes(uri: str, data: bytes, storage_options: Mapping[str, str] | None = None) -> None:
    """Write ``data`` to ``uri`` whole: a single PUT on an object store (readers see the old
    object or the new one, never a part), a temporary file renamed into place locally."""
    fs, path = filesystem(uri, storage_options)
    if is_remote(uri):
        with fs.open_output_stream(path, compression=None) as fh:
            fh.write(data)
        return
    import uuid

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def exists(uri: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether a file or object is at ``uri``."""
    from pyarrow import fs as pafs

    fs, path = filesystem(uri, storage_options)
    return fs.get_file_info(path).type == pafs.FileType.File


def list_names(uri: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Names directly under the folder (prefix) ``uri``, sorted; empty when there is none."""
    from pyarrow import fs as pafs

    fs, path = filesystem(uri, storage_options)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(info.base_name for info in infos)


def delete(uri: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Delete the file or object at ``uri`` (nothing there is fine)."""
    fs, path = filesystem(uri, storage_options)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def delete_tree(uri: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Delete everything under the folder (prefix) ``uri``."""
    fs, path = filesystem(uri, storage_options)
    try:
        fs.delete_dir_contents(path, missing_dir_ok=True)
    except FileNotFoundError:
        pass
