"""The registry of corpus sources: name -> where the text comes from, its licence, its reader.

Source names are a contract: they name the JSONL files (``<name>.jsonl``), the ``source`` field
of every record and, after ingest, the table's ``source`` column.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tokenloom.corpus import kjv, locate, shakespeare, stdlib, wiki
from tokenloom.corpus.document import Record
from tokenloom.errors import CorpusError

__all__ = ["SourceSpec", "SOURCES", "DEFAULT_SOURCES", "resolve_sources"]


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """One corpus source."""

    name: str
    """The source name, e.g. ``"wiki_en"``."""
    description: str
    """One line saying what the documents are."""
    licence: str
    """Licence of the text itself (which can differ from the package's)."""
    origin: Callable[[], locate.Origin]
    """Reads the origin package, its version and licence; raises ``MissingDependencyError``."""
    read: Callable[[], Iterator[Record]]
    """Yields the source's documents (and skipped records), in a deterministic order."""


def _stdlib_origin() -> locate.Origin:
    return locate.Origin(
        package="cpython", version=platform.python_version(), package_licence="PSF-2.0"
    )


def _wiki(lang: str, language: str) -> SourceSpec:
    return SourceSpec(
        name=f"wiki_{lang}",
        description=f"{language} Wikipedia lead summaries of the vital articles, one per article",
        licence="CC-BY-SA-4.0 (Wikipedia text)",
        origin=functools.partial(locate.origin_of, wiki.DIST, module=wiki.MODULE),
        read=functools.partial(wiki.read_wiki, lang),
    )


def _shakespeare(edition: str, what: str) -> SourceSpec:
    return SourceSpec(
        name=f"shakespeare_{edition}",
        description=f"Shakespeare's works, {what}, one per work",
        licence="public domain (Project Gutenberg texts)",
        origin=functools.partial(locate.origin_of, shakespeare.DIST, module=shakespeare.MODULE),
        read=functools.partial(shakespeare.read_shakespeare, edition),
    )


SOURCES: dict[str, SourceSpec] = {
    spec.name: spec
    for spec in (
        _wiki("en", "English"),
        _wiki("es", "Spanish"),
        _wiki("fr", "French"),
        _shakespeare("gutenberg", "Project Gutenberg modern-spelling edition"),
        _shakespeare("folio", "First Folio (1623) spelling"),
        SourceSpec(
            name="kjv",
            description="King James Bible, one document per chapter, verses numbered",
            licence="public domain (Crown copyright in the UK)",
            origin=functools.partial(locate.origin_of, kjv.DIST, module=kjv.MODULE),
            read=kjv.read_kjv,
        ),
        SourceSpec(
            name="python_stdlib",
            description="Python standard library *.py sources, one per file",
            licence="PSF-2.0",
            origin=_stdlib_origin,
            read=stdlib.read_stdlib,
        ),
    )
}
"""Every source, in canonical order."""

DEFAULT_SOURCES: tuple[str, ...] = tuple(SOURCES)
"""All source names, in the order they are built and listed."""


def resolve_sources(names: Sequence[str] | None) -> list[SourceSpec]:
    """Pick sources by name: all when ``names`` is None, else those named, in canonical order.

    Raises:
        CorpusError: A name is not a source, or ``names`` is empty.
    """
    if names is None:
        return list(SOURCES.values())
    if isinstance(names, str):
        names = [names]
    unknown = sorted(set(names) - set(SOURCES))
    if unknown:
        raise CorpusError(
            f"unknown corpus source(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(DEFAULT_SOURCES)}"
        )
    if not names:
        raise CorpusError(f"no corpus source chosen; choose from {', '.join(DEFAULT_SOURCES)}")
    return [spec for name, spec in SOURCES.items() if name in set(names)]
