"""Commits racing on a real S3 server: ingests and backfills of one table all land, ids unique.

Lance commits with a conditional PUT (``If-None-Match: *``); SeaweedFS honours it, so a loser
sees the conflict and tokenloom re-reads the new version and retries (ids assigned at commit).
"""

from __future__ import annotations

import json
import threading

import numpy as np

from tests.backfill.udfs import n_words, slow_upper
from tests.conftest import real_paragraphs
from tests.s3.conftest import put_object
from tokenloom.backfill import add_column
from tokenloom.ingest import ingest
from tokenloom.table import Table


def _race(fns) -> list:
    """Run every function at once (released together) and return their results, in order."""
    barrier = threading.Barrier(len(fns))
    out: list = [None] * len(fns)
    errors: list = []

    def go(i, fn):
        barrier.wait()
        try:
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_eight_ingests_racing_on_s3_all_land_with_unique_ids(s3_server, s3_prefix):
    so = s3_server.storage_options
    paras = real_paragraphs(80)
    table = f"{s3_prefix}/t.lance"
    inputs = []
    for k in range(8):
        uri = f"{s3_prefix}/in/{k}.jsonl"
        lines = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in paras[k::8])
        put_object(s3_server, uri, lines)
        inputs.append(uri)
    results = _race(
        [lambda uri=uri: ingest([uri], table, storage_options=so, progress=False) for uri in inputs]
    )
    assert sorted(r.version for r in results) == sorted({r.version for r in results})
    data = Table.open(table, storage_options=so).dataset.to_table(columns=["id", "text"])
    ids = np.sort(data.column("id").to_numpy())
    assert ids.tolist() == list(range(80))  # all landed, unique, dense
    assert sorted(data.column("text").to_pylist()) == sorted(paras)
    for r in results:  # each run's ids are the ones it reports
        assert r.last_id - r.first_id + 1 == r.rows_written == 10


def test_two_backfills_racing_on_s3_both_commit(s3_server, s3_prefix):
    so = s3_server.storage_options
    paras = real_paragraphs(40)
    table = f"{s3_prefix}/t.lance"
    lines = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in paras)
    put_object(s3_server, f"{s3_prefix}/in.jsonl", lines)
    ingest([f"{s3_prefix}/in.jsonl"], table, storage_options=so, progress=False)
    handle = Table.open(table, storage_options=so)
    a, b = _race(
        [
            lambda: add_column(handle, None, n_words, workers=0, unit_rows=8, progress=False),
            lambda: add_column(handle, None, slow_upper, workers=0, unit_rows=8, progress=False),
        ]
    )
    assert a.version != b.version
    data = handle.checkout().dataset.to_table(columns=["id", "text", "n_words", "n_upper"])
    assert data.column("n_words").to_pylist() == [len(t.split()) for t in data["text"].to_pylist()]
    assert data.column("n_upper").to_pylist() == [
        sum(c.isupper() for c in t) for t in data["text"].to_pylist()
    ]
    jobs = {name for name in _names(f"{table}/_tokenloom/backfill", so)}
    assert any(j.startswith("n_words-") for j in jobs) and any(
        j.startswith("n_upper-") for j in jobs
    )


def _names(uri, so):
    from tokenloom.table.storage import list_names

    return list_names(uri, so)
