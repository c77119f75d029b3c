"""load_tokenizer's spec forms and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenloom.tokenize import ACCEPTED_SPECS, TokenizerError, load_tokenizer


def test_unknown_spec_lists_the_accepted_forms() -> None:
    with pytest.raises(TokenizerError) as err:
        load_tokenizer("bert-base-uncased")
    message = str(err.value)
    assert "unknown spec" in message
    for form in ACCEPTED_SPECS:
        assert form in message


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no file or directory"):
        load_tokenizer(str(tmp_path / "nope" / "tokenizer.json"))


def test_empty_tiktoken_spec() -> None:
    with pytest.raises(TokenizerError, match="needs an encoding name or a file"):
        load_tokenizer("tiktoken:")


def test_missing_tiktoken_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(f"tiktoken:{tmp_path / 'x.tiktoken'}")


def test_gpt2_spec_wins_over_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bpe_dir: Path
) -> None:
    import shutil

    shutil.copytree(bpe_dir, tmp_path / "gpt2")
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer("gpt2").vocab_size == 50257
    assert load_tokenizer("./gpt2").vocab_size == 1000
