"""Big records: memory bounded by a small multiple of one record, through the real CLI, and the
Arrow path for big texts (``tokenloom.ingest.bigtext``) storing exactly what the ordinary path
stores, rejections and notes included."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, write_jsonl
from tokenloom.ingest import bigtext, ingest, readers
from tokenloom.table import Table

MIB = 1 << 20

_PEAK_RSS = """
import json, os, resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "tokenloom.cli.main", "ingest", *sys.argv[1:]],
                      capture_output=True, text=True)
print(json.dumps({"status": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout,
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

# Peak RSS above a tiny ingest may exceed the record multiple by this much: the reader's 1 MiB
# pieces, Lance's writer pages and the allocators' caches, which do not grow with the record.
_ALLOWANCE_MIB = 24


def _peak(*args) -> dict:
    """``tokenloom ingest ARGS --json`` in a child of a fresh interpreter: the child's peak RSS."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *map(str, args), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    out = json.loads(proc.stdout)
    out["peak_mib"] = out["peak_kib"] / 1024
    return out


def _big_text(n_bytes: int) -> str:
    """Prose with newlines and quotes (JSON escapes) and one character above U+FFFF, which makes
    a Python string of it four bytes per character: the worst case for the ordinary path."""
    unit = 'The "loom" weaves\nline after line of text. '
    return (unit * (n_bytes // len(unit) + 1))[: n_bytes - 4] + "\U0001f600"


def test_a_60_mib_document_peaks_under_three_times_its_size(tmp_path):
    text = _big_text(60 * MIB)
    size = len(text.encode())
    write_jsonl(tmp_path / "big.jsonl", [{"text": "before"}, {"text": text, "n": 1}, {"text": "x"}])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "big.txt").write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    del text
    write_jsonl(tmp_path / "tiny.jsonl", [{"text": "tiny"}])

    base = _peak(tmp_path / "tiny.jsonl", "--table", tmp_path / "base.lance")["peak_mib"]
    for name, src in (("jsonl", tmp_path / "big.jsonl"), ("text", tmp_path / "docs")):
        uri = tmp_path / f"{name}.lance"
        run = _peak(src, "--table", uri)
        assert run["status"] == 0, run["stderr"]
        delta = run["peak_mib"] - base
        print(f"{name}: record {size / MIB:.0f} MiB, peak {delta:.0f} MiB above a tiny ingest")
        assert delta <= 3 * size / MIB + _ALLOWANCE_MIB, (name, delta, base)
        rows = Table.open(str(uri)).dataset.to_table(columns=["text", "n_chars"])
        texts = rows.column("text").to_pylist()
        big = max(texts, key=len)
        assert hashlib.sha256(big.encode()).hexdigest() == digest
        assert rows.column("n_chars").to_pylist() == [len(t) for t in texts]
        assert len(texts) == (3 if name == "jsonl" else 1)


def test_an_over_limit_line_is_skipped_while_streaming(tmp_path):
    """A 300 MiB line under --max-doc-mb 10: at most the limit is ever held, the line is counted
    as too_large with its line and offset, and its neighbours are ingested."""
    path = tmp_path / "huge.jsonl"
    first = b'{"text": "before"}\n'
    with open(path, "wb") as fh:
        fh.write(first + b'{"text": "')
        chunk = b"a" * MIB
        for _ in range(300):
            fh.write(chunk)
        fh.write(b'"}\n{"text": "after the huge line"}\n')
    write_jsonl(tmp_path / "tiny.jsonl", [{"text": "tiny"}])
    base = _peak(tmp_path / "tiny.jsonl", "--table", tmp_path / "base.lance")["peak_mib"]
    rejects = tmp_path / "rejects.jsonl"
    run = _peak(path, "--table", tmp_path / "t.lance", "--max-doc-mb", "10", "--rejects", rejects)
    assert run["status"] == 0, run["stderr"]
    out = json.loads(run["stdout"])
    assert out["rejected"] == {"too_large": 1} and out["rows_written"] == 2
    assert run["peak_mib"] - base <= 3 * 10 + _ALLOWANCE_MIB, (run["peak_mib"], base)
    (rej,) = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert rej["reason"] == "too_large" and rej["line"] == 2 and rej["offset"] == len(first)
    rows = Table.open(str(tmp_path / "t.lance")).dataset.to_table(columns=["text"])
    assert rows.column("text").to_pylist() == ["before", "after the huge line"]


@pytest.fixture
def small_big(monkeypatch):
    """Make "big" small, so the Arrow path (cut in pieces) runs on small records; counts the
    texts it produced (so a test can tell it ran, not only fell back)."""
    monkeypatch.setattr(readers, "BIG_RECORD", 300)
    monkeypatch.setattr(bigtext, "_BIG_STRING", 120)
    monkeypatch.setattr(bigtext, "_PIECE", 64)
    made = {"json": 0, "view": 0}

    parse_big_line = readers._parse_big_line

    def big_line(*args):
        doc = parse_big_line(*args)
        made["json"] += doc is not None
        return doc

    def view(data):
        array = bigtext.text_array(data)
        made["view"] += array is not None
        return array

    monkeypatch.setattr(readers, "_parse_big_line", big_line)
    monkeypatch.setattr(readers, "text_array", view)
    return made


def _stored(uri) -> list[dict]:
    table = Table.open(str(uri)).dataset.to_table(columns=["text", "source", "n_chars", "meta"])
    return table.to_pylist()


def _both(tmp_path, monkeypatch, name: str, data: bytes, **kwargs) -> tuple:
    """Ingest ``data`` (a file named ``name``) by the Arrow path and by the ordinary path."""
    (tmp_path / name).write_bytes(data)
    results = []
    for path in ("fast", "ordinary"):
        if path == "ordinary":
            monkeypatch.setattr(readers, "BIG_RECORD", 1 << 62)
        uri = tmp_path / f"{path}-{name}.lance"
        try:
            res = ingest([tmp_path / name], uri, progress=False, force=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the same failure either way is the point
            results.append(("raised", type(exc).__name__))
            continue
        results.append((res.rejected, res.notes, _stored(uri)))
    return tuple(results)


_LONG = 'A line of "prose",\n\ttabbed\\slashed/ — é 漢字 \U0001f600. ' * 8


@pytest.mark.parametrize("ascii_only", [False, True], ids=["utf8", "ensure_ascii"])
def test_the_arrow_path_stores_what_the_ordinary_path_stores(
    tmp_path, monkeypatch, small_big, ascii_only
):
    records = [
        {"text": _LONG, "source": "web", "meta": {"k": [1, 2.5, None, "v"]}},
        {"doc": {"text": _LONG, "title": "t"}, "id": 7},
        {"text": _LONG, "other": _LONG},  # two big strings: the ordinary path decides
        {"text": " \n\t " * 100},  # whitespace only: empty_text
        {"text": ["not", "a", "string", _LONG]},
        {"text": _LONG, "source": _LONG},  # a big source is not the text
        {_LONG: 1, "text": _LONG},  # a big key
        {"text": "short"},
    ]
    lines = [json.dumps(r, ensure_ascii=ascii_only).encode() for r in records]
    lines.append(b'{"text": "' + b"\\ud800" * 60 + b'tail"}')  # lone surrogates
    lines.append(b'{"text": "' + "é".encode() * 80 + b'\xff\xfe"}')  # invalid UTF-8
    lines.append(b'{"text": ' + json.dumps(_LONG).encode() + b"}\r")  # a CR before the LF
    lines.append(b'\xef\xbb\xbf{"text": ' + json.dumps(_LONG).encode() + b"}")  # a BOM mid-file
    data = b"\n".join(lines) + b"\n"
    for errors in ("strict", "replace"):
        fast, ordinary = _both(tmp_path, monkeypatch, f"r-{errors}.jsonl", data, errors=errors)
        assert fast == ordinary
        monkeypatch.setattr(readers, "BIG_RECORD", 300)
    fast, ordinary = _both(tmp_path, monkeypatch, "n.jsonl", data, text_field="doc.text")
    assert fast == ordinary
    # Each "text" run takes the Arrow path for three lines: the first, the big key's, the CR one;
    # the "doc.text" run for one.
    assert small_big["json"] == 3 + 3 + 1


def test_big_text_files_and_parquet_cells_match_the_ordinary_path(tmp_path, monkeypatch, small_big):
    body = _LONG.encode()
    for name, data in (
        ("a.txt", body),
        ("bom.txt", b"\xef\xbb\xbf" + body),
        ("blank.txt", b" \n" * 300),
        ("bad.txt", body + b"\xff"),
    ):
        fast, ordinary = _both(tmp_path, monkeypatch, name, data)
        assert fast == ordinary, name
        monkeypatch.setattr(readers, "BIG_RECORD", 300)
    for kind in (pa.string(), pa.large_string(), pa.binary()):
        cells = [_LONG, "short", " " * 400, None, _LONG[::-1]]
        if kind == pa.binary():
            cells = [c.encode() if c else c for c in cells] + [body + b"\xff"]
        table = pa.table({"text": pa.array(cells, kind), "source": ["s"] * len(cells)})
        pq.write_table(table, tmp_path / "cells.parquet", row_group_size=2)
        data = (tmp_path / "cells.parquet").read_bytes()
        fast, ordinary = _both(tmp_path, monkeypatch, f"c-{kind}.parquet", data)
        assert fast == ordinary, kind
        monkeypatch.setattr(readers, "BIG_RECORD", 300)
    assert small_big["view"] >= 2 + 3 * 2  # the two good text files, two long cells per column
