"""Ingest: raw files (JSONL, Parquet, text directories) into rows of a tokenloom table.

Bad records never abort a run or take valid neighbours with them: each is written to a rejects
file with where it came from and why, and counted by reason.
"""

from tokenloom.ingest.readers import ReadOptions
from tokenloom.ingest.rejects import Reason, Reject
from tokenloom.ingest.run import FileReport, IngestResult, ingest, ingested_fingerprints

__all__ = [
    "FileReport",
    "IngestResult",
    "Reason",
    "ReadOptions",
    "Reject",
    "ingest",
    "ingested_fingerprints",
]
