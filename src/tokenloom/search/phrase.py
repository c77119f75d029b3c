"""How phrase hits are ranked: BM25F of the phrase, as one term, over the opening and the text.

Lance answers a quoted query with the rows holding the phrase, but scores each row by BM25 over
the phrase's *separate* words. For ``"in the beginning"`` that score is decided by how often
``in``, ``the`` and ``beginning`` occur anywhere in a chapter: on the bundled corpus Proverbs 8
(``beginning`` twice, once outside the phrase) came first and Genesis 1 eleventh of 21.

A phrase hit is therefore re-scored from the phrase itself, with BM25F (Robertson, Zaragoza and
Taylor, 2004) over two fields of the row:

- the **opening**: the text up to the end of its first sentence (``.``, ``!`` or ``?`` followed
  by a space, at most :data:`LEAD_MAX_WORDS` words), weight :data:`LEAD_WEIGHT`. A document
  that opens with the phrase is about it, the way a title match is a strong signal in web
  search; a phrase filling more of a short opening counts more (length normalisation).
- the **whole text**, weight 1, with the phrase's occurrence count as term frequency.

``tf' = Σ_field weight · tf_field / (1 − b + b · len_field / avg_len_field)`` and
``score = idf · tf' / (k1 + tf')`` with ``k1 = 1.2``, ``b = 0.75`` (lengths in characters). The
average text length is the table's mean ``n_chars`` (a collection statistic, as in BM25); the
average opening length is the hits' (every row's opening would cost a scan of the text). ``idf``
is BM25's for a term held by ``matches`` of ``rows`` rows; it is the same for every hit of a query.

Occurrences are counted on lower-cased, accent-folded words (``\\w+``), as the index splits
them. A row that Lance matched only through a stemmed form (``"in the beginnings"``) counts one
occurrence, outside the opening. Only the :data:`PHRASE_POOL` best hits by Lance's score are
re-ranked; a query with more matches says so in a note.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "K1",
    "B",
    "LEAD_WEIGHT",
    "LEAD_MAX_WORDS",
    "PHRASE_POOL",
    "PhraseStats",
    "words",
    "lead_end",
    "phrase_pattern",
    "phrase_stats",
    "phrase_scores",
]

K1 = 1.2
B = 0.75
LEAD_WEIGHT = 5.0
"""Weight of the opening sentence against the whole text (BM25F title weights are 2–10)."""
LEAD_MAX_WORDS = 40
"""The opening ends after this many words when no sentence ends sooner (code, verse, tables)."""
PHRASE_POOL = 1000
"""Phrase hits read and re-ranked per query, the best by Lance's score."""

_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


@dataclass(frozen=True, kw_only=True)
class PhraseStats:
    """What the ranking needs to know about one hit."""

    occurrences: int
    """Times the phrase occurs in the text (at least 1: Lance matched it)."""
    in_lead: int
    """Of those, the ones inside the opening sentence."""
    length: int
    """Characters of the text."""
    lead_length: int
    """Characters of the opening sentence."""


def _fold(text: str) -> str:
    """Lower-cased, accents removed (``café`` → ``cafe``); other scripts kept."""
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def words(text: str) -> list[str]:
    """Lower-cased, ASCII-folded words of ``text``, as the full-text index splits them."""
    return _WORD.findall(_fold(text))


def lead_end(text: str) -> int:
    """Character offset where the opening sentence of ``text`` ends (see the module doc)."""
    end = len(text)
    found = _SENTENCE_END.search(text)
    if found is not None:
        end = found.end()
    for i, word in enumerate(_WORD.finditer(text)):
        if i + 1 == LEAD_MAX_WORDS:
            return min(end, word.end())
        if word.start() >= end:
            break
    return end


def phrase_pattern(phrase: Sequence[str]) -> re.Pattern[str]:
    """The phrase's words in order, whole words, anything but word characters between them."""
    body = r"\W+".join(map(re.escape, phrase))
    return re.compile(rf"(?<!\w){body}(?!\w)")


def phrase_stats(text: str, phrase: Sequence[str] | re.Pattern[str]) -> PhraseStats:
    """Occurrences of ``phrase`` (its :func:`words`, or their :func:`phrase_pattern`) in
    ``text``, in all and in the opening."""
    text = text or ""
    pattern = phrase if isinstance(phrase, re.Pattern) else phrase_pattern(phrase)
    folded = _fold(text)  # offsets may shift: the opening is measured on the folded text too
    ends = [m.end() for m in pattern.finditer(folded)]
    end = lead_end(folded)
    return PhraseStats(
        occurrences=max(1, len(ends)),
        in_lead=sum(1 for e in ends if e <= end),
        length=len(text),
        lead_length=end,
    )


def phrase_scores(
    stats: Sequence[PhraseStats], *, avg_length: float, rows: int, matches: int
) -> list[float]:
    """BM25F scores of phrase hits (module doc), one per entry of ``stats``.

    Args:
        stats: One entry per hit.
        avg_length: Mean characters per row of the table.
        rows: Rows searched (the ``N`` of idf).
        matches: Rows holding the phrase (its document frequency).
    """
    if not stats:
        return []
    avg_lead = max(1.0, sum(s.lead_length for s in stats) / len(stats))
    avg_length = max(1.0, avg_length)
    idf = math.log(1.0 + (rows - matches + 0.5) / (matches + 0.5))
    out = []
    for s in stats:
        tf = LEAD_WEIGHT * s.in_lead / (1 - B + B * s.lead_length / avg_lead)
        tf += s.occurrences / (1 - B + B * s.length / avg_length)
        out.append(idf * tf / (K1 + tf))
    return out
