"""roundtrip_failures: what a lossy tokenizer loses, where, and the first-difference search."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenloom.tokenize import Tokenizer, load_tokenizer, roundtrip_failures
from tokenloom.tokenize.roundtrip import first_difference


def _naive_first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@settings(derandomize=True, max_examples=300)
@given(st.text(alphabet="ab", max_size=40), st.text(alphabet="ab", max_size=40))
def test_first_difference_matches_naive(a: str, b: str) -> None:
    assert first_difference(a, b) == _naive_first_difference(a, b)


@pytest.fixture()
def lossy(tmp_path: Path) -> Tokenizer:
    """A word-level tokenizer: loses whitespace runs and unknown words."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    words = ["hello", "world", "[UNK]", "<|endoftext|>"]
    tok = HF(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with one space
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    return load_tokenizer(tmp_path)


def test_failures_name_row_position_and_snippets(lossy: Tokenizer) -> None:
    texts = ["hello world", "hello  world", None, "hello there"]
    failures = roundtrip_failures(lossy, texts, ids=["a", "b", "c", "d"])
    assert [(f.index, f.id, f.position) for f in failures] == [(1, "b", 6), (3, "d", 6)]
    assert failures[0].expected == "hello  world"
    assert failures[0].got == "hello world"
    assert (failures[0].chars, failures[0].decoded_chars) == (12, 11)
    assert failures[1].got == "hello [UNK]"


def test_sample_is_deterministic(lossy: Tokenizer) -> None:
    texts = ["x"] * 50
    first = roundtrip_failures(lossy, texts, sample=10, seed=3)
    assert len(first) == 10
    assert first == roundtrip_failures(lossy, texts, sample=10, seed=3)
    assert [f.index for f in first] == sorted(f.index for f in first)
    assert len(roundtrip_failures(lossy, texts, sample=500)) == 50


def test_checks_stored_ids(gpt2: Tokenizer) -> None:
    texts = ["Hello world", "Hello world"]
    stored = pa.array([[15496, 995], [15496, 2159]], type=pa.list_(pa.uint16()))
    failures = roundtrip_failures(gpt2, texts, encoded=stored, ids=pa.array([10, 11]))
    assert [(f.id, f.position) for f in failures] == [(11, 6)]


def test_length_mismatch(gpt2: Tokenizer) -> None:
    with pytest.raises(ValueError, match="ids has 1 entries but texts has 2"):
        roundtrip_failures(gpt2, ["a", "b"], ids=[1])
