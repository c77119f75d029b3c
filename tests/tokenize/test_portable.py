"""A tokenizer's Hugging Face files (:mod:`tokenloom.tokenize.portable`) give the column's ids."""

from __future__ import annotations

import json

import pytest

from tests.conftest import real_paragraphs
from tokenloom.tokenize import load_tokenizer, train_bpe
from tokenloom.tokenize.hf import HFTokenizer
from tokenloom.tokenize.portable import PROBES, hf_tokenizer_files, tokenizer_difference
from tokenloom.tokenize.tiktoken_backend import GPT2_PATTERN, TiktokenTokenizer

transformers = pytest.importorskip("transformers")


def _written(files: dict[str, str], where) -> object:  # noqa: ANN001
    where.mkdir()
    for name, text in files.items():
        (where / name).write_text(text)
    return transformers.AutoTokenizer.from_pretrained(str(where), local_files_only=True)


def _same_ids(loaded, tok) -> None:  # noqa: ANN001
    # transformers splits a special token's literal text out as the special id; tokenloom's
    # column encodes it as plain text, so those probes are left out here
    for text in [*PROBES, *real_paragraphs(5)]:
        if "<|" not in text:
            assert loaded.encode(text) == tok.encode(text), text


def test_a_tiktoken_encoding_with_a_gap_before_its_special_token(tmp_path):
    ranks = {bytes([b]): b for b in range(256)}
    ranks |= {b"th": 256, b"the": 257, b" t": 258, b" th": 259, b" the": 260}
    tok = TiktokenTokenizer(
        name="toy", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 300},
    )  # fmt: skip
    files, why = hf_tokenizer_files(tok, max_length=64)
    assert why is None
    loaded = _written(files, tmp_path / "toy")
    assert loaded.eos_token_id == 300 and loaded.encode("the the") == [257, 260]
    _same_ids(loaded, tok)


def test_a_tokenizers_tokenizer_is_copied_without_its_post_processor(tmp_path):
    tok = train_bpe(real_paragraphs(60), vocab_size=400, out_dir=tmp_path / "bpe")
    spec = json.loads((tmp_path / "bpe" / "tokenizer.json").read_text())
    spec["post_processor"] = {  # one that adds an EOS after every text
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                              "tokens": ["<|endoftext|>"]}},
    }  # fmt: skip
    (tmp_path / "bpe" / "tokenizer.json").write_text(json.dumps(spec))
    tok = load_tokenizer(str(tmp_path / "bpe"))
    files, why = hf_tokenizer_files(tok, max_length=64)
    assert why is None and json.loads(files["tokenizer.json"])["post_processor"] is None
    loaded = _written(files, tmp_path / "out")
    assert loaded.eos_token_id == tok.eos_id
    _same_ids(loaded, tok)


def test_the_first_difference_between_two_tokenizers_is_named(tmp_path):
    tok = train_bpe(real_paragraphs(60), vocab_size=400, out_dir=tmp_path / "bpe")
    assert tokenizer_difference(tok, tok) is None
    assert "against 400" in tokenizer_difference(load_tokenizer("gpt2"), tok)
    spec = json.loads(tok.json_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size and EOS, two ids swapped
    other = HFTokenizer(name="swapped", json_text=json.dumps(spec), roles={})
    assert other.vocab_hash != tok.vocab_hash
    assert f"id {min(vocab[a], vocab[b])} decodes to" in tokenizer_difference(tok, other)
