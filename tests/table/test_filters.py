"""Filters are validated before use: trailing text, unbalanced parentheses, unknown columns and
type errors are one-line errors, never a silently truncated filter, in every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.filters import FilterError, and_filters, check_structure, validate_filter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRAILING = [
    "id > 3 garbage",
    "id > 3) foo",
    "id > 3)",
    "(id > 3) foo (id)",
    "id > 3 LIMIT 2",
    "id > 3 ORDER BY id",
    "id > 3 as x",
    "NOT id > 3 x",
    "id > 3\n  AND also words",
    "id > 3; DROP TABLE t",
    "id > 3; id < 2",
]
UNBALANCED = ["(id > 3", "id IN (1, 2", "((id > 3)", "id > 3))", ")id > 3("]
BROKEN = ["id >", "", "   ", "-- only a comment", "id = 'open", "id > 3 /* open", "'text'", "id"]


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("filters")
    write_jsonl(tmp / "a.jsonl", [{"text": p, "source": "docs"} for p in real_paragraphs(20)])
    out = str(tmp / "t.lance")
    ingest([tmp / "a.jsonl"], out, progress=False)
    return out


def test_lance_itself_ignores_trailing_text(uri):
    """The behaviour this module exists for: if it changes, the check may be simplified."""
    ds = Table.open(uri).dataset
    assert ds.count_rows(filter="id > 3 garbage") == ds.count_rows(filter="id > 3") == 16
    assert ds.count_rows(filter="id > 3) foo") == 16


@pytest.mark.parametrize("sql", TRAILING + UNBALANCED + BROKEN)
def test_a_filter_that_is_not_one_whole_condition_is_an_error(uri, sql):
    ds = Table.open(uri).dataset
    with pytest.raises(FilterError) as err:
        validate_filter(ds, sql)
    message = str(err.value)
    assert message.startswith("invalid filter ")
    assert "\n" not in message and ".rs:" not in message and "/home/" not in message


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("id > 3) foo", "')' at character 7 closes nothing"),
        ("(id > 3", "'(' at character 1 is never closed"),
        ("id > 3 garbage", "unexpected 'garbage' after a complete condition"),
        ("id > 3; drop", "one condition"),
        ("nope > 3", "no column 'nope'"),
        ("`nope` = 1 AND id > 0", "no column 'nope'"),
        ("text > 3", "type mismatch"),
        ("'abc'", "not a true/false condition"),
        ("id = 'a", "string opened at character 6 is never closed"),
    ],
)
def test_the_message_says_what_is_wrong(uri, sql, words):
    with pytest.raises(FilterError, match="invalid filter") as err:
        validate_filter(Table.open(uri), sql)
    assert words in str(err.value)
    if "no column" in words:
        assert "(columns: id, text, source, n_chars, meta)" in str(err.value)


@pytest.mark.parametrize(
    ("sql", "clean", "rows"),
    [
        ("id > 3", "id > 3", 16),
        ("  id > 3 \n", "id > 3", 16),
        ("source = 'it''s (not) a paren'", "source = 'it''s (not) a paren'", 0),
        ("source = 'a--b' OR source = '/* x */'", None, 0),
        ("id - -1 > 4", None, 16),
        ("((id > 3) OR (id < 1)) AND source LIKE 'd%'", None, 17),
        ("`id` > 3", None, 16),
        ("_rowid >= 0", None, 20),
        ("id IN (1, 2, 3)", None, 3),
    ],
)
def test_valid_filters_pass_unchanged_but_for_outer_space(uri, sql, clean, rows):
    ds = Table.open(uri).dataset
    out = validate_filter(ds, sql)
    assert out == (clean if clean is not None else sql)
    assert ds.count_rows(filter=out) == rows
    assert ds.count_rows(filter=f"({out}) AND (id >= 0)") == rows  # composes safely


def test_none_is_every_row(uri):
    assert validate_filter(Table.open(uri).dataset, None) is None


def test_and_filters_checks_each_part_before_joining(uri):
    ds = Table.open(uri).dataset
    assert and_filters(ds, None, None) is None
    assert and_filters(ds, " id > 3 ", None) == "id > 3"
    assert and_filters(ds, "id > 3", "id < 8") == "(id > 3) AND (id < 8)"
    # Joined unchecked, "(id < 0) AND (1 = 1) OR (id >= 0)" would balance and select every row.
    with pytest.raises(FilterError, match="closes nothing"):
        and_filters(ds, "id < 0", "1 = 1) OR (id >= 0")


COMMENTED = [
    ("id < 10 -- AND id > 5", "'--' at character 9"),
    ("id < 10 /* AND id > 5 */", "'/*' at character 9"),
    ("id < 10 /* AND id > 5", "'/*' at character 9"),
    ("id < 10\n-- AND id > 5", "'--' at character 9"),
    ("source = 'a' --'b'", "'--' at character 14"),
    ("id--1 > 0", "'--' at character 3"),
    ("-- only a comment", "'--' at character 1"),
]


@pytest.mark.parametrize(("sql", "where"), COMMENTED)
def test_a_comment_is_refused_never_dropped(uri, sql, where):
    """``id < 10 -- AND id > 5`` once ran as ``id < 10`` (10 rows instead of 4)."""
    ds = Table.open(uri).dataset
    with pytest.raises(FilterError, match="comments are not allowed") as err:
        validate_filter(ds, sql)
    assert where in str(err.value)
    with pytest.raises(FilterError, match="comments are not allowed"):
        and_filters(ds, "id >= 0", sql)


def test_comment_marks_inside_quotes_are_text():
    assert check_structure("a = '--x' AND b = '/*'") == "a = '--x' AND b = '/*'"
    assert check_structure('a = "/*" AND b = 1') == 'a = "/*" AND b = 1'
    assert check_structure(" a = 'it''s -- fine' ") == "a = 'it''s -- fine'"


# -- every command that takes a filter reports it the same way -----------------------------------


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> str:
    """A table with ``input_ids``/``n_tokens`` made by a test UDF (no tokenizer download)."""
    import pyarrow as pa

    from tokenloom.backfill import add_column, udf

    tmp = tmp_path_factory.mktemp("filters-cli")
    write_jsonl(tmp / "a.jsonl", [{"text": p, "source": "docs"} for p in real_paragraphs(20)])
    out = str(tmp / "t.lance")
    ingest([tmp / "a.jsonl"], out, progress=False)
    add_column(out, None, _bytes_as_ids(udf, pa), workers=0, progress=False)
    (tmp / "eval.txt").write_text("some evaluation question that is long enough\n")
    return out


def _bytes_as_ids(udf, pa):  # noqa: ANN001, ANN202
    import json

    @udf(
        inputs=["text"],
        output={"input_ids": pa.list_(pa.uint16()), "n_tokens": pa.int64()},
        version="1",
    )
    def utf8_ids(batch):  # noqa: ANN001, ANN202
        ids = [list(t.encode()) for t in batch.column("text").to_pylist()]
        return [pa.array(ids, pa.list_(pa.uint16())), [len(x) for x in ids]]

    ident = {"name": "utf8-bytes", "vocab_size": 257, "eos_id": 256, "vocab_hash": "x"}
    meta = {b"tokenloom.tokenizer": json.dumps(ident).encode()}
    return utf8_ids.with_output(
        pa.schema(
            [
                pa.field("input_ids", pa.list_(pa.uint16()), metadata=meta),
                pa.field("n_tokens", pa.int64()),
            ]
        )
    )


def _commands(uri: str) -> dict[str, list[str]]:
    tmp = os.path.dirname(uri)
    return {
        "stats": ["stats", "--table", uri, "--filter"],
        "search": ["search", "--table", uri, "river", "--where"],
        "contamination": [
            "contamination", "--table", uri, "--eval", f"{tmp}/eval.txt", "--filter",
        ],
        "tokenizer train": [
            "tokenizer", "train", "--table", uri, "--vocab-size", "300", "--out",
            f"{tmp}/bpe", "--filter",
        ],
        "backfill run": [
            "backfill", "run", "--table", uri, "--udf", "tokenloom.backfill.builtin:n_words",
            "--workers", "0", "--where",
        ],
        "ledger": ["ledger", "--table", uri, "--seq-len", "64", "--filter"],
        "verify": ["verify", "--table", uri, "--seq-len", "64", "--filter"],
    }  # fmt: skip


BAD = ["id > 3 garbage", "no_such_col > 1", "id > 3 LIMIT 2"]
MALFORMED = ["id > 3) foo", "(id > 3", "id < 10 -- AND id > 5", "id < 10 /* AND id > 5 */"]


COMMANDS = ["stats", "search", "contamination", "tokenizer train", "backfill run", "ledger"]
COMMANDS += ["verify"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_reports_a_filter_the_table_refuses_in_one_line_and_exits_one(
    tokenized, name
):
    if name in ("ledger", "verify"):
        pytest.importorskip("torch")
    index = list(_commands(tokenized)).index(name)
    bad = BAD[index % len(BAD)]  # every class of bad filter, spread over the commands
    args = [*_commands(tokenized)[name], bad]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: invalid filter {bad!r}: "), proc.stderr
    assert "unexpected error" not in proc.stderr and ".rs:" not in proc.stderr
    if "no_such_col" in bad:
        assert "no column 'no_such_col'" in lines[0]
    assert "n_words" not in Table.open(tokenized).schema().names  # nothing was computed


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_refuses_a_malformed_filter_as_a_usage_error(tokenized, name):
    """Comments, unbalanced parentheses: refused as the option is parsed (exit 2, naming it)."""
    index = list(_commands(tokenized)).index(name)
    bad = MALFORMED[index % len(MALFORMED)]
    proc = run_cli(*_commands(tokenized)[name], bad, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for '--filter' / '--where': invalid filter" in proc.stderr
    assert "comments are not allowed" in proc.stderr or "parentheses" in proc.stderr
    assert "n_words" not in Table.open(tokenized).schema().names


def test_train_refuses_a_commented_val_filter_as_a_usage_error(tokenized, tmp_path):
    proc = run_cli(
        "train", "--table", tokenized, "--out", str(tmp_path / "run"), "--seq-len", "16",
        "--val-filter", "id < 10 -- AND id > 5",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for '--val-filter': invalid filter" in proc.stderr
    assert "comments are not allowed: the '--' at character 9" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_malformed_mixture_pool_filter_is_a_usage_error(tokenized):
    mixture = json.dumps({"web": ["id < 10 -- AND id > 5", 1.0], "rest": ["id >= 10", 1.0]})
    proc = run_cli("stats", "--table", tokenized, "--mixture", mixture, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for --mixture: pool 'web': invalid filter" in proc.stderr
    assert "comments are not allowed" in proc.stderr
