"""What a source reader yields: a document to write, or a record it skipped and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CorpusDocument", "Skipped", "Record", "RESERVED_FIELDS"]

RESERVED_FIELDS = frozenset({"text", "source"})
"""JSONL keys the builder writes itself; a document's meta may not use them."""


@dataclass(frozen=True, kw_only=True)
class CorpusDocument:
    """One document of a source, before it becomes a JSONL line."""

    text: str
    """The document text, non-empty."""
    meta: Mapping[str, str | int] = field(default_factory=dict)
    """A few fields written beside ``text`` and ``source`` (title, path, chapter, ...)."""

    def __post_init__(self) -> None:
        # Readers are our own code, so these are invariants, not user-input checks.
        assert self.text and not self.text.isspace(), "a document needs text"
        assert not RESERVED_FIELDS & set(self.meta), f"meta may not use {sorted(RESERVED_FIELDS)}"

    def to_record(self, source: str) -> dict[str, str | int]:
        """The JSON object of this document's line."""
        return {**self.meta, "text": self.text, "source": source}


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A source record that did not become a document."""

    ref: str
    """Which record: a title, a path, a row."""
    reason: str
    """Why, as a short snake_case word counted in the manifest (``"empty_extract"``)."""


Record = CorpusDocument | Skipped
"""What a reader yields."""
