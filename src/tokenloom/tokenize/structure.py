"""Structure boundaries of a token column: where a long document may be cut, and how well.

For each row, the token offsets ``c`` where the text's own structure welcomes a cut, each with a
*kind* (its rank; a higher rank is a stronger boundary):

==========  ====  ==================================================================
kind        rank  the cut falls just before
==========  ====  ==================================================================
line        0     any line (the cut of ``tokenize --boundaries``)
paragraph   1     the first line after one or more blank lines, or after a closing code fence
section     2     a Markdown ATX heading (``# Title``), a setext / reStructuredText heading
                  (a title underlined, or over- and underlined, with ``=``, ``-``, ``~``, ...),
                  a Python ``def`` / ``class`` / ``async def`` / decorator at column 0
==========  ====  ==================================================================

Never a cut: inside a fenced code block (between an opening and closing ```` ``` ```` or ``~~~``
fence; an unclosed fence runs to the end of the text), between a heading's title and its
adornment lines, and between a decorator and what it decorates. A cut is kept only where a token
ends exactly at the line start (a token straddling it would put the cut inside a line).

**Stored type** (:data:`STRUCTURE_TYPE`): ``list<struct<offset: int32, kind: int8>>``, offsets
strictly ascending within a row (``0 < offset < n_tokens``). The loader reads a column of this type
as a *ranked* cut column: a window ends at the strongest boundary within its last quarter (the
latest one among those of that rank), else at its hard limit (see
:mod:`~tokenloom.loader.plan.window`). A plain ``list<int32>`` column (``--boundaries``) is
unranked.

Token positions come from the tokenizer of the token column: character offsets from Hugging Face
``tokenizers`` (the text is encoded again and must give the stored ids), per-token bytes for
tiktoken. The text scan is per row (run in the backfill's workers); the planner only reads the
stored offsets.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from tokenloom.backfill import UDF, add_column
from tokenloom.errors import TokenloomError
from tokenloom.table.tokens import as_token_lists

__all__ = [
    "KINDS",
    "LINE",
    "PARAGRAPH",
    "SECTION",
    "STRUCTURE_TYPE",
    "StructureBoundaries",
    "StructureError",
    "add_structure",
    "structure_column_for",
    "text_boundaries",
    "token_boundaries",
    "is_ranked",
]

LINE, PARAGRAPH, SECTION = 0, 1, 2
KINDS = ("line", "paragraph", "section")
"""Kind names by rank."""

STRUCTURE_TYPE = pa.list_(pa.struct([("offset", pa.int32()), ("kind", pa.int8())]))
"""The stored type of a structure cut column."""


class StructureError(TokenloomError):
    """The token column does not spell the text it is said to encode."""


def structure_column_for(token_column: str) -> str:
    """``input_ids`` -> ``cut_structure``; ``input_ids_bpe`` -> ``cut_structure_bpe``."""
    if token_column.startswith("input_ids"):
        return "cut_structure" + token_column[len("input_ids") :]
    return f"{token_column}_cut_structure"


def is_ranked(field_type: pa.DataType) -> bool:
    """Whether a cut column's type is the ranked :data:`STRUCTURE_TYPE` (offset plus kind)."""
    if not (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)):
        return False
    v = field_type.value_type
    if not pa.types.is_struct(v) or {v.field(i).name for i in range(v.num_fields)} != {
        "offset",
        "kind",
    }:
        return False
    return pa.types.is_integer(v.field("offset").type) and pa.types.is_integer(v.field("kind").type)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
_ADORN = re.compile(r"^([=\-~^\"'`#*+:.!_])\1{2,}[ \t]*$")
_PYDEF = re.compile(r"^(?:def |class |async def |@)")


def _fences(lines: list[str]) -> np.ndarray:
    """Per line, whether a cut before it would fall inside a fenced code block (the lines after
    an opening fence, its closing fence included)."""
    inside = np.zeros(len(lines), dtype=bool)
    open_: tuple[str, int] | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line.rstrip("\r"))
        if open_ is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                open_ = (m.group(1)[0], len(m.group(1)))
            continue
        inside[i] = True
        fence = m.group(1) if m else ""
        if fence[:1] == open_[0] and len(fence) >= open_[1] and not m.group(2).strip():
            open_ = None  # a closing fence: the same character, at least as long, nothing after
    return inside


def text_boundaries(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The structure boundaries of a text (see the module docstring).

    Returns:
        ``(offsets, kinds)``: int64 character offsets (line starts, ``0 < offset < len(text)``,
        ascending) and the int8 kind of each.
    """
    raw = text.split("\n")
    n = len(raw)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum([len(s) + 1 for s in raw[:-1]], out=starts[1:])
    lines = [s.rstrip("\r") for s in raw]  # CRLF text: the same structure as LF text
    blank = [not s.strip() for s in lines]
    adorn = [bool(_ADORN.match(s)) for s in lines]
    fence = _fences(lines)
    forbid = fence.copy()
    kind = np.zeros(n, dtype=np.int8)
    for i in range(n):
        if blank[i]:
            continue
        line = lines[i]
        if i and blank[i - 1]:
            kind[i] = PARAGRAPH
        if i and fence[i - 1] and not fence[i]:  # the line after a closing fence
            kind[i] = max(kind[i], PARAGRAPH)
        if _ATX.match(line) or (_PYDEF.match(line) and not (i and lines[i - 1].startswith("@"))):
            kind[i] = SECTION
        elif adorn[i] and i + 2 < n and not blank[i + 1] and lines[i + 2].rstrip() == line.rstrip():
            kind[i] = SECTION  # an overlined title: keep overline, title and underline together
            forbid[i + 1] = forbid[i + 2] = True
        elif i + 1 < n and adorn[i + 1] and not adorn[i] and not line.startswith("    "):
            kind[i] = SECTION  # a title and its underline
            forbid[i + 1] = True
        if i and lines[i - 1].startswith("@") and _PYDEF.match(line):
            forbid[i] = True  # a decorator stays with its definition
    keep = ~forbid & (starts > 0) & (starts < len(text))
    return starts[keep], kind[keep]


def token_boundaries(token_ends: np.ndarray, offsets: np.ndarray, kinds: np.ndarray) -> tuple:
    """Character boundaries as token offsets: ``c`` where token ``c - 1`` ends exactly at the
    boundary (``0 < c < n``); a boundary inside a token is dropped.

    Args:
        token_ends: ``(n,)`` non-decreasing end (character or byte) of each token.
        offsets: Boundaries in the same unit, ascending.
        kinds: Their kinds.

    Returns:
        ``(token_offsets int32, kinds int8)``, strictly ascending offsets.
    """
    ends = np.asarray(token_ends, dtype=np.int64)
    c = np.searchsorted(ends, offsets, side="right")
    ok = (c > 0) & (c < ends.shape[0])
    ok[ok] &= ends[c[ok] - 1] == offsets[ok]
    c, k = c[ok], kinds[ok]
    if c.size > 1:  # offsets ascend, so equal c are neighbours: keep the strongest kind of each
        first = np.r_[True, c[1:] != c[:-1]]
        k = np.maximum.reduceat(k, np.flatnonzero(first))
        c = c[first]
    return c.astype(np.int32), k.astype(np.int8)


def _utf8_positions(text: str) -> np.ndarray:
    """``(len(text) + 1,)`` byte offset of each character position in the UTF-8 encoding."""
    cp = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    size = 1 + (cp >= 0x80).astype(np.int64) + (cp >= 0x800) + (cp >= 0x10000)
    out = np.zeros(cp.shape[0] + 1, dtype=np.int64)
    np.cumsum(size, out=out[1:])
    return out


class StructureBoundaries:
    """Per row, the ranked structure cut points (:data:`STRUCTURE_TYPE`) of a token column."""

    def __init__(self, spec: str, vocab_hash: str, column: str, text_column: str) -> None:
        from tokenloom.tokenize.registry import load_tokenizer

        tok = load_tokenizer(spec, num_threads=1)
        if tok.vocab_hash != vocab_hash:
            raise RuntimeError(f"tokenizer {spec!r} changed on disk while computing boundaries")
        self.tok, self.column, self.text_column = tok, column, text_column
        self.byte_len: np.ndarray | None = None
        enc = getattr(tok, "_enc", None)
        if enc is not None:  # tiktoken: every id is a fixed byte string
            self.byte_len = np.array(
                [
                    len(enc.decode_single_token_bytes(i)) if _known(enc, i) else 0
                    for i in range(tok.vocab_size)
                ],
                dtype=np.int64,
            )

    def _ends(self, ids: np.ndarray, text: str, row: int) -> tuple[np.ndarray, np.ndarray]:
        """``(token ends, unit of each character position)``: bytes (tiktoken) or chars (HF)."""
        if self.byte_len is not None:
            ends = np.cumsum(self.byte_len[ids])
            pos = _utf8_positions(text)
            if ends.size and ends[-1] != pos[-1] or (not ends.size and text):
                raise StructureError(
                    f"row {row}: {self.column!r} does not spell its {self.text_column!r} "
                    f"({int(ends[-1]) if ends.size else 0} bytes of tokens for {int(pos[-1])} of "
                    f"text); tokenize again: `tokenloom tokenize --table TABLE --tokenizer "
                    f"{self.tok.name} --column {self.column}`"
                )
            return ends, pos
        enc = self.tok._tok.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        if not np.array_equal(np.asarray(enc.ids, dtype=np.int64), ids):
            raise StructureError(
                f"row {row}: {self.column!r} is not what {self.tok.name} encodes its "
                f"{self.text_column!r} to; tokenize again: `tokenloom tokenize --table TABLE "
                f"--tokenizer {self.tok.name} --column {self.column}`"
            )
        ends = np.maximum.accumulate(np.asarray([e for _, e in enc.offsets], dtype=np.int64))
        return ends, np.arange(len(text) + 1, dtype=np.int64)

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        ids = as_token_lists(batch.column(self.column), batch.schema.field(self.column))
        texts = batch.column(self.text_column).to_pylist()
        rows = batch.column("id").to_pylist() if "id" in batch.schema.names else range(len(texts))
        out: list[list[dict] | None] = []
        for text, row, ids_i in zip(texts, rows, ids, strict=True):
            if text is None or not ids_i.is_valid:
                out.append(None)
                continue
            arr = ids_i.values.to_numpy(zero_copy_only=False).astype(np.int64)
            offsets, kinds = text_boundaries(text)
            ends, pos = self._ends(arr, text, row)
            c, k = token_boundaries(ends, pos[offsets], kinds)
            out.append([{"offset": int(a), "kind": int(b)} for a, b in zip(c, k, strict=True)])
        return pa.array(out, type=STRUCTURE_TYPE)


def _known(enc, i: int) -> bool:  # noqa: ANN001 - a tiktoken Encoding
    try:
        enc.decode_single_token_bytes(i)
    except KeyError:
        return False
    return True


def add_structure(
    uri: str,
    column: str = "input_ids",
    *,
    text_column: str = "text",
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: dict[str, str] | None = None,
):  # noqa: ANN201 - BackfillResult
    """Add the structure cut column of ``column`` (its tokenizer read from the field metadata).

    Raises:
        StructureError: The column records no tokenizer, or a row's ids do not spell its text.
    """
    import json

    from tokenloom.table import Table

    table = Table.open(uri, storage_options=storage_options)
    schema = table.schema()
    if column not in schema.names or b"tokenloom.tokenizer" not in (
        schema.field(column).metadata or {}
    ):
        raise StructureError(
            f"no token column {column!r} with a recorded tokenizer in {uri}; tokenize first: "
            f"`tokenloom tokenize --table {uri} --tokenizer gpt2 --column {column}`"
        )
    ident = json.loads(schema.field(column).metadata[b"tokenloom.tokenizer"])
    udf = UDF(
        StructureBoundaries,
        inputs=["id", column, text_column],
        output=pa.field(structure_column_for(column), STRUCTURE_TYPE),
        version="1",
        name="StructureBoundaries",
        batch_size=256,
        kwargs={
            "spec": ident["name"],
            "vocab_hash": ident["vocab_hash"],
            "column": column,
            "text_column": text_column,
        },
    )
    return add_column(table, None, udf, workers=workers, progress=progress)
