"""Run tags on an ``s3://`` table: a run pins a version, ``info`` and ``gc`` list the pin, the
pin is idempotent, and releasing it works through the object store."""

from __future__ import annotations

import json

from tests.conftest import real_paragraphs
from tests.s3.conftest import invoke_ok, jsonl_bytes, put_object, so_args
from tokenloom.table import Table
from tokenloom.table.tags import pin_version, release_run, table_pins


def test_a_run_pins_and_releases_a_version_of_an_s3_table(s3_server, s3_prefix, bare_cwd):
    so = so_args(s3_server)
    raw = f"{s3_prefix}/raw/a.jsonl"
    put_object(s3_server, raw, jsonl_bytes([{"text": t} for t in real_paragraphs(12)]))
    table = f"{s3_prefix}/t.lance"
    invoke_ok(["ingest", raw, "--table", table, *so])
    opts = s3_server.storage_options
    version = Table.open(table, storage_options=opts).version
    run = str(bare_cwd / "runs" / "a")
    pin = pin_version(table, version, run, storage_options=opts)
    assert pin_version(table, version, run, storage_options=opts) == pin  # idempotent
    info = json.loads(invoke_ok(["info", "--table", table, "--json", *so]))
    assert info["pins"] == [pin.to_json()] and pin.run == run
    assert json.loads(invoke_ok(["gc", "--table", table, "--json", *so]))["pins"] == info["pins"]
    released, kept = release_run(table, run, storage_options=opts)
    assert released == [pin] and kept == []
    assert table_pins(Table.open(table, storage_options=opts)) == []
    assert list(bare_cwd.iterdir()) == []  # nothing written beside the current directory
