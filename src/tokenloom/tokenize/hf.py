"""Hugging Face ``tokenizers`` backend: a ``tokenizer.json`` file or a tokenizer directory.

A directory may also hold ``tokenizer_config.json`` and ``special_tokens_map.json`` (as
``transformers`` saves them); their ``eos_token`` / ``bos_token`` / ``pad_token`` name the special
ids. A bare ``tokenizer.json`` carries no such roles, so they are recognised by name among its
special added tokens (``<|endoftext|>``, ``</s>``, ``<eos>``, … see ``_KNOWN``).

Texts are encoded as plain text: special tokens are never added, and a special token's literal
text inside a document (say ``<|endoftext|>`` in a web page) is encoded as ordinary text, like
tiktoken's ``encode_ordinary``; only the loader inserts real EOS ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.errors import require
from tokenloom.tokenize.base import Tokenizer, TokenizerError, _as_id_list

__all__ = ["HFTokenizer", "load_hf_file", "load_hf_dir", "TOKENIZER_FILE", "CONFIG_FILES"]

TOKENIZER_FILE = "tokenizer.json"
"""The file a tokenizer directory must hold."""
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
"""Files read, in this order, for the special-token roles (the first to name a role wins)."""

_ROLES = ("eos", "bos", "pad")
_KNOWN = {
    "eos": ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "<|bos|>"),
    "pad": ("<|pad|>", "<pad>", "[PAD]"),
}
"""Special-token texts recognised for each role when no config file names it."""
_HASHED_PARTS = ("added_tokens", "normalizer", "pre_tokenizer", "model")
"""The parts of tokenizer.json that decide the ids, hence what ``vocab_hash`` digests."""


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` loaded from the JSON text of a ``tokenizer.json``."""

    def __init__(
        self,
        *,
        name: str,
        json_text: str,
        roles: dict[str, str | None],
        num_threads: int | None = None,
    ) -> None:
        """Build the tokenizer.

        Args:
            name: The canonical spec (the resolved file or directory path).
            json_text: The content of ``tokenizer.json``.
            roles: ``{"eos": text, "bos": text or None, "pad": text or None}`` from the config
                files; a ``None`` role is looked up among the special added tokens by name.
            num_threads: Kept for pickling; ``tokenizers`` sizes its own (Rayon) thread pool,
                set ``RAYON_NUM_THREADS`` to bound it.
        """
        tokenizers = require("tokenizers", extra="tokenize")
        try:
            self._json = json.loads(json_text)
            tok = tokenizers.Tokenizer.from_str(json_text)  # type: ignore[attr-defined]
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerError(f"{name} is not a valid tokenizer.json ({exc})") from exc
        tok.no_truncation()
        tok.no_padding()
        tok.encode_special_tokens = True  # a literal "<|endoftext|>" in a text is just text
        self._tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        ids = {role: self._role_id(name, role, roles.get(role), vocab) for role in _ROLES}
        if ids["eos"] is None:
            raise TokenizerError(
                f"tokenizer {name!r} has no EOS token: put a tokenizer_config.json with "
                f'"eos_token" beside tokenizer.json (and load the directory), or add one of '
                f"{list(_KNOWN['eos'])} as a special token"
            )
        super().__init__(
            name=name,
            vocab_size=max(vocab.values(), default=-1) + 1,
            eos_id=ids["eos"],
            bos_id=ids["bos"],
            pad_id=ids["pad"],
            num_threads=num_threads,
        )

    def _role_id(self, name: str, role: str, text: str | None, vocab: dict[str, int]) -> int | None:
        if text is not None:
            if text not in vocab:
                raise TokenizerError(
                    f"tokenizer {name!r}: its config names {text!r} as {role}_token, but that "
                    "token is not in tokenizer.json"
                )
            return vocab[text]
        specials = {t["content"] for t in self._json.get("added_tokens") or [] if t.get("special")}
        for candidate in _KNOWN[role]:
            if candidate in specials:
                return vocab[candidate]
        return None

    def _encode_chunks(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        encodings = self._tok.encode_batch_fast(texts, add_special_tokens=False)
        return [np.array(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Any) -> str:
        return self._tok.decode(_as_id_list(ids), skip_special_tokens=False)

    def _decode_many(self, docs: list[list[int]]) -> list[str]:
        return self._tok.decode_batch(docs, skip_special_tokens=False) if docs else []

    def json_text(self) -> str:
        """The ``tokenizer.json`` content this tokenizer was loaded from (re-serialized)."""
        return json.dumps(self._json, ensure_ascii=False, indent=1)

    def _canonical_bytes(self) -> bytes:
        parts = {key: self._json.get(key) for key in _HASHED_PARTS}
        text = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return text.encode()


def _token_text(value: Any) -> str | None:
    """A config's ``"eos_token"`` value: a string, an AddedToken dict, or null."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_roles(directory: Path) -> dict[str, str | None]:
    """Special-token roles named by the config files of a tokenizer directory.

    Raises:
        TokenizerError: A config file is not valid JSON.
    """
    roles: dict[str, str | None] = dict.fromkeys(_ROLES)
    for file_name in CONFIG_FILES:
        path = directory / file_name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise TokenizerError(f"{path} is not valid JSON ({exc})") from exc
        for role in _ROLES:
            if roles[role] is None:
                roles[role] = _token_text(config.get(f"{role}_token"))
    return roles


def load_hf_file(path: Path, *, num_threads: int | None = None) -> HFTokenizer:
    """Load a ``tokenizer.json`` file on its own (roles recognised by token text)."""
    path = path.expanduser().resolve()
    return HFTokenizer(
        name=str(path),
        json_text=path.read_text(encoding="utf-8"),
        roles=dict.fromkeys(_ROLES),
        num_threads=num_threads,
    )


def load_hf_dir(directory: Path, *, num_threads: int | None = None) -> HFTokenizer:
    """Load a tokenizer directory: ``tokenizer.json`` plus optional config files.

    Raises:
        TokenizerError: The directory has no ``tokenizer.json``.
    """
    directory = directory.expanduser().resolve()
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerError(
            f"tokenizer directory {directory} has no {TOKENIZER_FILE} (only the fast "
            "`tokenizers` format is read; save a transformers tokenizer with "
            "`tok.save_pretrained(dir)` or train one with tokenloom.tokenize.train_bpe)"
        )
    return HFTokenizer(
        name=str(directory),
        json_text=path.read_text(encoding="utf-8"),
        roles=read_roles(directory),
        num_threads=num_threads,
    )
