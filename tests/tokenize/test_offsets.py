"""Token character ranges from stored ids (tiktoken and Hugging Face backends) and the builtin
``LossMask`` UDF that maps text matches to token spans with them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.backfill import UDFError
from tokenloom.backfill.builtin import LossMask
from tokenloom.tokenize import load_tokenizer
from tokenloom.tokenize.offsets import TokenTextMismatch, token_char_ranges, tokens_touching

TEXTS = [
    "Mail ann@example.com, not ann@example",
    "héllo wörld 😀 — ¿qué? ünïcødé x@y.io 日本語のテキスト",
    "",
    "def f(x):\n    return x  # (c) me",
]


def _check_ranges(tok, text: str) -> np.ndarray:
    ids = np.asarray(tok.encode(text), dtype=np.int64)
    ranges = token_char_ranges(tok, text, ids)
    assert ranges.shape == (len(ids), 2)
    if len(ids):
        assert ranges[0, 0] == 0 and ranges[-1, 1] == len(text)
        assert (ranges[:, 0] <= ranges[:, 1]).all() and (np.diff(ranges[:, 0]) >= 0).all()
        covered = np.zeros(len(text), dtype=bool)
        for a, b in ranges:
            covered[a:b] = True
        assert covered.all()  # every character belongs to some token
    return ranges


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_ranges_cover_the_text_in_order(text):
    tok = load_tokenizer("gpt2")
    ranges = _check_ranges(tok, text)
    for i, (a, b) in enumerate(ranges):  # a token of whole characters spells exactly them
        piece = tok._enc.decode_single_token_bytes(int(tok.encode(text)[i]))
        if piece.decode("utf-8", "ignore").encode() == piece:
            assert text[a:b] == piece.decode()


def test_hf_ranges_cover_the_text(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    for text in TEXTS:
        _check_ranges(tok, text)


def test_ids_of_another_text_are_refused():
    tok = load_tokenizer("gpt2")
    with pytest.raises(TokenTextMismatch):
        token_char_ranges(tok, "hello world", np.asarray(tok.encode("hello there")))


def test_tokens_touching_equals_a_naive_overlap():
    rng = np.random.default_rng(1)
    for _ in range(300):
        cuts = np.sort(rng.choice(np.arange(1, 40), size=rng.integers(0, 12), replace=False))
        bounds = np.concatenate([[0], cuts, [40]])
        ranges = np.stack([bounds[:-1], bounds[1:]], axis=1)
        spans = rng.integers(0, 41, size=(int(rng.integers(0, 5)), 2))
        spans.sort(axis=1)
        hit = [any(a < e and b > s for s, e in spans if e > s) for a, b in ranges]
        want = [(i, i + 1) for i, h in enumerate(hit) if h]
        merged: list[list[int]] = []
        for s, e in want:
            if merged and merged[-1][1] == s:
                merged[-1][1] = e
            else:
                merged.append([s, e])
        got = tokens_touching(ranges, spans)
        assert got.tolist() == merged


def _batch(texts, ids, tok):
    lists = pa.array(ids, type=pa.list_(pa.uint16()))
    meta = {b"tokenloom.tokenizer": json.dumps({"name": tok.name}).encode()}
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("text", pa.large_string()),
            pa.field("input_ids", pa.list_(pa.uint16()), metadata=meta),
        ]
    )
    return pa.record_batch([pa.array(range(len(texts))), pa.array(texts), lists], schema=schema)


def test_the_udf_masks_whole_tokens_of_each_match():
    tok = load_tokenizer("gpt2")
    texts = ["Write to ann@example.com today", "nothing here", None, "call +1 555-123-4567"]
    ids = [tok.encode(t) if t is not None else None for t in texts]
    out = LossMask.bind(patterns=["email", "phone"])(_batch(texts, ids, tok))
    masks = out.column("loss_mask").to_pylist()
    assert masks[1] == [] and masks[2] is None
    for row, m in ((ids[0], masks[0]), (ids[3], masks[3])):
        assert len(m) == 2
        inside = tok.decode(row[m[0] : m[1]])
        assert ("ann@example.com" in inside) or ("+1 555-123-4567" in inside)
        assert "Write" not in inside and "call" not in inside  # only the touched tokens


def test_the_udf_refuses_stale_tokens_and_bad_patterns():
    tok = load_tokenizer("gpt2")
    stale = _batch(["ann@example.com is here"], [tok.encode("something else")], tok)
    with pytest.raises(UDFError, match="row id 0: the stored ids do not spell the text"):
        LossMask.bind(patterns=["email"])(stale)
    with pytest.raises(UDFError, match="neither a name .* nor a valid regular expression"):
        LossMask.bind(patterns=["(unclosed"])(stale)
    with pytest.raises(UDFError, match="non-empty list"):
        LossMask.bind(patterns=[])(stale)
