"""Near-dedup band partitions through an object store: the table's signatures are read from S3,
the partition files go under the table's prefix, workers are spawned processes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc

from tests.conftest import real_paragraphs
from tests.s3.conftest import invoke_ok, jsonl_bytes, put_object, so_args
from tokenloom.backfill.executors import LocalExecutor
from tokenloom.curate import lsh_clusters
from tokenloom.curate.bands import LanceSignatures, banded_clusters
from tokenloom.table import Table
from tokenloom.table.storage import list_names


def test_band_partitions_on_s3_equal_lsh_clusters(s3_server, s3_prefix, bare_cwd):
    paras = real_paragraphs(40)
    texts = paras + [p + " Edited." for p in paras[:10]] + [paras[3]]
    put_object(s3_server, f"{s3_prefix}/raw/a.jsonl", jsonl_bytes([{"text": t} for t in texts]))
    table = f"{s3_prefix}/corpus.lance"
    so = so_args(s3_server)
    invoke_ok(["ingest", f"{s3_prefix}/raw/a.jsonl", "--table", table, *so])
    out = json.loads(
        invoke_ok(["dedup", "--near", "--table", table, "--workers", "0", "--json", *so])
    )
    assert out["flagged"] >= 11 and out["clustering"]["passed"] >= 11

    t = Table.open(table, storage_options=s3_server.storage_options)
    data = t.dataset.to_table(columns=["id", "minhash", "near_dup_cluster"])
    ids = data.column("id").to_numpy()
    sig = pc.list_flatten(data.column("minhash")).to_numpy().reshape(len(ids), -1)
    work = f"{table}/_tokenloom/backfill/_near/test"
    source = LanceSignatures(t.uri, t.version, rows=len(ids), storage_options=t.storage_options)
    cluster, _, stats = banded_clusters(
        ids,
        source,
        workdir=work,
        executor=LocalExecutor(2),
        part_rows=20,  # three key partitions
        storage_options=t.storage_options,
    )
    np.testing.assert_array_equal(cluster, lsh_clusters(ids, sig)[0])
    np.testing.assert_array_equal(cluster, data.column("near_dup_cluster").to_numpy())
    assert list_names(work, t.storage_options) == []  # the partitions are deleted
