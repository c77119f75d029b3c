"""A tokenloom tokenizer as Hugging Face tokenizer files, and whether two tokenizers are one.

``transformers`` (and so ``lm-eval``) reads a ``tokenizer.json`` beside a
``tokenizer_config.json``. A ``tokenizers`` tokenizer is copied as it is; a tiktoken encoding
(GPT-2's r50k_base among them) is rewritten as the byte-level BPE it is: the vocabulary in
GPT-2's byte-to-unicode alphabet, one merge per multi-byte token in rank order, and
``ignore_merges`` (a pre-token that is itself in the vocabulary is one token, as tiktoken does).

A post-processor (one that adds BOS or EOS) is left out: the column's ids have none.
Whatever the route, the files are only written when :func:`tokenizer_difference` finds that
they give the same ids as the original: on every id (decoded alone) and on :data:`PROBES`.
"""

from __future__ import annotations

import json
from typing import Any

from tokenloom.errors import require
from tokenloom.tokenize.base import Tokenizer, TokenizerError

__all__ = ["PROBES", "hf_tokenizer_files", "tokenizer_difference"]

PROBES = (
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\tand\n\nnew lines \r\n and trailing spaces   ",
    "I'm sure they'll say we've done it; she'd've known. DON'T SHOUT",
    "Numbers 1234567890, 3.14159, 1,000,000 and 2026-12-01T23:25:00Z",
    "Unicode: café, naïve, Ωμέγα, Привет, 你好世界, こんにちは, 안녕하세요, עברית, العربية",
    "Emoji 👩‍👩‍👧‍👦 🎉🎉 and symbols © ® ™ ∑ ∫ √ ≤ ≥ → ⇒ ∞",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n\n\n",
    "<|endoftext|> literal special text, <s> </s> [PAD] <pad>",
    "a" * 300 + " " + "ab" * 150 + " " + "\u00a0\u2003\u200b zero-width",
    "https://example.com/path?query=1&b=2#frag user@example.org",
)
"""Texts two tokenizers must encode alike (with every id decoded alike) to count as one:
whitespace runs, contractions, digits, scripts, emoji, code, special-token text."""


def tokenizer_difference(a: Tokenizer, b: Tokenizer) -> str | None:
    """How ``b`` gives other ids than ``a`` (the first difference found), or ``None``.

    Equal vocabulary hashes mean the same tokenizer. Otherwise the two must have the same
    vocabulary size and EOS id, decode every id to the same text, and encode :data:`PROBES`
    to the same ids.
    """
    if a.vocab_hash == b.vocab_hash:
        return None
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size:,} ids against {b.vocab_size:,}"
    if a.eos_id != b.eos_id:
        return f"EOS id {a.eos_id} against {b.eos_id}"
    for i, (x, y) in enumerate(zip(_each_id(a), _each_id(b), strict=True)):
        if x != y:
            return f"id {i} decodes to {x!r} against {y!r}"
    for text in PROBES:
        x, y = a.encode(text), b.encode(text)
        if x != y:
            return f"{text[:40]!r} encodes to {x[:12]}… against {y[:12]}…"
    return None


def _each_id(tok: Tokenizer) -> list[str]:
    """Every id decoded alone; an id with no token (a gap before the special tokens, as in
    tiktoken's cl100k_base) decodes to ``""``."""
    ids = [[i] for i in range(tok.vocab_size)]
    try:
        return tok.decode_batch(ids)  # type: ignore[return-value]  # no None in a list of ids
    except Exception:  # noqa: BLE001 - a backend refusing an id with no token: go one by one
        out = []
        for one in ids:
            try:
                out.append(tok.decode(one))
            except Exception:  # noqa: BLE001
                out.append("")
        return out


def hf_tokenizer_files(tok: Tokenizer, *, max_length: int) -> tuple[dict[str, str], str | None]:
    """The ``tokenizer.json`` and ``tokenizer_config.json`` texts that give ``tok``'s ids.

    Args:
        tok: The token column's tokenizer.
        max_length: The model's longest input (``model_max_length`` in the config).

    Returns:
        ``(files, None)``, file name -> text; or ``({}, reason)`` when ``tok`` cannot be written
        as such files (the reason says why, for the caller to report).
    """
    from tokenloom.tokenize.hf import HFTokenizer
    from tokenloom.tokenize.tiktoken_backend import TiktokenTokenizer

    if isinstance(tok, HFTokenizer):
        spec = json.loads(tok.json_text())
        # The column's ids carry no added BOS/EOS: a post-processor adding them would give
        # transformers' encode() ids the model never saw (it is not part of the vocab hash).
        spec["post_processor"] = None
        text = json.dumps(spec, ensure_ascii=False, indent=1)
    elif isinstance(tok, TiktokenTokenizer):
        try:
            text = _byte_level_bpe(tok)
        except ValueError as exc:
            return {}, f"its byte-level BPE form cannot be built ({exc})"
    else:
        return {}, f"a {type(tok).__name__} has no Hugging Face form"
    roles = {"eos": tok.eos_id, "bos": tok.bos_id, "pad": tok.pad_id}
    names = {role: (tok.decode([i]) if i is not None else None) for role, i in roles.items()}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    for role, name in names.items():
        if name is not None:
            config[f"{role}_token"] = name
    files = {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=1)}
    try:
        copy = HFTokenizer(name=f"{tok.name} (exported)", json_text=text, roles=names)
    except TokenizerError as exc:
        return {}, f"its tokenizer.json form does not load back ({exc})"
    why = tokenizer_difference(tok, copy)
    if why is not None:
        return {}, f"its tokenizer.json form gives other ids ({why})"
    return files, None


def _byte_level_bpe(tok: Any) -> str:
    """A tiktoken encoding as a ``tokenizers`` byte-level BPE, serialized."""
    tokenizers = require("tokenizers", extra="tokenize")
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

    ranks: dict[bytes, int] = tok._ranks
    alphabet = _bytes_to_unicode()

    def spelled(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spelled(token): rank for token, rank in ranks.items()}
    clash = [text for text in tok._special if text in vocab]
    if clash:
        raise ValueError(f"special token {clash[0]!r} is also an ordinary token")
    vocab |= tok._special  # at their own ids (tiktoken's may leave gaps after the ranks)
    merges: list[tuple[int, str, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, spelled(left), spelled(right)))
    merges.sort(key=lambda m: m[0])  # a merge's priority is its result's rank (stable: ties)
    model = models.BPE(vocab, [(a, b) for _, a, b in merges], ignore_merges=True, fuse_unk=False)
    out = tokenizers.Tokenizer(model)
    out.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(tok._pat_str), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    out.decoder = decoders.ByteLevel()
    for text, i in sorted(tok._special.items(), key=lambda kv: kv[1]):
        if out.add_special_tokens([AddedToken(text, special=True, normalized=False)]) != 1:
            raise ValueError(f"special token {text!r} cannot be added")
        if out.token_to_id(text) != i:
            raise ValueError(f"special token {text!r} got id {out.token_to_id(text)}, not {i}")
    return out.to_str()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values onto printable characters (byte-level BPE's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}
