"""Ingest: raw files (JSONL, Parquet, text directories, Lance datasets) into rows of a tokenloom
table; :func:`adopt` brings a Lance dataset under tokenloom (a copy, or in place).

Bad records never abort a run or take valid neighbours with them: each is written to a rejects
file with where it came from and why, and counted by reason; records kept after a documented
repair are counted as notes.
"""

from tokenloom.ingest.adopt import AdoptError, AdoptResult, adopt
from tokenloom.ingest.readers import ReadOptions
from tokenloom.ingest.rejects import Note, Reason, Reject
from tokenloom.ingest.run import FileReport, IngestResult, ingest, ingested_fingerprints

__all__ = [
    "AdoptError",
    "AdoptResult",
    "adopt",
    "FileReport",
    "IngestResult",
    "Note",
    "Reason",
    "ReadOptions",
    "Reject",
    "ingest",
    "ingested_fingerprints",
]
