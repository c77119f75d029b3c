"""Ingest behaviour: versions, dense ids, fingerprints, formats, crashes and concurrency."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import write_jsonl
from tokenloom.ingest import ingest, ingested_fingerprints
from tokenloom.table import Table


def _texts(uri) -> list[str]:
    t = Table.open(uri).dataset.to_table(columns=["id", "text"]).sort_by("id")
    return t["text"].to_pylist()


def test_appends_make_one_version_each_and_ids_continue(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:30]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": p} for p in paragraphs[30:50]])
    r1 = ingest([tmp_path / "a.jsonl"], uri, progress=False)
    r2 = ingest([tmp_path / "b.jsonl"], uri, progress=False)
    assert (r1.version, r1.first_id, r1.last_id) == (2, 0, 29)
    assert (r2.version, r2.first_id, r2.last_id) == (3, 30, 49)
    assert _texts(uri) == paragraphs[:50]
    fps = ingested_fingerprints(Table.open(uri))
    assert sorted(fps.values()) == [20, 30]  # fingerprint -> records of that file


def test_reingest_is_skipped_unless_forced(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:5]])
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    # The same content under another name is the same file.
    (tmp_path / "copy.jsonl").write_bytes((tmp_path / "a.jsonl").read_bytes())
    again = ingest([tmp_path / "a.jsonl", tmp_path / "copy.jsonl"], uri, progress=False)
    assert again.version is None and again.rows_written == 0
    assert len(again.skipped_files) == 2
    assert Table.open(uri).latest_version == 2
    forced = ingest([tmp_path / "a.jsonl"], uri, force=True, progress=False)
    assert forced.version == 3 and forced.rows_written == 5
    assert _texts(uri) == paragraphs[:5] * 2


def test_source_meta_and_formats(tmp_path, paragraphs):
    write_jsonl(
        tmp_path / "web.jsonl",
        [
            {"text": paragraphs[0], "source": "wiki", "title": "T0", "id": "orig-7"},
            {"text": paragraphs[1], "url": "https://example.org/x"},
            {"text": paragraphs[2], "source": 17},  # unusable source: file stem, value kept in meta
        ],
    )
    pq.write_table(
        pa.table({"content": paragraphs[3:5], "source": ["books", None]}), tmp_path / "b.parquet"
    )
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "n1.txt").write_text(paragraphs[5])
    uri = tmp_path / "t.lance"
    ingest([tmp_path / "web.jsonl"], uri, progress=False)
    ingest([tmp_path / "b.parquet"], uri, text_field="content", progress=False)
    ingest([tmp_path / "notes"], uri, progress=False)
    ingest([tmp_path / "notes"], uri, source="forced", force=True, progress=False)
    rows = Table.open(uri).dataset.to_table().sort_by("id").to_pylist()
    assert [r["source"] for r in rows] == ["wiki", "web", "web", "books", "b", "notes", "forced"]
    metas = [json.loads(r["meta"]) for r in rows]
    assert metas[0] == {"title": "T0", "id": "orig-7", "_file": "web.jsonl", "_line": 1}
    assert metas[1]["url"] == "https://example.org/x"
    assert metas[2]["source"] == 17
    assert metas[3] == {"_file": "b.parquet", "_row": 0}
    assert metas[5] == {"_file": "n1.txt"}
    assert [r["text"] for r in rows] == paragraphs[:6] + [paragraphs[5]]


_STUCK_INGEST = """
import sys, time
from tokenloom.table import append
from tokenloom.ingest import ingest

def stuck(self, **kwargs):  # everything is written; the commit never comes
    print("staged", flush=True)
    time.sleep(3600)

append.StagedRows.commit = stuck
ingest(sys.argv[1:-1], sys.argv[-1], progress=False)
"""


def _files_under(path) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, f), path) for d, _, names in os.walk(path) for f in names
    }


def test_killed_ingest_leaves_table_readable_and_rerun_cleans_its_files(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    write_jsonl(tmp_path / "first.jsonl", [{"text": p} for p in paragraphs[:10]])
    ingest([tmp_path / "first.jsonl"], uri, progress=False)
    before = _files_under(uri)
    n_big = 3000
    write_jsonl(
        tmp_path / "big.jsonl", [{"text": f"{paragraphs[i % 200]} #{i}"} for i in range(n_big)]
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_INGEST, str(tmp_path / "big.jsonl"), str(uri)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "staged"
        assert len(_files_under(uri) - before) >= 3, "the run wrote no file"  # journal, data, list
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    table = Table.open(uri)
    assert table.latest_version == 2 and table.count_rows() == 10  # the old state, readable
    result = ingest([tmp_path / "big.jsonl"], uri, progress=False)
    assert result.rows_written == n_big and result.version == 3
    assert (result.first_id, result.last_id) == (10, 10 + n_big - 1)
    assert result.orphans_removed >= 2  # its data file and its list of files read
    # Every data file left is one a version references: nothing of the killed run remains.
    ds = Table.open(uri).dataset
    referenced = {
        f.path
        for v in (2, 3)
        for fr in ds.checkout_version(v).get_fragments()
        for f in fr.metadata.files
    }
    assert _files_under(uri / "data") == referenced
    assert os.listdir(uri / "_tokenloom" / "runs") == []
    listed = json.loads(Table.open(uri).metadata()["tokenloom.ingest_files"])
    assert sorted(os.listdir(uri / "_tokenloom" / "ingests")) == sorted(
        os.path.basename(p) for p in listed
    )


_CONCURRENT = """
import sys
from tokenloom.ingest import ingest
r = ingest([sys.argv[1]], sys.argv[2], progress=False)
print(r.first_id, r.last_id)
"""


def test_concurrent_ingests_get_disjoint_dense_ids(tmp_path, paragraphs):
    uri = tmp_path / "t.lance"
    files = []
    for k in range(3):
        path = tmp_path / f"part{k}.jsonl"
        write_jsonl(path, [{"text": f"{p} (part {k})"} for p in paragraphs[: 40 + 10 * k]])
        files.append(path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT, str(f), str(uri)], stdout=subprocess.PIPE, text=True
        )
        for f in files
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    table = Table.open(uri)
    ids = sorted(table.dataset.to_table(columns=["id"])["id"].to_pylist())
    assert ids == list(range(40 + 50 + 60))
    assert [v.operation for v in table.versions()] == ["create", "ingest", "ingest", "ingest"]
