"""Backfills on a real two-node Ray cluster against a table on a real S3 server.

The head and a second node (``ray start --address``) run on this machine but share nothing the
backfill uses: the table, the unit results and the job record live on the S3 server, and the
driver (the CLI, in a process of its own with an empty working directory) connects by address.
Every unit reports the Ray node that ran it; a UDF asking for a custom resource only one node
has runs only there; a request no node can meet is refused at once instead of hanging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.backfill.udfs import slow_upper
from tests.conftest import real_paragraphs, write_jsonl
from tests.s3.conftest import so_args
from tests.s3.raycluster import start_cluster
from tokenloom.backfill import add_column
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.storage import list_names

pytest.importorskip("ray")

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cluster():
    started = time.perf_counter()
    cluster = start_cluster({"head": {"tokenloom_test_head": 1}, "b": {"tokenloom_test_b": 1}})
    try:
        print(f"ray cluster of 2 nodes started in {time.perf_counter() - started:.1f} s")
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.pids(), "ray processes outlived the test"


def _backfill(cluster, s3_server, table, cwd, *args: str) -> subprocess.CompletedProcess:
    """``tokenloom backfill run --executor ray`` in a process of its own (its own Ray driver)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))},
        **cluster.env,
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "src")]),
        "XDG_CACHE_HOME": str(cwd.parent / "cache"),  # the job lock, off the home directory
    }
    cmd = [
        sys.executable, "-m", "tokenloom.cli.main", "backfill", "run", "--table", table,
        "--executor", "ray", "--ray-address", cluster.address, "--workers", "2",
        "--unit-rows", "10", "--json", *so_args(s3_server), *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _ok(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_backfill_runs_on_both_nodes_through_the_object_store(
    cluster, s3_server, s3_prefix, tmp_path
):
    so = s3_server.storage_options
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"text": t} for t in real_paragraphs(80)])
    table = f"{s3_prefix}/t.lance"
    ingest([src], table, storage_options=so, progress=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    started = time.perf_counter()
    # a Python UDF: pyarrow's utf8_split_whitespace (n_words) counts the pieces of a text ending
    # in "\n    " as 6 or 7 from one worker process to another, so its columns can differ
    res = _ok(_backfill(cluster, s3_server, table, cwd, "--udf", "tests.backfill.udfs:slow_upper"))
    print(f"n_upper on 2 ray nodes: {time.perf_counter() - started:.1f} s")
    assert res["rows"] == 80 and res["units"] >= 8
    assert len(res["nodes"]) == 2 and sum(res["nodes"].values()) == res["units"], res["nodes"]

    # every row's value says which node computed it: both did
    tags = _ok(_backfill(cluster, s3_server, table, cwd, "--udf", "tests.backfill.udfs:ran_on"))
    assert len(tags["nodes"]) == 2

    # a UDF asking for a resource only node b has runs only there
    only_b = _ok(_backfill(cluster, s3_server, table, cwd, "--udf", "tests.backfill.udfs:ran_on_b"))
    assert len(only_b["nodes"]) == 1 and only_b["units"] >= 8

    handle = Table.open(table, storage_options=so)
    add_column(handle, "n_upper_local", slow_upper, workers=0, progress=False)  # a local run
    data = handle.checkout().dataset.to_table(
        columns=["id", "n_upper", "n_upper_local", "ran_on", "ran_on_b"]
    )
    assert data.column("n_upper").to_pylist() == data.column("n_upper_local").to_pylist()
    assert set(data.column("ran_on").to_pylist()) == {"head", "b"}
    assert set(data.column("ran_on_b").to_pylist()) == {"b"}

    # nothing on any local disk: results and job records went through the bucket
    assert os.listdir(cwd) == []
    jobs = list_names(f"{table}/_tokenloom/backfill", so)
    assert {j.split("-")[0] for j in jobs} >= {"n_upper", "ran_on", "ran_on_b"}
    for job in jobs:
        assert list_names(f"{table}/_tokenloom/backfill/{job}/units", so) == []  # cleared


def test_a_request_no_node_can_meet_is_refused(cluster, s3_server, s3_prefix, tmp_path):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"text": t} for t in real_paragraphs(10)])
    table = f"{s3_prefix}/t.lance"
    ingest([src], table, storage_options=s3_server.storage_options, progress=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = ["--udf", "tests.backfill.udfs:n_words", "--resources", '{"tokenloom_test_b": 2}']
    proc = _backfill(cluster, s3_server, table, cwd, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "asks Ray for CPU=1, tokenloom_test_b=2 per unit" in proc.stderr
    assert "its 2 node(s)" in proc.stderr
