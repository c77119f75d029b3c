"""Train your own byte-level BPE (GPT-2 style) with Hugging Face ``tokenizers``.

The result is a tokenizer directory that :func:`~tokenloom.tokenize.load_tokenizer` (and
``transformers.PreTrainedTokenizerFast``) loads: ``tokenizer.json`` plus a
``tokenizer_config.json`` naming the EOS and pad tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenloom.errors import require
from tokenloom.tokenize.base import Tokenizer, TokenizerError
from tokenloom.tokenize.hf import CONFIG_FILES, TOKENIZER_FILE

__all__ = ["train_bpe", "EOS_TOKEN", "PAD_TOKEN"]

EOS_TOKEN = "<|endoftext|>"
"""End-of-text token of trained tokenizers (GPT-2's), id 0."""
PAD_TOKEN = "<|pad|>"
"""Padding token of trained tokenizers, id 1: its own id, so padding never reads as EOS."""


def train_bpe(
    texts: Iterable[str],
    *,
    vocab_size: int,
    out_dir: str | os.PathLike[str],
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a byte-level BPE on ``texts`` and save it as a tokenizer directory.

    Byte-level (GPT-2's pre-tokenizer and decoder, no prefix space): every text encodes, with
    no unknown token, and decodes back exactly. Training is deterministic for the same texts in
    the same order.

    Args:
        texts: Training texts, read once.
        vocab_size: Target vocabulary size including the 256 byte tokens and the two special
            tokens; the result may be smaller when the texts offer fewer merges.
        out_dir: Directory to write ``tokenizer.json`` and ``tokenizer_config.json`` into
            (created when missing; those two files are overwritten).
        min_frequency: A pair must occur at least this often to be merged.

    Returns:
        The trained tokenizer, loaded back from ``out_dir`` (its ``name`` is that directory).

    Raises:
        TokenizerError: ``vocab_size`` below 258 (256 bytes + 2 special tokens).
        MissingDependencyError: ``tokenizers`` is not installed.
    """
    if vocab_size < 258:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs 256 byte "
            "tokens plus <|endoftext|> and <|pad|>, so at least 258"
        )
    tk = require("tokenizers", extra="tokenize")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tk.Tokenizer(models.BPE())  # type: ignore[attr-defined]
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "bos_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out / CONFIG_FILES[0]).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    from tokenloom.tokenize.registry import load_tokenizer

    return load_tokenizer(out)
