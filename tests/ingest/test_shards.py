"""A directory of Parquet / JSONL shards selected with ``--glob`` is read as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_a_glob_of_parquet_and_jsonl_shards_is_read_as_rows(tmp_path: Path) -> None:
    shards = tmp_path / "data"
    (shards / "more").mkdir(parents=True)
    for k in range(3):
        pq.write_table(
            pa.table({"text": [f"shard {k} row {i}" for i in range(5)]}),
            shards / f"part-{k}.parquet",
        )
    write_jsonl(shards / "more" / "x.jsonl", [{"text": f"json row {i}"} for i in range(4)])
    (shards / "README.txt").write_text("not selected")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    uri = str(tmp_path / "t.lance")
    out = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", "ingest", str(shards), "--glob",
         "**/*.parquet", "--table", uri, "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["rows_written"] == 15 and res["rejected"] == {}
    out = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", "ingest", str(shards), "--glob",
         "**/*.jsonl", "--table", uri, "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and json.loads(out.stdout)["rows_written"] == 4
