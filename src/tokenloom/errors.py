"""The one exception hierarchy of tokenloom.

Library code raises these; the CLI translates them once, at its edge, into a message and an exit
status. Every message names the bad value, the rule it broke and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "TokenloomError",
    "TableError",
    "TableNotFoundError",
    "IngestError",
    "CorpusError",
    "MissingDependencyError",
    "require",
]


class TokenloomError(Exception):
    """Base class of every error tokenloom raises on purpose."""


class TableError(TokenloomError):
    """The table cannot be created, opened or written as asked."""


class TableNotFoundError(TableError):
    """No tokenloom table exists at the given URI."""


class IngestError(TokenloomError):
    """An ingest run could not produce any row (individual bad records are rejections instead)."""


class CorpusError(TokenloomError):
    """The bundled corpus cannot be built as asked (an unknown source, a bad limit)."""


class MissingDependencyError(TokenloomError):
    """An optional dependency is needed for this feature but is not installed."""


def require(module: str, *, extra: str, package: str | None = None) -> object:
    """Import an optional dependency or raise an error naming the install line.

    Args:
        module: The module to import, e.g. ``"torch"``.
        extra: The tokenloom extra that provides it, e.g. ``"train"``.
        package: The PyPI name when it differs from the module name.

    Returns:
        The imported module.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module
        raise MissingDependencyError(
            f"{pkg!r} is required for this feature but is not installed; "
            f"run `pip install 'tokenloom[{extra}]'` (or `pip install {pkg}`)"
        ) from exc
