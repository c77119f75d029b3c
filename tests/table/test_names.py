"""Column names are validated up front, in the library and in every command that creates one."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from tests.conftest import run_cli, write_jsonl
from tokenloom.backfill import add_column, udf
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.names import MAX_COLUMN_NAME, ColumnNameError, validate_column_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BAD = [
    "",
    "../escape",
    "..",
    "a/b",
    "/abs",
    "a\\b",
    "a.b",
    "with space",
    "dash-ed",
    "9lives",
    "tab\tname",
    "new\nline",
    "é_accent",
    "semi;colon",
    "quote'd",
    "x" * (MAX_COLUMN_NAME + 1),
    "__tokenloom_tmp_x",
    "_rowid",
    "_row_created_at_version",
    "_distance",
]
GOOD = ["input_ids", "n_tokens_bpe16k", "_private", "Quality2", "x", "x" * MAX_COLUMN_NAME]


@pytest.mark.parametrize("name", BAD, ids=repr)
def test_bad_names_are_refused_with_the_rule(name):
    with pytest.raises(ColumnNameError) as err:
        validate_column_name(name)
    assert "\n" not in str(err.value).replace(repr(name), "")


@pytest.mark.parametrize("name", GOOD)
def test_plain_identifiers_pass(name):
    assert validate_column_name(name) == name


def test_non_text_is_refused():
    with pytest.raises(ColumnNameError, match="must be text"):
        validate_column_name(None)


@pytest.fixture
def table(tmp_path) -> str:
    write_jsonl(tmp_path / "a.jsonl", [{"text": f"doc {i}"} for i in range(5)])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    return uri


@udf(inputs=["text"], output={"../escape": pa.int64()}, version="1")
def escaping(batch):  # noqa: ANN001, ANN201
    return pa.array([1] * batch.num_rows, pa.int64())


@udf(inputs=["text"], output={"fine": pa.int64()}, version="1")
def fine(batch):  # noqa: ANN001, ANN201
    return pa.array([1] * batch.num_rows, pa.int64())


def _listing(uri: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(os.path.dirname(os.path.dirname(uri))):
        out += [os.path.join(dirpath, f) for f in files]
    return sorted(out)


def _nothing_written(uri: str, v0: int, before: list[str]) -> None:
    assert Table.open(uri).latest_version == v0
    assert _listing(uri) == before  # no checkpoint dir, nothing outside either


def test_add_column_refuses_a_bad_name_or_udf_output_before_any_work(table):
    v0, before = Table.open(table).version, _listing(table)
    with pytest.raises(ColumnNameError, match="output column of UDF escaping"):
        add_column(table, None, escaping, workers=0)
    with pytest.raises(ColumnNameError, match="looks like a path"):
        add_column(table, "../../x", fine, workers=0)
    with pytest.raises(ColumnNameError, match="nested fields"):
        add_column(table, "a.b", fine, workers=0)
    _nothing_written(table, v0, before)


_cli = run_cli


@pytest.mark.parametrize(
    "args",
    [
        # The UDF, tokenizer and model named here do not exist: the name is checked first.
        ["backfill", "run", "--udf", "no_such_module:f", "--column", "../x"],
        ["tokenize", "--tokenizer", "no-such-tokenizer", "--column", "a/b"],
        ["embed", "--column", "has space"],
    ],
    ids=["backfill", "tokenize", "embed"],
)
def test_every_command_creating_a_column_checks_its_name_first(table, args):
    v0, before = Table.open(table).version, _listing(table)
    proc = _cli(*args, "--table", table)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid "), proc.stderr
    assert "letters, digits and '_'" in lines[0]
    _nothing_written(table, v0, before)
