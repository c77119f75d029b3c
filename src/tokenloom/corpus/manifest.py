"""The corpus manifest: what ``manifest.json`` says about each source file of a build."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenloom.errors import CorpusError

__all__ = ["MANIFEST_NAME", "MANIFEST_FORMAT", "SourceManifest", "CorpusManifest"]

MANIFEST_NAME = "manifest.json"
"""File name of the manifest inside the output directory."""
MANIFEST_FORMAT = "tokenloom.corpus/1"
"""Format tag; bump it when the manifest's fields change meaning."""


@dataclass(frozen=True, kw_only=True)
class SourceManifest:
    """One source file of a build."""

    name: str
    """Source name, also the ``source`` field of each record."""
    file: str
    """JSONL file name, relative to the output directory."""
    docs: int
    """Lines (documents) in the file."""
    skipped: int
    """Source records that did not become documents (sum of ``skip_reasons``)."""
    skip_reasons: dict[str, int]
    """Reason -> count, e.g. ``{"too_large": 2}``."""
    bytes: int
    """Size of the JSONL file."""
    chars: int
    """Characters of document text (the ``text`` fields only)."""
    sha256: str
    """Hex SHA-256 of the JSONL file: the source's fingerprint."""
    package: str
    """Distribution the text comes from (``"cpython"`` for the standard library)."""
    version: str
    """Its installed version."""
    licence: str
    """Licence of the text."""
    package_licence: str
    """Licence of the package, as its metadata states it."""
    description: str
    """One line saying what the documents are."""


@dataclass(frozen=True, kw_only=True)
class CorpusManifest:
    """Everything a build wrote, source by source, in canonical source order."""

    sources: tuple[SourceManifest, ...]
    """One entry per source built."""
    max_docs_per_source: int | None = None
    """The cap the build ran with (``None``: every document)."""
    format: str = field(default=MANIFEST_FORMAT)
    """Manifest format tag."""

    @property
    def total_docs(self) -> int:
        """Documents over all sources."""
        return sum(s.docs for s in self.sources)

    @property
    def total_bytes(self) -> int:
        """JSONL bytes over all sources."""
        return sum(s.bytes for s in self.sources)

    def source(self, name: str) -> SourceManifest:
        """The entry of one source.

        Raises:
            KeyError: The source was not built.
        """
        for entry in self.sources:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, totals included."""
        return {
            "format": self.format,
            "max_docs_per_source": self.max_docs_per_source,
            "total_docs": self.total_docs,
            "total_bytes": self.total_bytes,
            "sources": [asdict(s) for s in self.sources],
        }

    def dumps(self) -> str:
        """The text of ``manifest.json``: stable key order, UTF-8 kept, final newline."""
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CorpusManifest:
        """Rebuild a manifest from :meth:`to_json` output.

        Raises:
            CorpusError: ``obj`` has another format tag.
        """
        if obj.get("format") != MANIFEST_FORMAT:
            raise CorpusError(
                f"corpus manifest format is {obj.get('format')!r}, this tokenloom reads "
                f"{MANIFEST_FORMAT!r}; rebuild it with `tokenloom corpus build --out DIR`"
            )
        return cls(
            sources=tuple(SourceManifest(**s) for s in obj["sources"]),
            max_docs_per_source=obj.get("max_docs_per_source"),
        )

    @classmethod
    def load(cls, out_dir: str | Path) -> CorpusManifest:
        """Read ``<out_dir>/manifest.json``."""
        path = Path(out_dir) / MANIFEST_NAME
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
