"""``tokenloom quarantine``: the rows a step range fed (exactly what ``trace`` lists for those
steps) recorded under the table; bad ranges, names and missing runs refused as usage errors
(exit 2). Through real processes."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from tests.conftest import invoke, real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402

LOADER = ["--seq-len", "32", "--global-batch-size", "2", "--seed", "5"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A six-step run of the smallest model on a tiny byte-token table: (run dir, table)."""
    tmp = tmp_path_factory.mktemp("quarantine")
    uri = token_table(tmp, real_paragraphs(24))
    out = str(tmp / "run")
    invoke(
        "train", "--table", uri, "--out", out, "--model", "tiny", *LOADER, "--steps", "6",
        "--checkpoint-every", "3", "--keep-every", "3", "--log-every", "1",
    )  # fmt: skip
    return out, uri


def _traced(out: str, steps: range) -> set[int]:
    rows: set[int] = set()
    for s in steps:
        got = json.loads(invoke("trace", "--run", out, "--step", str(s), "--json"))
        rows |= {r["row_id"] for r in got["rows"]}
    return rows


def test_quarantine_records_exactly_the_rows_trace_lists(run):
    out, uri = run
    got = json.loads(invoke("quarantine", "--checkpoint", out, "--steps", "2:4", "--name", "q24",
                            "--json"))  # fmt: skip
    want = _traced(out, range(2, 5))
    assert got["row_ids"] == sorted(want) and got["rows"] == len(want)
    assert got["steps"] == [2, 4] and got["run"] == os.path.abspath(out)
    assert got["uri"].endswith("/_tokenloom/quarantine/q24.lance")
    assert os.path.isfile(os.path.join(uri, "_tokenloom", "quarantine", "q24.lance"))
    assert got["tokens"] > 0 and got["stretches"] >= got["rows"]
    # the file reads back as written
    from tokenloom.search.quarantine import read_quarantine

    q = read_quarantine(uri, "q24")
    assert q.row_ids.tolist() == got["row_ids"] and (q.first_step, q.last_step) == (2, 4)
    # a name is written once
    again = run_cli("quarantine", "--checkpoint", out, "--steps", "1", "--name", "q24")
    assert again.returncode == 1 and "exists already" in again.stderr and "--name" in again.stderr
    # the text form, the default name and a rewound checkpoint (RUN/step-3 has steps 1..3)
    text = invoke("quarantine", "--checkpoint", os.path.join(out, "step-3"), "--steps", "3")
    assert "quarantine 'run-steps-3-3'" in text and "steps 3..3" in text
    assert f"rows: {', '.join(map(str, sorted(_traced(out, range(3, 4)))))}" in text


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ("5:3", "is empty"),
        ("0:2", "outside the run"),
        ("4:7", "outside the run"),
        ("a:b", "not a step range"),
        ("3:", "not a step range"),
    ],
)
def test_bad_steps_are_a_usage_error_naming_the_range(run, steps, says):
    out, _ = run
    res = run_cli("quarantine", "--checkpoint", out, "--steps", steps)
    assert res.returncode == 2, res.stderr
    assert "--steps" in res.stderr and says in res.stderr and "steps 1..6" in res.stderr


def test_missing_run_and_bad_name(run, tmp_path):
    out, _ = run
    res = run_cli("quarantine", "--checkpoint", str(tmp_path / "nope"), "--steps", "1:2")
    assert res.returncode == 2 and "--checkpoint" in res.stderr, res.stderr  # as export, sample
    assert "does not exist" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("quarantine", "--checkpoint", out, "--steps", "1", "--name", "../x")
    assert res.returncode == 2 and "'../x' is not allowed" in res.stderr, res.stderr
    assert "--name" in res.stderr
