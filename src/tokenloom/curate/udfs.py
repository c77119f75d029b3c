"""The curation functions as backfill UDFs (module level, so workers import them by name).

Per-row work (hashes, signatures, scores) runs in the backfill engine's workers. Global results
(duplicate flags, clusters) are computed once by the job and handed to the ``Lookup`` UDF through
a results file, whose path is run-time plumbing (an ``_``-argument, not part of the identity).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from tokenloom.backfill import udf
from tokenloom.curate.minhash import MinHashConfig, minhash_signatures
from tokenloom.curate.normalize import text_hashes
from tokenloom.curate.quality import quality_scores
from tokenloom.table.storage import is_remote, read_bytes, write_bytes

__all__ = ["TextHash", "MinHash", "Quality", "ExactLookup", "NearLookup", "write_lookup"]


@udf(inputs=["text"], output=pa.field("text_hash", pa.binary(16)), version="nfc-ws-blake2b16-1")
def TextHash(batch: pa.RecordBatch) -> pa.Array:  # noqa: N802 - a UDF reads like a column
    """16-byte BLAKE2b of the normalised text (NFC, whitespace collapsed)."""
    return text_hashes(batch.column("text"))


@udf(
    inputs=["text"],
    output=pa.field("minhash", pa.list_(pa.uint32(), 128)),
    version="1",
    batch_size=256,
)
class MinHash:
    """MinHash signature per document (see :class:`~tokenloom.curate.MinHashConfig`)."""

    def __init__(
        self, num_perm: int = 128, ngram: int = 3, fold: str = "skeleton", seed: int = 1
    ) -> None:
        from tokenloom.curate.shingle import Fold

        self.config = MinHashConfig(num_perm=num_perm, ngram=ngram, fold=Fold(fold), seed=seed)

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        sig = minhash_signatures(batch.column("text"), self.config)
        flat = pa.array(sig.reshape(-1), type=pa.uint32())
        return pa.FixedSizeListArray.from_arrays(flat, self.config.num_perm)


@udf(
    inputs=["text"],
    output={"quality": pa.float32(), "quality_reasons": pa.list_(pa.string())},
    version="gopher-c4-1",
    batch_size=512,
)
def Quality(batch: pa.RecordBatch) -> dict:  # noqa: N802
    """Heuristic quality in [0, 1] (fraction of applicable rules passed) and the failed rules."""
    quality, reasons = quality_scores(batch.column("text"))
    return {"quality": pa.array(quality, pa.float32()), "quality_reasons": reasons}


def write_lookup(
    path: str,
    ids: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Write a sorted ``id -> values`` table for :class:`Lookup` UDFs (a path or an
    object-store URI)."""
    order = np.argsort(ids, kind="stable")
    table = pa.table({"id": ids[order], **{k: v[order] for k, v in columns.items()}})
    if is_remote(path):
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        write_bytes(path, sink.getvalue().to_pybytes(), storage_options)
        return
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


class _Lookup:
    def __init__(self, _path: str, _storage_options: Mapping[str, str] | None = None) -> None:
        if is_remote(_path):
            data = read_bytes(_path, _storage_options)
            table = ipc.open_file(pa.BufferReader(data)).read_all()
        else:
            with pa.memory_map(_path) as source:
                table = ipc.open_file(source).read_all()
        self.ids = table.column("id").to_numpy()
        self.columns = {n: table.column(n).to_numpy() for n in table.schema.names if n != "id"}

    def __call__(self, batch: pa.RecordBatch) -> dict:
        want = batch.column("id").to_numpy()
        pos = np.searchsorted(self.ids, want)
        if len(want) and (pos.max() >= len(self.ids) or (self.ids[pos] != want).any()):
            missing = want[
                (pos >= len(self.ids)) | (self.ids[np.minimum(pos, len(self.ids) - 1)] != want)
            ]
            raise KeyError(f"rows {missing[:5].tolist()} are not in the lookup results")
        return {name: col[pos] for name, col in self.columns.items()}


@udf(inputs=["id"], output={"is_dup": pa.bool_(), "dup_of": pa.int64()}, version="exact-1")
class ExactLookup(_Lookup):
    """Exact-duplicate flags computed by the dedup job (first occurrence by id is kept)."""


@udf(
    inputs=["id"],
    output={"near_dup_cluster": pa.int64(), "is_near_dup": pa.bool_()},
    version="near-1",
)
class NearLookup(_Lookup):
    """Near-duplicate clusters computed by the dedup job (the row kept by the recorded ``keep``
    policy, :mod:`tokenloom.curate.keep`, names its cluster)."""

    def __init__(
        self,
        _path: str,
        threshold: float = 0.5,
        minhash: str = "",
        keep: str = "first",
        _storage_options: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(_path, _storage_options)
