"""Small built-in UDFs: useful columns on their own, and the benchmark's cheap workload."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenloom.backfill.udf import UDFError, udf
from tokenloom.loader.pipeline.lossmask import MASK_TYPE

__all__ = ["n_words", "LossMask", "MASK_PATTERNS"]


@udf(inputs=["text"], output=pa.field("n_words", pa.int32()), version="1", batch_size=4096)
def n_words(batch: pa.RecordBatch) -> pa.Array:
    """Whitespace-separated words per document (vectorised Arrow compute)."""
    return pc.list_value_length(pc.utf8_split_whitespace(batch.column("text"))).cast(pa.int32())


MASK_PATTERNS = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "phone": r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]?\d{3,4}"
    r"(?!\w)",
    "license": r"(?im)^[^\S\n]*(?:#|//|/?\*+|--|;)?[^\n]*\b(?:copyright|spdx-license-identifier|"
    r"licensed under|all rights reserved|permission is hereby granted)\b[^\n]*\n?",
}
"""Named patterns of :class:`LossMask` (anything else it is given is a regular expression):
e-mail addresses, phone numbers (an optional +country code, then groups of digits), and lines of
license headers (a line naming copyright, an SPDX identifier or a license grant)."""


@udf(
    inputs=["id", "text", "input_ids"],
    output=pa.field("loss_mask", MASK_TYPE),
    version="1",
    batch_size=256,
)
class LossMask:
    """Loss-mask spans from regular expressions over the text, as token positions of the token
    column ``input_ids`` (:mod:`tokenloom.loader.pipeline.lossmask`: flat ``[start, end)`` pairs).

    Every token whose characters overlap a match is masked (a token half inside an e-mail
    address is masked whole); runs of masked tokens become one span, sorted. A row without a
    match gets an empty list; a null text or token list gets null. The tokenizer is the one
    recorded on the token column (``tokenize``), unless ``tokenizer`` names one. A row whose
    stored ids do not spell its text is refused with its id (the column is stale: tokenize again).

    Args:
        patterns: Names from :data:`MASK_PATTERNS` or regular expressions, as a list or a
            comma-separated string (default: e-mail and phone).
        tokenizer: A tokenizer spec, when the token column records none.
    """

    def __init__(
        self, patterns: list[str] | str = ("email", "phone"), tokenizer: str | None = None
    ) -> None:
        names = [p.strip() for p in patterns.split(",")] if isinstance(patterns, str) else patterns
        if (
            not isinstance(names, list | tuple)
            or not names
            or not all(isinstance(p, str) and p for p in names)
        ):
            raise UDFError(
                f"LossMask: patterns must be a non-empty list of names ({', '.join(MASK_PATTERNS)})"
                f" or regular expressions, got {patterns!r}; e.g. --arg 'patterns=[\"email\"]'"
            )
        self.regexes = []
        for p in names:
            try:
                self.regexes.append(re.compile(MASK_PATTERNS.get(p, p)))
            except re.error as exc:
                raise UDFError(
                    f"LossMask: pattern {p!r} is neither a name ({', '.join(MASK_PATTERNS)}) nor a "
                    f"valid regular expression: {exc}"
                ) from None
        self.spec = tokenizer
        self._tok: Any = None

    def _tokenizer(self, field: pa.Field) -> Any:
        if self._tok is None:
            from tokenloom.tokenize.registry import load_tokenizer

            spec = self.spec
            if spec is None:
                raw = (field.metadata or {}).get(b"tokenloom.tokenizer")
                spec = json.loads(raw).get("name") if raw else None
            if not spec:
                raise UDFError(
                    "LossMask: the token column records no tokenizer; pass the one it was "
                    "made with: --arg tokenizer=SPEC (e.g. gpt2)"
                )
            self._tok = load_tokenizer(spec)
        return self._tok

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        from tokenloom.table.tokens import as_token_lists
        from tokenloom.tokenize.offsets import TokenTextMismatch, token_char_ranges, tokens_touching

        field = batch.schema.field("input_ids")
        lists = as_token_lists(batch.column("input_ids"), field)
        flat = lists.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        offs = lists.offsets.to_numpy()
        valid = lists.is_valid().to_numpy(zero_copy_only=False)
        out: list[list[int] | None] = []
        for i, (rid, text) in enumerate(
            zip(batch.column("id").to_pylist(), batch.column("text").to_pylist(), strict=True)
        ):
            if text is None or not valid[i]:
                out.append(None)
                continue
            found = [
                m.span() for r in self.regexes for m in r.finditer(text) if m.end() > m.start()
            ]
            if not found:
                out.append([])
                continue
            ids = flat[offs[i] : offs[i + 1]]
            try:
                ranges = token_char_ranges(self._tokenizer(field), text, ids)
            except TokenTextMismatch as exc:
                raise UDFError(
                    f"LossMask: row id {rid}: {exc} of 'input_ids'; the token column is stale: "
                    "tokenize again (`tokenloom tokenize --table T --tokenizer SPEC`)"
                ) from None
            out.append(tokens_touching(ranges, np.asarray(found)).reshape(-1).tolist())
        return pa.array(out, type=MASK_TYPE)
