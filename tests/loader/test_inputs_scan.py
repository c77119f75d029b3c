"""The plan inputs' scan: batch by batch, sorted by id only when the scan is not in id order."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa

from tokenloom.loader.pipeline.inputs import scan_plan_inputs


def _dataset(path, ids: np.ndarray, counts: list) -> lance.LanceDataset:
    tokens = [[1] * (c or 0) for c in counts]
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "input_ids": pa.array(tokens, pa.list_(pa.uint16())),
            "n_tokens": pa.array(counts, pa.int64()),
        }
    )
    return lance.write_dataset(table, str(path), max_rows_per_file=7, max_rows_per_group=3)


def _scan(ds, **kw):
    return scan_plan_inputs(
        ds, token_column="input_ids", count_column="n_tokens", filter=None, **kw
    )


def test_rows_out_of_id_order_are_sorted_with_their_counts_and_row_ids(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.permutation(40) * 3 + 5
    counts = [int(i % 11) for i in ids]
    ds = _dataset(tmp_path / "t.lance", ids, counts)
    got = _scan(ds)
    order = np.argsort(ids)
    assert np.asarray(got.row_ids).tolist() == ids[order].tolist()
    assert np.asarray(got.n_tokens).tolist() == np.asarray(counts)[order].tolist()
    rowids = ds.to_table(columns=["id"], with_row_id=True).column("_rowid").to_numpy()
    assert np.asarray(got.rowids).tolist() == rowids[order].tolist()


def test_rows_in_id_order_and_null_counts(tmp_path):
    ids = np.arange(20) * 2
    counts = [None if i % 5 == 0 else int(i) for i in range(20)]
    ds = _dataset(tmp_path / "t.lance", ids, counts)
    got = _scan(ds, allow_missing=True)
    assert np.asarray(got.row_ids).tolist() == ids.tolist()
    assert np.asarray(got.n_tokens).tolist() == [c or 0 for c in counts]
    assert got.null_rows == 4
