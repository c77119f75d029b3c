"""Where windows of long documents end, judged against the text: mid-paragraph, mid-code-block.

``python -m tokenloom.dev.cut_report --table T --seq-len 1024 --overlap 64 --cut-column COL``
plans the windows of every row longer than the window (as the loader does), maps each window end
that is not its document's end back to a character of the text, and counts, per source:

* ``mid_paragraph``: the end is not at a paragraph or section boundary of the text (a line start
  after a blank line, a heading, a top-level definition; see :mod:`tokenloom.tokenize.structure`);
* ``mid_code``: the end falls inside a fenced code block, or inside a top-level Python ``def`` /
  ``class`` (between its first line and the next line at column 0).

Reads every long row's text and ids: a measuring tool for ``docs/recipes.md``, not a loader path.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from typing import Any

import numpy as np

from tokenloom.tokenize.structure import PARAGRAPH, StructureBoundaries, _fences, text_boundaries

__all__ = ["code_ranges", "cut_report"]

_TOP = re.compile(r"^(?:def |class |async def |@)")


def code_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges ``(a, b)`` whose inside (``a < x < b``) is code: fenced blocks (from the
    opening fence's line end to the closing fence's line end) and top-level Python definitions
    (from their first line to the next non-blank line at column 0)."""
    lines = text.split("\n")
    starts = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum([len(s) + 1 for s in lines], out=starts[1:])
    out = []
    inside = _fences(lines)
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and inside[i + 1] and not inside[i]:  # an opening fence
            j = i + 1
            while j + 1 < len(lines) and inside[j + 1]:
                j += 1
            out.append((int(starts[i + 1]) - 1, int(starts[j + 1]) - 1))
            i = j + 1
        elif _TOP.match(lines[i]):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1] in " \t)]}"):
                j += 1
            out.append((int(starts[i]), int(starts[j])))
            i = j
        else:
            i += 1
    return out


def cut_report(
    uri: str, *, seq_len: int, overlap: int, cut_column: str | None, long_docs: str = "window"
) -> dict[str, Any]:
    """Counts of window ends per source (see the module docstring)."""
    from tokenloom.loader.pipeline.planner import Planner
    from tokenloom.loader.plan.spec import LoaderSpec
    from tokenloom.table import Table

    spec = LoaderSpec.from_options(
        table=uri, seq_len=seq_len, long_docs=long_docs, overlap=overlap, cut_column=cut_column
    )
    planner = Planner(spec)
    t = planner.cuts
    ds = Table.open(uri).dataset
    field = ds.schema.field("input_ids")
    ident = json.loads(field.metadata[b"tokenloom.tokenizer"])
    udf = StructureBoundaries(ident["name"], ident["vocab_hash"], "input_ids", "text")
    counts: dict[str, Counter] = {}
    row_ids = np.asarray(planner.inputs.row_ids[t.rows], dtype=np.int64)
    for a in range(0, row_ids.shape[0], 256):
        ids = row_ids[a : a + 256]
        rows = ds.to_table(
            columns=["id", "source", "text", "input_ids"],
            filter=f"id IN ({','.join(map(str, ids))})",
        ).to_pylist()
        by_id = {r["id"]: r for r in rows}
        for k, rid in enumerate(ids.tolist(), start=a):
            r = by_id[rid]
            c = counts.setdefault(r["source"], Counter())
            toks = np.asarray(r["input_ids"], dtype=np.int64)
            ends_u, pos = udf._ends(toks, r["text"], rid)
            offs, kinds = text_boundaries(r["text"])
            strong = set(offs[kinds >= PARAGRAPH].tolist())
            code = code_ranges(r["text"])
            c["long_docs"] += 1
            n = np.asarray(planner.inputs.n_tokens[t.rows[k : k + 1]], dtype=np.int64)
            for e in t.windows_of(np.array([k]), n)[1][:-1].tolist():  # the last ends the doc
                at = int(np.searchsorted(pos, ends_u[e - 1]))  # the character the window ends at
                c["windows"] += 1
                c["mid_paragraph"] += at not in strong
                c["mid_code"] += any(x < at < y for x, y in code)
    total = sum(counts.values(), Counter())
    return {"by_source": {s: dict(v) for s, v in sorted(counts.items())}, "total": dict(total)}


def main(argv: list[str] | None = None) -> None:
    """Print :func:`cut_report` as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--table", required=True)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--overlap", type=int, default=0)
    p.add_argument("--cut-column", default=None)
    p.add_argument("--long-docs", default="window", choices=["window", "units"])
    a = p.parse_args(argv)
    report = cut_report(
        a.table,
        seq_len=a.seq_len,
        overlap=a.overlap,
        cut_column=a.cut_column,
        long_docs=a.long_docs,
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
