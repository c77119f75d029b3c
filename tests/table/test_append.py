"""Id assignment at commit time: one identity per table, ids never duplicated or reused."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading

import lance
import pyarrow as pa

from tests.conftest import write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.append import CONTENT_SCHEMA, StagedRows


def _ids(uri) -> list[int]:
    return sorted(Table.open(uri).dataset.to_table(columns=["id"])["id"].to_pylist())


def _batch(texts: list[str]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(texts, pa.large_string()),
            pa.array(["s"] * len(texts)),
            pa.array([len(t) for t in texts], pa.int64()),
            pa.array(["{}"] * len(texts)),
        ],
        schema=CONTENT_SCHEMA,
    )


def test_concurrent_cli_ingests_under_different_names_never_share_ids(tmp_path, paragraphs):
    real = tmp_path / "t.lance"
    Table.create(real)
    os.symlink(real, tmp_path / "link.lance")
    names = [str(real), f"file://{real}", str(tmp_path / "link.lance"), f"{tmp_path}/./t.lance"]
    sizes = [40, 50, 60, 70]
    procs = []
    for k, (name, n) in enumerate(zip(names, sizes, strict=True)):
        path = tmp_path / f"part{k}.jsonl"
        write_jsonl(path, [{"text": f"{p} (part {k})"} for p in paragraphs[:n]])
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tokenloom.cli.main",
                    "ingest",
                    str(path),
                    "--table",
                    name,
                    "--json",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    ranges = sorted((json.loads(o[0])["first_id"], json.loads(o[0])["last_id"]) for o in outs)
    assert ranges[0][0] == 0 and all(
        b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:], strict=False)
    )
    assert _ids(real) == list(range(sum(sizes)))  # all landed, unique and dense
    table = Table.open(real)
    assert [v.operation for v in table.versions()] == ["create"] + ["ingest"] * 4
    assert table.metadata()["tokenloom.next_id"] == str(sum(sizes))


def test_concurrent_threads_all_land_with_disjoint_ids(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    results, errors = [], []

    def run(k: int) -> None:
        path = tmp_path / f"t{k}.jsonl"
        write_jsonl(path, [{"text": f"{p} [{k}]"} for p in paragraphs[: 20 + k]])
        try:
            results.append(ingest([path], uri, progress=False))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert _ids(uri) == list(range(20 + 21 + 22 + 23))
    spans = [range(r.first_id, r.last_id + 1) for r in results]
    assert sum(len(s) for s in spans) == len({i for s in spans for i in s})


def test_a_commit_that_loses_a_race_retries_on_the_new_version(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:10]])
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[10:15]])
    staged = StagedRows(Table.open(uri))
    staged.write(_batch(["staged one", "staged two"]))
    raced = []

    def metadata(latest: dict[str, str]) -> dict[str, str]:
        if len(raced) == 0:  # between reading the version and committing: an ingest lands
            raced.append(ingest([tmp_path / "b.jsonl"], uri, progress=False))
        elif len(raced) == 1:  # then a backfill-like Merge adds a column
            ds = lance.dataset(str(uri))
            frags, schema = [], None
            for frag in ds.get_fragments():
                meta, schema = frag.merge_columns(
                    lambda b: pa.record_batch([pa.array([1] * b.num_rows)], names=["flag"]),
                    columns=["id"],
                )
                frags.append(meta)
            op = lance.LanceOperation.Merge(frags, schema)
            lance.LanceDataset.commit(str(uri), op, read_version=ds.version)
            raced.append("backfill")
        return {}

    committed, first = staged.commit(op="ingest", message="test", metadata=metadata)
    assert first == 15 and raced[0].first_id == 10  # re-based past the ingest that won
    assert raced[1] == "backfill" and committed.version == 5  # create, a, b, backfill, this
    rows = committed.dataset.to_table(columns=["id", "text", "flag"]).sort_by("id").to_pylist()
    assert [r["id"] for r in rows] == list(range(17))
    assert rows[-1] == {"id": 16, "text": "staged two", "flag": None}  # new rows: null column
    assert sum(r["flag"] == 1 for r in rows) == 15


def test_ids_and_fingerprints_survive_deletes_and_cleanup(tmp_path, paragraphs):
    uri = str(tmp_path / "t.lance")
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:10]])
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    ds = lance.dataset(uri)
    ds.delete("id >= 7")  # the newest ids must never come back
    ds = lance.dataset(uri)
    ds.cleanup_old_versions(older_than=dt.timedelta(0), delete_unverified=True)
    assert [v["version"] for v in lance.dataset(uri).versions()] == [3]  # history gone
    again = ingest([tmp_path / "a.jsonl"], uri, progress=False)
    assert again.version is None and again.skipped == 10  # the fingerprint is remembered
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[10:13]])
    result = ingest([tmp_path / "b.jsonl"], uri, progress=False)
    assert (result.first_id, result.last_id) == (10, 12)
    assert _ids(uri) == [0, 1, 2, 3, 4, 5, 6, 10, 11, 12]
