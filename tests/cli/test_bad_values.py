"""A bad option value is a usage error: exit 2, naming the option, before any work is done.

Each case runs the real entry point in its own process (the exit status is what a shell sees).
The values fail while the command line is parsed or while the config is built from it, so no
table is needed: the paths given need not exist.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

T = ("--table", "absent.lance")

# (arguments, the option the message must name)
BAD_VALUES = [
    # sizes and numbers: bounds, sub-unit sizes, non-finite floats, integers beyond 64 bits
    (("ingest", "a.jsonl", *T, "--max-doc-mb", "1e-7"), "--max-doc-mb"),
    (("ingest", "a.jsonl", *T, "--max-doc-mb", "nan"), "--max-doc-mb"),
    (("ingest", "a.jsonl", *T, "--max-doc-mb", "inf"), "--max-doc-mb"),
    (("sample", "--checkpoint", "run", "--prompt", "hi", "--temperature", "-0.5"), "--temperature"),
    (("sample", "--checkpoint", "run", "--prompt", "hi", "--seed", "-1"), "--seed"),
    (("train", *T, "--lr", "-1"), "--lr"),
    (("train", *T, "--lr", "0"), "--lr"),
    (("train", *T, "--weight-decay", "-0.1"), "--weight-decay"),
    (("train", *T, "--time-limit", "inf"), "--time-limit"),
    (("trace", "--checkpoint", "run", "--row", "-1"), "--row"),
    (("gc", *T, "--min-age", "nan"), "--min-age"),
    (("search", "words", *T, "--limit", "0"), "--limit"),
    (("search", "words", *T, "--limit", str(2**64)), "--limit"),
    (("info", *T, "--version", str(2**63)), "--version"),
    (("trace", "--checkpoint", "run", "--row", str(2**70)), "--row"),
    # empty names, paths, filters and prompts
    (("sample", "--checkpoint", "run", "--prompt", ""), "--prompt"),
    (("sample", "--checkpoint", "", "--prompt", "hi"), "--checkpoint"),
    (("ingest", "a.jsonl", *T, "--text-field", ""), "--text-field"),
    (("ingest", "a.jsonl", *T, "--source", " "), "--source"),
    (("ingest", "a.jsonl", "--table", ""), "--table"),
    (("info", "--table", ""), "--table"),
    (("stats", *T, "--column", ""), "--column"),
    (("stats", *T, "--filter", ""), "--filter"),
    (("tokenize", *T, "--tokenizer", ""), "--tokenizer"),
    (("train", *T, "--device", ""), "--device"),
    (("train", *T, "--device", "gpu0"), "--device"),
    (("index", *T, "--fts", ""), "--fts"),
    (("dev", "s3", "--dir", ""), "--dir"),
    (("contamination", *T, "--eval", "e.jsonl", "--eval-field", ""), "--eval-field"),
    # directories that must exist
    (("bench", "plan", "--workdir", "missing-dir/"), "--workdir"),
    (("gc", *T, "--runs", "missing-dir/"), "--runs"),
    # values each valid alone but not together (the loader spec refuses them)
    (("stats", *T, "--budget-tokens", "100"), "--budget-tokens"),
    (("stats", *T, "--long-docs", "window", "--window", "4", "--overlap", "9"), "--overlap"),
    (("stats", *T, "--mixture", '{"a": ["id > 0", -1]}'), "--mixture"),
]


@pytest.mark.parametrize(("args", "option"), BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_a_bad_value_is_a_usage_error_naming_the_option(tmp_path, monkeypatch, args, option):
    monkeypatch.chdir(tmp_path)  # relative paths (absent.lance, missing-dir/) land in tmp_path
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert option in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "please report it" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_the_rule_keeps_the_help_of_each_option():
    # The refusal of empty and non-finite values wraps each option's type: ranges still show.
    proc = run_cli("train", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # the help wraps lines
    assert "Peak learning rate. [default: 0.003] [x>0]" in text
    assert "[default: 0.1] [0<=x<=1]" in text
