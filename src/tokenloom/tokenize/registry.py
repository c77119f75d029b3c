"""``load_tokenizer(spec)``: one string names a tokenizer, on any process or machine.

The spec a tokenizer was loaded from is its ``name``, in canonical form (paths made absolute), so
``load_tokenizer(tok.name)`` in a spawned worker loads the same tokenizer; the ``vocab_hash`` in
its identity says whether it really is the same.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenloom.tokenize.base import Tokenizer, TokenizerError

__all__ = ["load_tokenizer", "ACCEPTED_SPECS"]

ACCEPTED_SPECS = (
    "'gpt2' (GPT-2 BPE, offline, from the openai-whisper package)",
    "a path to a tokenizer.json file (Hugging Face tokenizers)",
    "a directory holding tokenizer.json (+ tokenizer_config.json / special_tokens_map.json)",
    "'tiktoken:NAME' (a tiktoken encoding already in tiktoken's cache, e.g. tiktoken:cl100k_base)",
    "'tiktoken:/path/file.tiktoken' (the file of one of tiktoken's encodings)",
)
"""The forms ``load_tokenizer`` accepts, as its error messages list them."""


def load_tokenizer(spec: str | os.PathLike[str], *, num_threads: int | None = None) -> Tokenizer:
    """Load a tokenizer from its spec, without any network access.

    Args:
        spec: ``"gpt2"``; a path to a ``tokenizer.json``; a directory holding one;
            ``"tiktoken:NAME"``; or ``"tiktoken:/path/file.tiktoken"``. ``"gpt2"`` means the
            built-in GPT-2 even if a directory of that name exists (write ``./gpt2`` for it).
        num_threads: Threads per batch for tiktoken encodings (default: CPUs, at most 8).

    Returns:
        The tokenizer; its ``name`` is the canonical spec.

    Raises:
        TokenizerError: The spec is of no accepted form, names a missing file, or names a
            tiktoken encoding that is not available offline.
        MissingDependencyError: tiktoken, tokenizers or (for ``gpt2``) openai-whisper is not
            installed; the message names the install line.
    """
    text = os.fspath(spec)
    if text == "gpt2":
        from tokenloom.tokenize.tiktoken_backend import load_gpt2

        return load_gpt2(num_threads=num_threads)
    if text.startswith("tiktoken:"):
        from tokenloom.tokenize.tiktoken_backend import load_tiktoken_spec

        return load_tiktoken_spec(text[len("tiktoken:") :], num_threads=num_threads)
    path = Path(text).expanduser()
    if path.is_dir():
        from tokenloom.tokenize.hf import load_hf_dir

        return load_hf_dir(path, num_threads=num_threads)
    if path.is_file():
        if path.suffix == ".tiktoken":
            raise TokenizerError(
                f"{text!r} is a .tiktoken file; load it as 'tiktoken:{text}' (a .tiktoken file "
                "needs tiktoken's split pattern and special tokens)"
            )
        from tokenloom.tokenize.hf import load_hf_file

        return load_hf_file(path, num_threads=num_threads)
    looks_like_path = os.sep in text or text.endswith(".json") or text.startswith(".")
    reason = f"no file or directory {text!r} exists" if looks_like_path else "unknown spec"
    raise TokenizerError(
        f"cannot load tokenizer {text!r}: {reason}; accepted specs are: "
        + "; ".join(ACCEPTED_SPECS)
    )
