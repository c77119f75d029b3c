"""Structure boundaries: kinds from Markdown, reStructuredText and Python; token positions from
GPT-2 (tiktoken, per-token bytes) and a trained BPE (Hugging Face, offsets)."""

from __future__ import annotations

import inspect
import json
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import real_paragraphs, run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.tokenize import load_tokenizer
from tokenloom.tokenize.structure import (
    KINDS,
    STRUCTURE_TYPE,
    StructureBoundaries,
    StructureError,
    text_boundaries,
)

MARKDOWN = """# Title

First paragraph,
second line.

```python
def inside():

    return 1
```
After the code.

Setext heading
--------------

~~~~
~~~
still code
~~~~
## Last
tail
"""

RST = """=========
Overlined
=========

Intro text.

Section
=======

Body line one
body line two.
"""

PYTHON = '''"""Module docstring."""

import os


@decorator
def first(x):
    return x

    # a blank line inside a function

class Second:
    def method(self):
        pass
async def third():
    pass
'''


def kinds_at(text: str) -> list[tuple[str, str]]:
    """``(kind, the line the cut comes before)`` of each boundary."""
    offsets, kinds = text_boundaries(text)
    return [(KINDS[k], text[o:].split("\n", 1)[0]) for o, k in zip(offsets, kinds, strict=True)]


def test_markdown_kinds_and_no_cut_inside_code_fences():
    got = kinds_at(MARKDOWN)
    assert ("section", "# Title") not in got  # offset 0 is no cut
    assert ("paragraph", "First paragraph,") in got
    assert ("line", "second line.") in got
    assert ("paragraph", "After the code.") in got  # after a closing fence
    assert ("section", "Setext heading") in got
    assert ("section", "## Last") in got
    assert ("line", "tail") in got
    lines = [line for _, line in got]
    for inside in ("def inside():", "    return 1", "still code", "~~~"):
        assert inside not in lines, inside  # within a fence, closing fence included
    assert "--------------" not in lines  # a title stays with its underline
    offsets, _ = text_boundaries(MARKDOWN)
    for opening, closing in (("```python\n", "```\n"), ("~~~~\n", "~~~~\n")):
        a = MARKDOWN.index(opening) + len(opening)
        b = MARKDOWN.index(closing, a) + len(closing)
        assert not ((offsets >= a) & (offsets < b)).any()  # the blank line inside included


def test_crlf_text_has_the_structure_of_lf_text():
    for text in (MARKDOWN, RST, PYTHON):
        lf = text_boundaries(text)
        crlf = text_boundaries(text.replace("\n", "\r\n"))
        assert np.array_equal(lf[1], crlf[1])
        assert [text[:o].count("\n") for o in lf[0]] == [
            text.replace("\n", "\r\n")[:o].count("\n") for o in crlf[0]
        ]


def test_unclosed_fence_runs_to_the_end():
    text = "para\n\n```\ncode\n\nmore code\n"
    assert kinds_at(text) == [("line", ""), ("paragraph", "```")]


def test_rst_headings():
    got = kinds_at(RST)
    assert ("paragraph", "Intro text.") in got
    assert ("section", "Section") in got
    lines = [line for _, line in got]
    assert "Overlined" not in lines and "=======" not in lines  # title kept with adornments
    assert ("line", "body line two.") in got


def test_python_top_level_definitions():
    got = kinds_at(PYTHON)
    assert ("section", "@decorator") in got
    assert ("section", "class Second:") in got
    assert ("section", "async def third():") in got
    lines = [line for _, line in got]
    assert "def first(x):" not in lines  # a decorator stays with its function
    assert ("line", "    def method(self):") in got  # a method is not top level
    assert ("paragraph", "    # a blank line inside a function") in got


def test_real_stdlib_source_sections_are_its_top_level_definitions():
    src = inspect.getsource(textwrap)
    got = kinds_at(src)
    sections = {line for kind, line in got if kind == "section"}
    tops = {
        line
        for line in src.split("\n")
        if line.startswith(("def ", "class "))
        and not src.split("\n")[src.split("\n").index(line) - 1].startswith("@")
    }
    assert tops and tops <= sections


def _check_row(tok, text, ids, row):
    """Every cut ``c`` splits the ids where the text's boundary is: ids[:c] decode to the text
    before it, and its kind is the text scan's."""
    offsets, kinds = text_boundaries(text)
    by_char = dict(zip(offsets.tolist(), kinds.tolist(), strict=True))
    assert row, "the samples all have boundaries"
    assert [d["offset"] for d in row] == sorted({d["offset"] for d in row})
    for d in row:
        c = d["offset"]
        assert 0 < c < len(ids)
        before = tok.decode(ids[:c])
        assert text.startswith(before)
        assert by_char[len(before)] == d["kind"]


@pytest.mark.parametrize("which", ["gpt2", "bpe"])
def test_udf_maps_boundaries_to_token_offsets(which, request):
    spec = "gpt2" if which == "gpt2" else str(request.getfixturevalue("bpe_dir"))
    tok = load_tokenizer(spec)
    texts = [MARKDOWN, RST, PYTHON, inspect.getsource(json), "\n\n".join(real_paragraphs(8))]
    udf = StructureBoundaries(spec, tok.vocab_hash, "input_ids", "text")
    batch = pa.record_batch(
        {"id": list(range(len(texts))), "input_ids": tok.encode_batch(texts), "text": texts}
    )
    out = udf(batch)
    assert out.type == STRUCTURE_TYPE
    for text, row in zip(texts, out.to_pylist(), strict=True):
        _check_row(tok, text, tok.encode(text), row)
    wrong = pa.record_batch(
        {"id": [7], "input_ids": tok.encode_batch(["other text"]), "text": ["some text"]}
    )
    with pytest.raises(StructureError, match="row 7"):
        udf(wrong)


def test_tokenize_structure_cli_adds_the_column(tmp_path):
    texts = [MARKDOWN, PYTHON, inspect.getsource(textwrap)]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    res = run_cli(
        "tokenize", "--table", uri, "--tokenizer", "gpt2", "--workers", "0", "--structure", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["structure"]["column"] == "cut_structure"
    tok = load_tokenizer("gpt2")
    rows = Table.open(uri).dataset.to_table(columns=["text", "input_ids", "cut_structure"])
    for r in rows.to_pylist():
        _check_row(tok, r["text"], r["input_ids"], r["cut_structure"])
    kinds = np.array([d["kind"] for r in rows.to_pylist() for d in r["cut_structure"]])
    assert set(kinds.tolist()) == {0, 1, 2}
