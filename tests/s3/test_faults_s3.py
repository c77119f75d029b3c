"""Through a proxy adding 20 ms latency and failing 1% of requests (503, resets before and after
the server acted, truncated bodies): the loader's stream equals the local table's, a backfill's
column equals the local one, and every commit lands exactly once."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pytest

from tests.backfill.udfs import n_words
from tests.conftest import real_paragraphs
from tests.verify.tables import gpt2_table
from tokenloom.backfill import add_column
from tokenloom.dev.proxy import FaultProxy
from tokenloom.table import Table
from tokenloom.table.storage import filesystem

pytest.importorskip("torch")


def _upload(local: str, uri: str, so: dict) -> None:
    fs, path = filesystem(uri, so)
    pafs.copy_files(local, path, destination_filesystem=fs)


def _stream(table: str, so: dict | None, steps: int) -> list[dict]:
    from tokenloom.loader import PackedDataset

    ds = PackedDataset(table, seq_len=32, global_batch=4, seed=3, storage_options=so)
    out = []
    for i, batch in enumerate(ds):
        if i == steps:
            break
        out.append({k: np.asarray(batch[k]) for k in ("input_ids", "labels", "spans")})
    return out


def test_loader_and_backfill_through_latency_and_faults(s3_server, s3_prefix, tmp_path):
    local = gpt2_table(tmp_path, real_paragraphs(60))
    remote = f"{s3_prefix}/t.lance"
    _upload(local, remote, s3_server.storage_options)
    expected = _stream(local, None, steps=12)
    before = Table.open(remote, storage_options=s3_server.storage_options).latest_version

    with FaultProxy(
        s3_server.endpoint[len("http://") :], latency_ms=20, fault_rate=0.01, seed=7
    ) as proxy:
        so = proxy.storage_options(s3_server.storage_options)
        got = _stream(remote, so, steps=12)
        res = add_column(
            Table.open(remote, storage_options=so), None, n_words, workers=0, unit_rows=8,
            progress=False,
        )  # fmt: skip
    assert len(got) == len(expected) == 12
    for a, b in zip(got, expected, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])

    table = Table.open(remote, storage_options=s3_server.storage_options)
    assert res.version == before + 1 == table.latest_version  # one commit, neither lost nor doubled
    assert [v.operation for v in table.versions()][-1] == "backfill"
    add_column(local, None, n_words, workers=0, unit_rows=8, progress=False)
    want = Table.open(local).dataset.to_table(columns=["id", "n_words"])
    assert table.dataset.to_table(columns=["id", "n_words"]).equals(want)  # the same column
    assert proxy.requests > 100, proxy.requests
    print("proxy:", proxy.requests, "requests,", dict(proxy.faults), "faults")


def test_commits_land_exactly_once_when_responses_are_lost(s3_server, s3_prefix):
    """A fifth of the requests fail, half of them *after* the server acted (a commit stored,
    its response lost): each ingest still commits exactly once, with its rows once."""
    import json

    from tests.s3.conftest import put_object
    from tokenloom.ingest import ingest

    paras = real_paragraphs(30)
    inputs = []
    for k in range(3):
        uri = f"{s3_prefix}/in/{k}.jsonl"
        put_object(
            s3_server, uri, "".join(json.dumps({"text": t}) + "\n" for t in paras[k::3]).encode()
        )
        inputs.append(uri)
    table = f"{s3_prefix}/t.lance"
    kinds = ("reset_after", "reset_after", "503", "reset_before")
    with FaultProxy(s3_server.endpoint[7:], fault_rate=0.2, kinds=kinds, seed=11) as proxy:
        so = proxy.storage_options(s3_server.storage_options)
        for uri in inputs:
            ingest([uri], table, storage_options=so, progress=False)
    t = Table.open(table, storage_options=s3_server.storage_options)
    ops = [v.operation for v in t.versions()]
    assert ops.count("ingest") == 3, ops
    ids = np.sort(t.dataset.to_table(columns=["id"]).column("id").to_numpy())
    assert ids.tolist() == list(range(30))
    assert proxy.faults["reset_after"] > 0, proxy.faults
    print("proxy:", proxy.requests, "requests,", dict(proxy.faults), "faults")


def test_a_store_gone_mid_tokenize_is_status_1_naming_it_and_the_rerun_completes(
    s3_server, s3_prefix, tmp_path
):
    """The store goes away while ``tokenize`` runs (its proxy is closed: connections refused):
    exit 1 naming the endpoint, not 70; the table is unchanged and readable; the same command
    run again against the store completes."""
    import json
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, write_jsonl
    from tests.s3.conftest import so_args
    from tokenloom.ingest import ingest

    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in real_paragraphs(120)])
    table = f"{s3_prefix}/t.lance"
    version = ingest(
        [tmp_path / "a.jsonl"], table, storage_options=s3_server.storage_options, progress=False
    ).version
    args = ["tokenize", "--table", table, "--tokenizer", "gpt2", "--workers", "0", "--json"]
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # as tests.conftest.run_cli
    cmd = [sys.executable, "-m", "tokenloom.cli.main", *args]
    with FaultProxy(s3_server.endpoint[len("http://") :], latency_ms=5) as proxy:
        so = proxy.storage_options(s3_server.storage_options)
        proc = subprocess.Popen(
            [*cmd, *(f"--storage-options={k}={v}" for k, v in so.items())],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while proxy.requests < 25 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the table is open and the backfill under way
        assert proc.poll() is None, proc.communicate()
    _, err = proc.communicate(timeout=120)  # the proxy is closed: its port refuses
    assert proc.returncode == 1, err
    assert f"the object store at {proxy.endpoint} could not be reached" in err
    assert "run the same command again" in err and "please report" not in err
    after = Table.open(table, storage_options=s3_server.storage_options)
    assert after.latest_version == version and after.count_rows() == 120
    rerun = subprocess.run(
        [*cmd, *so_args(s3_server)], capture_output=True, text=True, env=env, timeout=120
    )
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["rows"] == 120
    done = Table.open(table, storage_options=s3_server.storage_options)
    assert done.latest_version == version + 1 and done.count_rows("n_tokens > 0") == 120
