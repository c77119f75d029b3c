"""A table URI is a plain path or a well-formed URI: ``file:/abs/t.lance`` (one slash) once made
``./file:/abs/t.lance`` in the current directory without a word."""

from __future__ import annotations

import os

import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.loader.plan.spec import LoaderSpec, absolute_uri
from tokenloom.table import Table, normalize_uri
from tokenloom.table.storage import StorageError, check_uri

MALFORMED = [
    ("file:/abs/t.lance", "write `file:///abs/t.lance` or `/abs/t.lance`"),
    ("file:abs/t.lance", "'file:' must be followed by '//'"),
    ("s3:/bucket/t.lance", "write `s3://bucket/t.lance`"),
    ("s3:bucket/t.lance", "write `s3://bucket/t.lance`"),
    ("gs:/b/t", "write `gs://b/t`"),
    ("S3:/b/t", "write `S3://b/t`"),
    ("s3://", "names no bucket"),
    ("s3:///t.lance", "names no bucket"),
    ("az://", "names no bucket"),
    ("file://", "names no path"),
    ("file://host/t.lance", "names the host 'host'"),
    ("myscheme:relative", "or `./myscheme:relative` for a local name holding a colon"),
]
WELL_FORMED = [
    "file:///abs/t.lance",
    "file://localhost/abs/t.lance",
    "/abs/t.lance",
    "rel/t.lance",
    "./a:b.lance",
    "s3://bucket/p",
    "s3a://bucket/p",
    "gs://bucket/p",
    "az://container/p",
    "memory://",
    "memory://t",
]


@pytest.mark.parametrize(("uri", "says"), MALFORMED)
def test_a_malformed_uri_is_refused_by_every_normaliser(uri, says):
    for normalise in (check_uri, normalize_uri, absolute_uri):
        with pytest.raises(StorageError) as err:
            normalise(uri)
        assert says in str(err.value) and repr(uri) in str(err.value)
    with pytest.raises(StorageError, match="not a well-formed URI|names no|names the host"):
        LoaderSpec(table=uri, seq_len=8)


@pytest.mark.parametrize("uri", WELL_FORMED)
def test_well_formed_uris_and_paths_pass(uri):
    assert check_uri(uri) == uri
    assert absolute_uri(uri) == (uri if "://" in uri else os.path.abspath(uri))
    if uri.startswith("file://"):
        assert normalize_uri(uri) == "/abs/t.lance"


def test_a_file_uri_with_three_slashes_opens_the_table(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in real_paragraphs(3)])
    out = tmp_path / "t.lance"
    ingest([tmp_path / "a.jsonl"], f"file://{out}", progress=False)
    assert Table.open(str(out)).count_rows() == 3


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (["ingest", "{src}", "--table"], "file:{tmp}/t.lance"),
        (["info", "--table"], "s3://"),
        (["stats", "--table"], "s3:/bucket/t.lance"),
        (["train", "--out", "{tmp}/run", "--table"], "file:{tmp}/t.lance"),
    ],
)
def test_every_command_refuses_a_malformed_table_uri_as_a_usage_error(tmp_path, args, bad):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in real_paragraphs(3)])
    fill = {"src": str(tmp_path / "a.jsonl"), "tmp": str(tmp_path)}
    bad = bad.format(**fill)
    proc = run_cli(*[a.format(**fill) for a in args], bad, cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"Invalid value for '--table': {bad!r}" in proc.stderr
    assert "unexpected error" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]  # nothing created, no ./file: folder
