"""Reading the columns :func:`~tokenloom.stats.length_stats` needs, batch by batch.

A corpus has millions of rows: the counts are kept as one ``int64`` array and the source labels
as a dictionary (an ``int32`` code a row and the few distinct names), never as a Python string
per row, nor as a whole-table scan held twice while it is converted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["read_lengths"]


def read_lengths(
    ds: Any, count_column: str, filter: str | None
) -> tuple[np.ndarray, pa.DictionaryArray]:
    """The token count and source of every row under ``filter``, in scan order.

    Args:
        ds: A Lance dataset.
        count_column: The count column (``n_tokens``); a null count reads 0.
        filter: A SQL filter, or ``None`` for every row.

    Returns:
        ``(counts, sources)``: ``(N,) int64`` and a dictionary array of ``N`` labels (a null
        source reads ``"None"``).
    """
    counts: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    names: dict[str, int] = {}
    scanner = ds.scanner(columns=[count_column, "source"], filter=filter)
    for batch in scanner.to_batches():
        counts.append(pc.fill_null(batch.column(count_column), 0).to_numpy().astype(np.int64))
        source = pc.fill_null(batch.column("source").cast(pa.large_string()), "None")
        encoded = pc.dictionary_encode(source)
        local = [names.setdefault(v, len(names)) for v in encoded.dictionary.to_pylist()]
        index = encoded.indices.to_numpy(zero_copy_only=False)
        codes.append(np.asarray(local, dtype=np.int32)[index])
    all_counts = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    counts.clear()
    all_codes = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int32)
    codes.clear()
    labels = pa.array(list(names), type=pa.large_string())
    return all_counts, pa.DictionaryArray.from_arrays(pa.array(all_codes, pa.int32()), labels)
