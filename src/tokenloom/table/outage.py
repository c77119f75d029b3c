"""An object store that could not be reached, told apart from a bug at the CLI's boundary.

Lance and ``pyarrow.fs`` report a store that went away (refused connections, timeouts, failed
DNS, requests that exhausted their retries) as ``OSError`` (Lance's ``LanceError(IO)``) with the
transport's words in the message. That is the environment, not tokenloom: the command ends with
status 1, naming the endpoint, and the same command run again continues (a backfill keeps its
finished units; ingest and backfill commit once, at the end, so an interrupted run changed
nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tokenloom.table.storage import StorageError, parse_storage_options, resolve_storage_options

__all__ = [
    "StoreUnreachableError",
    "options_from_argv",
    "outage_message",
    "store_endpoint",
    "unreachable_store",
]


class StoreUnreachableError(StorageError):
    """The object store did not answer; the message names its endpoint and says to rerun."""


_MARKERS = (
    "could not connect",
    "couldn't connect",
    "failed to connect",
    "unable to connect",
    "connection refused",
    "connection reset",
    "connection closed",
    "connection aborted",
    "broken pipe",
    "error sending request",
    "dispatch failure",
    "network_connection",
    "network is unreachable",
    "no route to host",
    "host unreachable",
    "timed out",
    "timeout error",  # not a bare "timeout": Lance prints its "retry_timeout" in every I/O error
    "deadline has elapsed",
    "name or service not known",
    "failed to resolve",
    "could not resolve",
    "temporary failure in name resolution",
    "dns error",
)
"""Words of the transport (curl, hyper/reqwest, the OS) meaning the store did not answer."""

_URL = re.compile(r"\bhttps?://[^/\s'\"]+")
_HOST_PORT = re.compile(r"connect to ([\w.\-\[\]:]+:\d+)")


def unreachable_store(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain saying the object store could not be reached, if any.

    Only I/O errors count (``OSError`` and its kin, or a message from Lance's I/O layer), and
    only with the transport's words: a bad path, a permission refused or a bug stays what it is.
    """
    seen: set[int] = set()
    item: BaseException | None = exc
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        text = str(item)
        io = isinstance(item, OSError) or "LanceError(IO)" in text
        if io and any(marker in text.lower() for marker in _MARKERS):
            return item
        item = item.__cause__ or item.__context__
    return None


def options_from_argv(argv: Sequence[str]) -> dict[str, str]:
    """The storage options a command line gives (``--storage-options K=V``, either spelling)
    with the ``AWS_*`` environment under them; empty when they do not parse."""
    pairs = []
    for i, arg in enumerate(argv):
        if arg == "--storage-options" and i + 1 < len(argv):
            pairs.append(argv[i + 1])
        elif arg.startswith("--storage-options="):
            pairs.append(arg.split("=", 1)[1])
    try:
        return resolve_storage_options("s3://", parse_storage_options(pairs))
    except StorageError:
        return {}


def store_endpoint(exc: BaseException, options: Mapping[str, str] | None = None) -> str:
    """The endpoint the failed request went to: ``aws_endpoint`` of the resolved ``options``,
    else the ``AWS_ENDPOINT*`` environment, else the address in the error's own message."""
    endpoint = resolve_storage_options("s3://", options).get("aws_endpoint")
    if endpoint:
        return endpoint
    text = str(exc)
    match = _URL.search(text)
    if match:
        return match.group()
    match = _HOST_PORT.search(text)
    if match:
        return match.group(1)
    return "the object store's default endpoint"


def outage_message(
    exc: BaseException, options: Mapping[str, str] | None = None, *, detail: bool = True
) -> str | None:
    """The message for an unreachable store in ``exc``'s chain, else ``None``; ``detail=False``
    leaves out the error's own text (when it was printed already)."""
    if isinstance(exc, StoreUnreachableError):
        return None if not detail else str(exc)
    cause = unreachable_store(exc)
    if cause is None:
        return None
    said = ""
    if detail:
        said = " ".join(str(cause).split())
        said = f" ({type(cause).__name__}: {said[:399] + '…' if len(said) > 400 else said})"
    return (
        f"the object store at {store_endpoint(cause, options)} could not be reached{said}. "
        "Check that it is up and that the endpoint "
        "(--storage-options aws_endpoint=..., or AWS_ENDPOINT) is right, then run the same command "
        "again: what this run did not commit is redone, finished backfill units are kept"
    )
