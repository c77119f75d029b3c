"""Hostile input through the real CLI: each class of bad input is rejected or kept with a counted
reason, every valid neighbour lands, and every run's counts add up."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.conftest import write_jsonl
from tokenloom.table import Table


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenloom.cli.main", "ingest", *map(str, args)],
        capture_output=True,
        cwd=cwd,
    )


def _ingest(*args, ok: bool = True) -> dict:
    """Run ``tokenloom ingest ... --json``; check the exit status and that the counts add up."""
    proc = _cli(*args, "--json")
    assert proc.returncode == (0 if ok else 1), proc.stderr.decode(errors="replace")
    if not ok:
        return {}
    out = json.loads(proc.stdout)
    seen = out["rows_written"] + sum(out["rejected"].values()) + out["skipped"]
    assert seen == out["records_seen"], out
    return out


def _rows(uri) -> list[dict]:
    return Table.open(uri).dataset.to_table().sort_by("id").to_pylist()


def _strict_json(text: str):
    """Parse as RFC 8259 JSON: no NaN/Infinity, no lone surrogates."""

    def refuse(name):
        raise ValueError(f"non-standard constant {name}")

    assert not re.search("[\ud800-\udfff]", text) and "\\ud" not in text.lower(), text
    text.encode("utf-8")
    return json.loads(text, parse_constant=refuse)


def _assert_meta_strict(uri) -> list[dict]:
    rows = _rows(uri)
    for r in rows:
        _strict_json(r["meta"])
        r["source"].encode("utf-8")
    return rows


# -- every field: encodings, numbers, nesting ----------------------------------------------------

_POISON = [
    (b'{"text": "bad source", "source": "\\udc80"}', "invalid_unicode"),
    (b'{"text": "bad key", "\\ud800k": 1}', "invalid_unicode"),
    (b'{"text": "bad value", "m": {"x": ["\\udfff"]}}', "invalid_unicode"),
    (b'{"text": "latin-1 meta", "title": "caf\xe9"}', "invalid_utf8"),
    (b'{"text": "latin-1 key", "t\xeftle": 1}', "invalid_utf8"),
    (b'{"text": "deep", "m": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json"),
    (b'{"text": ' + b"7" * 5000 + b"}", "non_string_text"),
]
_KEPT = [  # valid text whose metadata needs a documented repair: kept, with a note
    (b'{"text": "nan meta", "x": NaN, "y": [Infinity, -Infinity], "z": 1e999}', "nonfinite_number"),
    (b'{"text": "big int meta", "n": ' + b"9" * 5000 + b"}", "big_integer"),
]


def test_bad_values_in_any_field_never_abort_and_meta_is_strict_json(tmp_path, paragraphs):
    valid = [{"text": p, "source": "docs", "n": i} for i, p in enumerate(paragraphs[:50])]
    lines: list[object] = []
    for i, rec in enumerate(valid):
        lines.append(rec)
        if i < len(_POISON):
            lines.append(_POISON[i][0])
        elif i - len(_POISON) < len(_KEPT):
            lines.append(_KEPT[i - len(_POISON)][0])
    write_jsonl(tmp_path / "poisoned.jsonl", lines)
    # A file whose name is not UTF-8.
    name = os.fsdecode(b"caf\xe9-notes.jsonl")
    write_jsonl(tmp_path / name, [{"text": "from a latin-1 file name"}])
    uri = tmp_path / "t.lance"

    out = _ingest(tmp_path / "poisoned.jsonl", tmp_path / name, "--table", uri)
    expected = {}
    for _, reason in _POISON:
        expected[reason] = expected.get(reason, 0) + 1
    assert out["rejected"] == expected
    assert out["rows_written"] == len(valid) + len(_KEPT) + 1
    assert out["notes"] == {"big_integer": 1, "escaped_file_name": 1, "nonfinite_number": 1}
    rows = _assert_meta_strict(uri)
    wanted = [v["text"] for v in valid]
    assert [r["text"] for r in rows if r["text"] in set(wanted)] == wanted  # all, in order
    by_text = {r["text"]: json.loads(r["meta"]) for r in rows}
    assert by_text["nan meta"]["x"] == "NaN" and by_text["nan meta"]["z"] == "Infinity"
    assert by_text["big int meta"]["n"] == "9" * 5000
    latin = next(r for r in rows if r["text"] == "from a latin-1 file name")
    assert latin["source"] == "caf\\xe9-notes" and by_text[latin["text"]]["_file"].startswith("caf")
    logged = [json.loads(line) for line in open(out["rejects_path"], encoding="utf-8")]
    assert {r["reason"] for r in logged if not r.get("kept")} == set(expected)

    # --errors replace keeps the records with U+FFFD in every field, noted.
    out = _ingest(
        tmp_path / "poisoned.jsonl", "--table", tmp_path / "r.lance", "--errors", "replace"
    )
    assert out["rejected"] == {"invalid_json": 1, "non_string_text": 1}
    assert (
        out["notes"]["replaced_invalid_unicode"] == 3 and out["notes"]["replaced_invalid_utf8"] == 2
    )
    rows = _assert_meta_strict(tmp_path / "r.lance")
    assert any(r["source"] == "\ufffd" for r in rows)


def test_a_non_utf8_source_option_is_a_usage_error(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    proc = _cli(
        tmp_path / "a.jsonl", "--table", tmp_path / "t.lance", "--source", os.fsdecode(b"w\xffb")
    )
    assert proc.returncode == 2 and b"--source" in proc.stderr and b"UTF-8" in proc.stderr
    assert not (tmp_path / "t.lance").exists()


def test_one_poisoned_line_in_a_big_corpus_loses_nothing_else(tmp_path, paragraphs):
    n = 5000
    lines: list[object] = [{"text": f"{paragraphs[i % 200]} #{i}"} for i in range(n)]
    lines.insert(n // 2, b'{"text": "ok", "source": "\\ud83d"}')  # half an emoji pair
    write_jsonl(tmp_path / "corpus.jsonl", lines)
    out = _ingest(tmp_path / "corpus.jsonl", "--table", tmp_path / "t.lance")
    assert out["rows_written"] == n and out["rejected"] == {"invalid_unicode": 1}


# -- Parquet -------------------------------------------------------------------------------------


def test_parquet_duplicate_columns_bad_utf8_wrong_types(tmp_path, paragraphs):
    texts = paragraphs[:4]
    dup = pa.Table.from_arrays([pa.array(texts), pa.array(texts[::-1])], names=["text", "text"])
    pq.write_table(dup, tmp_path / "dup_text.parquet")
    lang = pa.array([b"en", b"\xff\xfe", None, b"fr"], pa.binary()).view(pa.string())
    cols = {
        "text": pa.array(texts),
        "lang": lang,  # a string column holding invalid UTF-8 in row 1
        "score": pa.array([0.5, math.nan, math.inf, 1.0]),
        "tag": pa.array(["a", "b", "c", "d"]).dictionary_encode(),
        "when": pa.array([1, 2, 3, 4], pa.timestamp("s")),
    }
    table = pa.table(cols)
    table = pa.Table.from_arrays(
        [*table.columns, pa.array([1, 2, 3, 4])], [*table.column_names, "tag"]
    )
    pq.write_table(table, tmp_path / "cells.parquet")
    pq.write_table(pa.table({"text": pa.array([1, 2, 3])}), tmp_path / "ints.parquet")

    out = _ingest(
        tmp_path / "dup_text.parquet",
        tmp_path / "cells.parquet",
        tmp_path / "ints.parquet",
        "--table",
        tmp_path / "t.lance",
    )
    assert out["rejected"] == {"duplicate_text_field": 4, "invalid_utf8": 1, "non_string_text": 3}
    assert out["rows_written"] == 3 and out["notes"] == {"nonfinite_number": 1}  # row 1 rejected
    rows = _assert_meta_strict(tmp_path / "t.lance")
    metas = [json.loads(r["meta"]) for r in rows]
    assert metas[0]["tag"] == "a" and metas[0]["tag#2"] == 1 and metas[1]["score"] == "Infinity"


def _corrupt_middle_row_group(path) -> int:
    """Overwrite the data pages of row group 1 with junk; return its row count."""
    meta = pq.ParquetFile(path).metadata
    rg = meta.row_group(1)
    col = rg.column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    with open(path, "r+b") as fh:  # the page bytes, inside this column chunk only
        fh.seek(start + 16)
        fh.write(b"\xff" * (col.total_compressed_size - 32))
    return rg.num_rows


def test_parquet_corrupt_row_group_keeps_every_readable_one(tmp_path, paragraphs):
    texts = [f"{paragraphs[i % 200]} #{i}" for i in range(300)]
    path = tmp_path / "three_groups.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=100, compression="snappy")
    bad_rows = _corrupt_middle_row_group(path)
    out = _ingest(path, "--table", tmp_path / "t.lance")
    assert out["rejected"].get("read_error", 0) >= 1
    assert out["rows_written"] + out["rejected"]["read_error"] == 300
    got = [r["text"] for r in _rows(tmp_path / "t.lance")]
    assert got[:100] == texts[:100] and got[-100:] == texts[200:]  # groups 0 and 2 whole
    assert bad_rows == 100


# -- compressed input ----------------------------------------------------------------------------


def _payload(n: int = 30_000) -> bytes:
    return b"".join(b'{"text": "record %d of a compressed file"}\n' % i for i in range(n))


def test_bad_trailers_and_checksums_keep_every_decoded_record(tmp_path):
    payload = _payload()
    gz = bytearray(gzip.compress(payload))
    gz[-8:-4] = bytes(b ^ 0xFF for b in gz[-8:-4])  # wrong CRC32
    (tmp_path / "crc.jsonl.gz").write_bytes(bytes(gz))
    zst = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(payload))
    zst[-1] ^= 0xFF  # wrong content checksum
    (tmp_path / "sum.jsonl.zst").write_bytes(bytes(zst))
    members = gzip.compress(payload[:4000]) + gzip.compress(payload[4000:])  # two members
    (tmp_path / "members.jsonl.gz").write_bytes(members)
    out = _ingest(
        *(tmp_path / n for n in ("crc.jsonl.gz", "sum.jsonl.zst", "members.jsonl.gz")),
        "--table",
        tmp_path / "t.lance",
    )
    assert out["rows_written"] == 3 * 30_000 and out["rejected"] == {}
    assert out["notes"] == {"checksum_mismatch": 2}


def test_zstd_long_window_frames_are_read(tmp_path):
    params = zstandard.ZstdCompressionParameters.from_level(
        3, window_log=31, enable_ldm=True, write_content_size=False
    )
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    data = cobj.compress(_payload(5000)) + cobj.flush()
    assert zstandard.get_frame_parameters(data).window_size == 1 << 31  # like `zstd --long=31`
    (tmp_path / "long.jsonl.zst").write_bytes(data)
    out = _ingest(tmp_path / "long.jsonl.zst", "--table", tmp_path / "t.lance")
    assert out["rows_written"] == 5000


_PEAK_RSS = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "tokenloom.cli.main", "ingest", *sys.argv[1:]],
                      capture_output=True, text=True)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, proc.stdout)
"""


def _peak_rss_kib(*args) -> tuple[int, int, dict]:
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *map(str, args), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    code, rss, out = proc.stdout.split(" ", 2)
    return int(code), int(rss), json.loads(out)


def test_memory_is_bounded_by_max_doc_mb(tmp_path):
    # A gzip bomb: 512 MiB of one endless line in ~2 MB; and a 200 MB line in a plain file.
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = b"a" * (1 << 20)
    bomb = b"".join([comp.compress(b'{"text": "'), *(comp.compress(chunk) for _ in range(512))])
    (tmp_path / "bomb.jsonl.gz").write_bytes(
        bomb + comp.compress(b'"}\n{"text": "after"}\n') + comp.flush()
    )
    with open(tmp_path / "endless.jsonl", "wb") as fh:
        fh.write(b'{"text": "before"}\n{"text": "')
        for _ in range(200):
            fh.write(chunk)
        fh.write(b'"}\n{"text": "after the endless line"}\n')
    write_jsonl(tmp_path / "tiny.jsonl", [{"text": "tiny"}])

    _, base, _ = _peak_rss_kib(tmp_path / "tiny.jsonl", "--table", tmp_path / "base.lance")
    code, peak, out = _peak_rss_kib(
        tmp_path / "bomb.jsonl.gz",
        tmp_path / "endless.jsonl",
        "--table",
        tmp_path / "t.lance",
        "--max-doc-mb",
        "8",
    )
    assert code == 0
    assert out["rejected"] == {"too_large": 2} and out["rows_written"] == 3
    assert peak - base < 4 * 8 * 1024, f"peak {peak} KiB vs baseline {base} KiB"


# -- files -----------------------------------------------------------------------------------------


def test_bom_special_files_symlinks_and_loops(tmp_path, paragraphs):
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')
    short = tempfile.mkdtemp(prefix="tl-", dir="/tmp")  # a socket path must be short
    try:
        docs = os.path.join(short, "docs")
        os.makedirs(os.path.join(docs, "sub"))
        for i in range(3):
            with open(os.path.join(docs, f"doc{i}.txt"), "w") as fh:
                fh.write(paragraphs[i])
        with open(os.path.join(docs, "sub", "same.txt"), "w") as fh:
            fh.write(paragraphs[0])  # identical content in another file: both ingested
        os.mkfifo(os.path.join(docs, "pipe.txt"))
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.join(docs, "sock.txt"))
        os.symlink("/dev/zero", os.path.join(docs, "zero.txt"))  # a device: never opened
        outside = tmp_path / "outside.txt"
        outside.write_text("outside the root")
        os.symlink(outside, os.path.join(docs, "escape.txt"))
        os.symlink("..", os.path.join(docs, "sub", "up"))  # a loop through the parent
        os.symlink("self.txt", os.path.join(docs, "self.txt"))  # a loop onto itself
        os.symlink(os.path.join(docs, "doc1.txt"), os.path.join(docs, "alias.txt"))  # inside
        uri = tmp_path / "t.lance"
        out = _ingest(tmp_path / "bom.jsonl", docs, "--table", uri)
        assert out["rejected"] == {
            "symlink_loop": 2,
            "symlink_outside_root": 2,  # escape.txt and zero.txt
            "unsupported_format": 2,  # pipe and socket
        }
        assert out["rows_written"] == 2 + 4
        texts = [r["text"] for r in _rows(uri)]
        assert texts[:2] == ["first", "second"] and texts.count(paragraphs[0]) == 2

        out = _ingest(docs, "--table", tmp_path / "f.lance", "--follow-symlinks")
        assert out["rejected"] == {"symlink_loop": 2, "unsupported_format": 3}  # + the device
        assert "outside the root" in [r["text"] for r in _rows(tmp_path / "f.lance")]
        sock.close()
    finally:
        import shutil

        shutil.rmtree(short, ignore_errors=True)


def test_unreadable_file_on_the_command_line_is_counted(tmp_path):
    write_jsonl(tmp_path / "good.jsonl", [{"text": "good"}])
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("needs Linux /proc")
    # Stat says a regular file, but reading it fails with EIO, even for root.
    os.symlink("/proc/self/mem", tmp_path / "eio.jsonl")
    out = _ingest(tmp_path / "good.jsonl", tmp_path / "eio.jsonl", "--table", tmp_path / "t.lance")
    assert out["rows_written"] == 1 and out["rejected"] == {"unreadable_file": 1}
    # Only unreadable input: nothing ingested is exit status 1, with the count named.
    proc = _cli(tmp_path / "eio.jsonl", "--table", tmp_path / "u.lance")
    assert proc.returncode == 1 and b"unreadable_file=1" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads chmod 000 files")
def test_chmod_000_file_and_directory_are_counted(tmp_path):  # pragma: no cover - as non-root
    write_jsonl(tmp_path / "locked.jsonl", [{"text": "x"}])
    (tmp_path / "docs" / "locked").mkdir(parents=True)
    (tmp_path / "docs" / "ok.txt").write_text("readable")
    (tmp_path / "docs" / "locked" / "in.txt").write_text("hidden")
    os.chmod(tmp_path / "locked.jsonl", 0)
    os.chmod(tmp_path / "docs" / "locked", 0)
    try:
        out = _ingest(tmp_path / "locked.jsonl", tmp_path / "docs", "--table", tmp_path / "t.lance")
        assert out["rows_written"] == 1 and out["rejected"] == {"unreadable_file": 2}
    finally:
        os.chmod(tmp_path / "docs" / "locked", 0o755)


def test_unreadable_subdirectory_is_counted(tmp_path, monkeypatch):
    """Simulated (tests run as root): listing one subdirectory raises PermissionError."""
    from tokenloom.ingest import ingest, inputs

    (tmp_path / "docs" / "locked").mkdir(parents=True)
    (tmp_path / "docs" / "ok.txt").write_text("readable")
    (tmp_path / "docs" / "locked" / "in.txt").write_text("hidden")
    real = os.scandir

    def scandir(path="."):
        if isinstance(path, str) and path.endswith("locked"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(inputs.os, "scandir", scandir)
    result = ingest([tmp_path / "docs"], tmp_path / "t.lance", progress=False)
    assert result.rows_written == 1 and result.rejected == {"unreadable_file": 1}
    assert result.balanced


def test_rejects_of_a_file_uri_table_go_beside_the_table_not_the_cwd(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "ok"}, b"{broken"])
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = _cli(tmp_path / "a.jsonl", "--table", f"file://{tmp_path}/t.lance", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rejects_path"].startswith(f"{tmp_path}/t.lance.rejects/")
    assert os.listdir(cwd) == []


def test_bad_paths_on_the_command_line_never_stop_their_neighbours(tmp_path):
    """A missing path, a dangling symlink and a path under a file: each counted as
    unreadable_file (listed with its reason) in the text summary, the good file ingested; only
    bad paths: status 1 naming the count."""
    write_jsonl(tmp_path / "good.jsonl", [{"text": "good"}])
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "dangling.jsonl")
    bad = [tmp_path / "missing.jsonl", tmp_path / "dangling.jsonl", tmp_path / "good.jsonl" / "x"]
    rejects = tmp_path / "rejects.jsonl"
    table = tmp_path / "t.lance"
    proc = _cli(tmp_path / "good.jsonl", *bad, "--table", table, "--rejects", rejects)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"unreadable_file\s+3\b", out) and "1 written + 3 rejected" in out
    records = [json.loads(line) for line in rejects.read_text().splitlines()]
    listed = {r["file"]: r for r in records}
    assert set(listed) == {str(p) for p in bad}
    assert all(r["reason"] == "unreadable_file" and r["detail"] for r in listed.values())
    assert [r["text"] for r in _rows(table)] == ["good"]

    proc = _cli(*bad, "--table", tmp_path / "none.lance")
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "nothing could be ingested from 3 input path(s)" in err
    assert "unreadable_file=3" in err and "Traceback" not in err
