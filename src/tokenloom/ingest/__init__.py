"""Ingest: raw files (JSONL, Parquet, text directories) into rows of a tokenloom table.

Bad records never abort a run or take valid neighbours with them: each is written to a rejects
file with where it came from and why, and counted by reason; records kept after a documented
repair are counted as notes.
"""

from tokenloom.ingest.readers import ReadOptions
from tokenloom.ingest.rejects import Note, Reason, Reject
from tokenloom.ingest.run import FileReport, IngestResult, ingest, ingested_fingerprints

__all__ = [
    "FileReport",
    "IngestResult",
    "Note",
    "Reason",
    "ReadOptions",
    "Reject",
    "ingest",
    "ingested_fingerprints",
]
