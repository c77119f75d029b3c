"""Ingest of a corpus mixing every bad case: valid rows all kept once, every bad one rejected
with the right reason and location."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.conftest import write_jsonl
from tokenloom.errors import IngestError
from tokenloom.ingest import Reason, ingest
from tokenloom.table import Table

HUGE_BYTES = 52 * 1000 * 1000  # a single document over 50 MB


def _rejects(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture
def messy_corpus(tmp_path, paragraphs):
    """Files mixing valid records with every kind of bad input, and what must come out."""
    p = iter(paragraphs[:100])
    paragraphs = paragraphs[100:]
    valid: list[str] = []
    bad: list[tuple[str, str, dict]] = []  # (file name, reason, locator)

    def ok(**extra):
        text = next(p)
        valid.append(text)
        return {"text": text, **extra}

    # JSONL with every record-level problem, valid records around each.
    lines: list[object] = [ok(source="docs", title="first")]
    cases = [
        (b'{"text": "unterminated', Reason.INVALID_JSON),
        (b'{"text": null}', Reason.NULL_TEXT),
        (b'{"body": "no text key here"}', Reason.MISSING_TEXT),
        (b'{"text": 12345}', Reason.NON_STRING_TEXT),
        (b'{"text": ["a", "list"]}', Reason.NON_STRING_TEXT),
        (b'"just a string"', Reason.NOT_AN_OBJECT),
        (b'{"text": ""}', Reason.EMPTY_TEXT),
        (b'{"text": " \\n\\t  "}', Reason.EMPTY_TEXT),
        (b'{"text": "Latin-1 caf\xe9 is not UTF-8"}', Reason.INVALID_UTF8),
        (b'{"text": "lone \\udc80 surrogate"}', Reason.INVALID_UNICODE),
    ]
    for raw, reason in cases:
        lines.append(raw)
        bad.append(("mixed.jsonl", reason, {"line": len(lines)}))
        lines.append(ok())
    lines.append(b"")  # a blank line is not a record
    lines.append(ok(source="docs"))
    write_jsonl(tmp_path / "mixed.jsonl", lines)

    # The same kind of content, compressed.
    gz_records = [ok() for _ in range(5)]
    with gzip.open(tmp_path / "part.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in gz_records)
    zst_records = [ok() for _ in range(5)]
    cctx = zstandard.ZstdCompressor()
    payload = "".join(json.dumps(r) + "\n" for r in zst_records).encode()
    (tmp_path / "part.jsonl.zst").write_bytes(cctx.compress(payload))

    # A truncated gzip (two members, the second cut short): the records of the intact first
    # member are kept, the break is a read_error.
    trunc = [ok() for _ in range(3)]
    first = gzip.compress("".join(json.dumps(r) + "\n" for r in trunc).encode())
    second = gzip.compress(("".join(json.dumps({"text": t}) + "\n" for t in paragraphs)).encode())
    (tmp_path / "broken.jsonl.gz").write_bytes(first + second[: len(second) // 2])
    # Every complete line decodable before the cut is a valid record and must be kept too.
    decodable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(second[: len(second) // 2])
    complete = decodable.split(b"\n")[:-1]
    assert 0 < len(complete) < len(paragraphs)
    valid += [json.loads(line)["text"] for line in complete]
    bad.append(("broken.jsonl.gz", Reason.READ_ERROR, {}))

    # Parquet: a null, an invalid UTF-8 binary cell, an empty string; and a file without the
    # text column at all.
    pq_texts = [next(p), None, b"\xff\xfe not utf8".decode("latin-1"), "", next(p)]
    valid += [pq_texts[0], pq_texts[4]]
    binary = [t.encode("utf-8") if isinstance(t, str) else None for t in pq_texts]
    binary[2] = b"\xff\xfe not utf8"
    pq.write_table(
        pa.table({"text": pa.array(binary, pa.binary()), "lang": ["en"] * 5}),
        tmp_path / "cells.parquet",
    )
    bad += [
        ("cells.parquet", Reason.NULL_TEXT, {"row": 1}),
        ("cells.parquet", Reason.INVALID_UTF8, {"row": 2}),
        ("cells.parquet", Reason.EMPTY_TEXT, {"row": 3}),
    ]
    pq.write_table(pa.table({"content": ["a", "b", "c"]}), tmp_path / "nocol.parquet")
    bad.append(("nocol.parquet", Reason.MISSING_TEXT, {"count": 3}))

    # A directory of text files: good ones, a binary file, an invalid UTF-8 file, an empty one,
    # an unreadable entry (a dangling symlink) and a huge single document.
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for i in range(3):
        (docs / f"good{i}.txt").write_text(valid_text := next(p), encoding="utf-8")
        valid.append(valid_text)
    (docs / "sub" / "nested.txt").write_text(valid_text := next(p), encoding="utf-8")
    valid.append(valid_text)
    (docs / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (docs / "latin1.txt").write_bytes("Größe und Maß".encode("latin-1"))
    (docs / "blank.txt").write_text("   \n\n  ", encoding="utf-8")
    os.symlink(tmp_path / "does-not-exist", docs / "dangling.txt")
    bad += [
        ("docs/image.txt", Reason.BINARY_FILE, {}),
        ("docs/latin1.txt", Reason.INVALID_UTF8, {}),
        ("docs/blank.txt", Reason.EMPTY_TEXT, {}),
        ("docs/dangling.txt", Reason.UNREADABLE_FILE, {}),
    ]
    huge_unit = next(p) + "\n\n"
    huge = huge_unit * (HUGE_BYTES // len(huge_unit.encode()) + 1)
    (docs / "huge.txt").write_text(huge, encoding="utf-8")
    valid.append(huge)

    # An input path that does not exist and one of an unknown format.
    (tmp_path / "notes.docx").write_bytes(b"PK\x03\x04 not for us")
    bad += [
        ("missing.jsonl", Reason.UNREADABLE_FILE, {}),
        ("notes.docx", Reason.UNSUPPORTED_FORMAT, {}),
    ]
    inputs = [
        tmp_path / n
        for n in (
            "mixed.jsonl",
            "part.jsonl.gz",
            "part.jsonl.zst",
            "broken.jsonl.gz",
            "cells.parquet",
            "nocol.parquet",
            "docs",
            "missing.jsonl",
            "notes.docx",
        )
    ]
    return inputs, valid, bad


def test_every_valid_row_once_every_bad_one_rejected(tmp_path, messy_corpus):
    inputs, valid, bad = messy_corpus
    uri = str(tmp_path / "t.lance")
    result = ingest(inputs, uri, progress=False)

    table = Table.open(uri)
    rows = table.dataset.to_table(columns=["id", "text", "n_chars"]).to_pylist()
    assert result.rows_written == len(valid) == len(rows)
    assert Counter(r["text"] for r in rows) == Counter(valid)  # content exact, each once
    assert sorted(r["id"] for r in rows) == list(range(len(valid)))  # dense ids
    assert all(r["n_chars"] == len(r["text"]) for r in rows)
    assert max(len(r["text"].encode()) for r in rows) > 50_000_000

    expected = Counter()
    for _name, reason, loc in bad:
        expected[reason] += loc.get("count", 1)
    assert result.rejected == dict(expected)

    logged = _rejects(result.rejects_path)
    assert len(logged) == len(bad)
    for name, reason, loc in bad:
        hits = [
            r
            for r in logged
            if r["file"].endswith(name)
            and r["reason"] == reason
            and all(r.get(k) == v for k, v in loc.items())
        ]
        assert hits, f"no rejection {reason} for {name} {loc} in {logged}"
    # JSONL rejections carry a byte offset that points at the line.
    raw = (tmp_path / "mixed.jsonl").read_bytes()
    for r in logged:
        if r["file"].endswith("mixed.jsonl") and r["reason"] != Reason.INVALID_UTF8:
            assert raw[r["offset"] :].split(b"\n", 1)[0] == raw.split(b"\n")[r["line"] - 1]


def test_errors_replace_keeps_invalid_utf8(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [b'{"text": "caf\xe9 au lait"}', b'{"text": "a \\ud800 b"}'])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_bytes("Maß".encode("latin-1"))
    result = ingest(
        [tmp_path / "a.jsonl", tmp_path / "d"],
        tmp_path / "t.lance",
        errors="replace",
        progress=False,
    )
    assert result.rejected == {}
    texts = sorted(Table.open(tmp_path / "t.lance").dataset.to_table()["text"].to_pylist())
    assert texts == ["Ma\ufffd", "a \ufffd b", "caf\ufffd au lait"]


def test_too_large_records_are_rejected_by_limit(tmp_path, paragraphs):
    big = " ".join(paragraphs)
    write_jsonl(tmp_path / "a.jsonl", [{"text": paragraphs[0]}, {"text": big}])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big.txt").write_text(big)
    result = ingest(
        [tmp_path / "a.jsonl", tmp_path / "d"],
        tmp_path / "t.lance",
        max_doc_bytes=len(big) // 2,
        progress=False,
    )
    assert result.rows_written == 1
    assert result.rejected == {Reason.TOO_LARGE: 2}


def test_nothing_readable_is_an_error_and_leaves_no_table(tmp_path):
    write_jsonl(tmp_path / "bad.jsonl", [b"{not json", b'{"text": null}'])
    with pytest.raises(IngestError, match="nothing could be ingested") as err:
        ingest(
            [tmp_path / "bad.jsonl", tmp_path / "missing.jsonl"],
            tmp_path / "t.lance",
            progress=False,
        )
    assert "invalid_json=1" in str(err.value) and "unreadable_file=1" in str(err.value)
    assert not (tmp_path / "t.lance").exists()
    rejects = list((tmp_path / "t.lance.rejects").iterdir())
    assert len(rejects) == 1 and len(_rejects(str(rejects[0]))) == 3
