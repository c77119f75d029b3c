"""A record's own ``_file`` / ``_line`` / ``_row`` / ``_split`` fields are kept; ingest's
provenance goes under the name with one more leading ``_``, counted as a note (one rule for
JSONL, Parquet, text files and Hugging Face folders)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import run_cli, write_jsonl
from tokenloom.table import Table


def _metas(uri: str) -> list[dict]:
    data = Table.open(uri).dataset.to_table(columns=["id", "meta"]).sort_by("id")
    return [json.loads(m) for m in data.column("meta").to_pylist()]


def test_the_records_own_provenance_fields_are_kept(tmp_path, paragraphs):
    write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"text": paragraphs[0], "_file": "crawl/part-7.warc", "_line": 912},
            {"text": paragraphs[1], "_line": 3, "__line": "also mine"},
            {"text": paragraphs[2], "url": "u"},
        ],
    )
    pq.write_table(
        pa.table({"text": paragraphs[3:5], "_row": [40, 41], "_file": ["s.arrow", None]}),
        tmp_path / "b.parquet",
    )
    uri = str(tmp_path / "t.lance")
    out = run_cli("ingest", str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet"),
                  "--table", uri, "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["rows_written"] == 5 and res["rejected"] == {}
    assert res["notes"] == {"provenance_renamed": 4}  # every record whose field was kept
    metas = _metas(uri)
    assert metas[0] == {
        "_file": "crawl/part-7.warc", "_line": 912, "__file": "a.jsonl", "__line": 1,
    }  # fmt: skip
    assert metas[1] == {"_line": 3, "__line": "also mine", "_file": "a.jsonl", "___line": 2}
    assert metas[2] == {"url": "u", "_file": "a.jsonl", "_line": 3}
    assert metas[3] == {"_row": 40, "_file": "s.arrow", "__file": "b.parquet", "__row": 0}
    assert metas[4] == {"_row": 41, "_file": None, "__file": "b.parquet", "__row": 1}
