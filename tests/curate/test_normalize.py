"""Tests of ``tokenloom.curate.normalize``: what counts as the same text, and its hash."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.curate import CurateError, normalize_text, text_hashes
from tokenloom.curate.normalize import hashes_to_numpy


def test_normalize_composes_collapses_whitespace_and_keeps_case():
    assert normalize_text("  Cafe\u0301 \t au\u00a0lait\n\n\u2028US ") == "Caf\u00e9 au lait US"
    assert normalize_text("US and us", lowercase=True) == "us and us"
    assert normalize_text("\ufb01ne \uff21") == "\ufb01ne \uff21"  # NFC, not NFKC
    assert normalize_text(" \n\t ") == ""


def test_text_hash_is_blake2b_of_the_normalised_utf8(wiki):
    texts = [r["text"] for r in wiki[:50]]
    got = text_hashes(texts).to_pylist()
    for text, digest in zip(texts, got, strict=True):
        key = " ".join(unicodedata.normalize("NFC", text).split()).encode()
        assert digest == hashlib.blake2b(key, digest_size=16).digest()
    # pinned, so a change to the recipe cannot pass unnoticed
    assert text_hashes(["Hello,\u00a0 world\n"])[0].as_py().hex() == (
        "eb705831f5b26d41a3691e4566f197a4"
    )


def test_whitespace_variants_share_a_hash_and_case_only_on_request(wiki):
    text = wiki[0]["text"]
    variants = [text, "  " + text.replace(" ", "\n", 3) + "\t", text.upper()]
    h = text_hashes(variants).to_pylist()
    assert h[0] == h[1] != h[2]
    hl = text_hashes(variants, lowercase=True).to_pylist()
    assert hl[0] == hl[1] == hl[2]


def test_hashes_are_the_same_in_another_process():
    code = (
        "from tokenloom.curate import text_hashes, minhash_signatures;"
        "print(text_hashes(['abc def']).to_pylist()[0].hex(), "
        "minhash_signatures(['the quick brown fox jumps'])[0, :4].tolist())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_nulls_and_arrow_inputs():
    arr = pa.chunked_array(
        [pa.array(["a", None], pa.large_string()), pa.array(["a "], pa.large_string())]
    )
    h = text_hashes(arr)
    assert h.type == pa.binary(16) and h.null_count == 1
    assert h[0] == h[2]
    assert len(text_hashes([])) == 0
    with pytest.raises(CurateError, match="nulls?"):
        hashes_to_numpy(h)
    m = hashes_to_numpy(text_hashes(["x", "y", "x"]).slice(1))
    assert m.shape == (2, 16) and m.dtype == np.uint8
    assert m[1].tobytes() == text_hashes(["x"])[0].as_py()


def test_bad_inputs_are_named():
    with pytest.raises(CurateError, match="string"):
        text_hashes(pa.array([1, 2]))
    with pytest.raises(CurateError, match="one str"):
        text_hashes("just one text")
    with pytest.raises(CurateError, match=r"texts\[1\]"):
        text_hashes(["ok", b"bytes"])
    with pytest.raises(CurateError, match="Unicode"):
        text_hashes(["lone \ud800 surrogate"])
