"""The unigram entropy of a token column: the loss of the best model that ignores context.

A language model's cross-entropy (nats per token) is only interesting below this line: a model
that learned token frequencies and nothing else reaches it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["unigram_entropy"]


def unigram_entropy(
    table,
    token_column: str = "input_ids",
    *,
    filter: str | None = None,
    vocab_size: int | None = None,
) -> tuple[float, int]:  # noqa: ANN001
    """Entropy in nats of the token distribution of the selected rows, and the token count.

    Args:
        table: A table URI/path or :class:`tokenloom.table.Table`.
        token_column: The list column of token ids.
        filter: SQL selecting rows (``None``: all).
        vocab_size: Size of the id space (default: the largest id + 1).
    """
    from tokenloom.table import Table
    from tokenloom.table.filters import validate_filter
    from tokenloom.table.tokens import token_lists

    tbl = table if isinstance(table, Table) else Table.open(str(table))
    counts = np.zeros(vocab_size or 0, dtype=np.int64)
    filter = validate_filter(tbl.dataset, filter)
    scanner = tbl.dataset.scanner(columns=[token_column], filter=filter, batch_size=8192)
    for batch in scanner.to_batches():
        ids = token_lists(batch.column(0), batch.schema.field(0)).used
        if not len(ids):
            continue
        binc = np.bincount(ids, minlength=len(counts))
        if len(binc) > len(counts):
            counts = np.pad(counts, (0, len(binc) - len(counts)))
        counts += binc
    total = int(counts.sum())
    if not total:
        return float("nan"), 0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum()), total
