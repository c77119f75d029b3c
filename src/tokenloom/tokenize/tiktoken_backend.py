"""tiktoken-backed tokenizers: GPT-2 built offline, and ``tiktoken:NAME`` / ``tiktoken:/file``.

GPT-2's byte-level BPE is the r50k_base ``.tiktoken`` file, which the ``openai-whisper`` package
ships as ``whisper/assets/gpt2.tiktoken``. We find that file with ``importlib.util.find_spec``
(whisper itself is never imported: it needs torch) and check its SHA-256 against r50k_base's.

tiktoken's own registry downloads encodings on first use. ``tiktoken:NAME`` only ever reads
tiktoken's cache: while the encoding is constructed, tiktoken's file reader is swapped for one
that refuses URLs, so a cache miss becomes a clear error instead of a download.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.errors import MissingDependencyError, require
from tokenloom.tokenize.base import Tokenizer, TokenizerError, _as_id_list

__all__ = [
    "GPT2_PATTERN",
    "R50K_SHA256",
    "WHISPER_INSTALL",
    "TiktokenTokenizer",
    "gpt2_bpe_file",
    "load_gpt2",
    "load_tiktoken_spec",
]

GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
"""GPT-2's pre-tokenizer regex in tiktoken's faster, equivalent form. The original is
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``."""
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
"""SHA-256 of r50k_base.tiktoken (= whisper's gpt2.tiktoken), as tiktoken itself pins it."""
WHISPER_INSTALL = "pip install --no-deps openai-whisper==20250625"
"""Installs the GPT-2 BPE file (data only: whisper's code and its torch dependency are unused)."""
ENDOFTEXT = "<|endoftext|>"


def _whisper_dir() -> Path | None:
    """The installed ``whisper`` package directory, found without importing it."""
    spec = find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def gpt2_bpe_file() -> Path:
    """Locate GPT-2's ``gpt2.tiktoken`` inside the installed ``openai-whisper`` package.

    Raises:
        MissingDependencyError: whisper is not installed or lacks the file; names the install.
    """
    pkg = _whisper_dir()
    path = None if pkg is None else pkg / "assets" / "gpt2.tiktoken"
    if path is None or not path.is_file():
        what = "is not installed" if pkg is None else f"has no {path}"
        raise MissingDependencyError(
            f"the GPT-2 tokenizer reads gpt2.tiktoken from the openai-whisper package, which "
            f"{what}; run `{WHISPER_INSTALL}` (or `pip install --no-deps -r "
            "requirements/assets.txt`); --no-deps on purpose: only that data file is read"
        )
    return path


def parse_tiktoken_bpe(data: bytes, *, source: str) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (``base64(token) rank`` per line) into token bytes -> rank."""
    ranks: dict[bytes, int] = {}
    try:
        for line in data.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    except ValueError as exc:
        raise TokenizerError(f"{source} is not a .tiktoken file ({exc})") from exc
    return ranks


class TiktokenTokenizer(Tokenizer):
    """A tiktoken ``Encoding``; encodes with ``encode_to_numpy`` on a thread pool."""

    def __init__(
        self,
        *,
        name: str,
        pat_str: str,
        mergeable_ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        explicit_n_vocab: int | None = None,
        num_threads: int | None = None,
    ) -> None:
        tiktoken = require("tiktoken", extra="tokenize")
        self._pat_str = pat_str
        self._ranks = mergeable_ranks
        self._special = dict(special_tokens)
        self._enc = tiktoken.Encoding(  # type: ignore[attr-defined]
            name=name,
            pat_str=pat_str,
            mergeable_ranks=mergeable_ranks,
            special_tokens=special_tokens,
            explicit_n_vocab=explicit_n_vocab,
        )
        if ENDOFTEXT not in special_tokens:
            raise TokenizerError(
                f"tiktoken encoding {name!r} has no {ENDOFTEXT} token to use as EOS "
                f"(its special tokens: {sorted(special_tokens)})"
            )
        super().__init__(
            name=name,
            vocab_size=self._enc.n_vocab,
            eos_id=special_tokens[ENDOFTEXT],
            num_threads=num_threads,
        )

    def _encode_one(self, text: str) -> np.ndarray:
        # encode_to_numpy without special-token handling == encode_ordinary, minus the list.
        try:
            return self._enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:
            # lone surrogates: the same fix-up tiktoken's encode_ordinary applies
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self._enc.encode_to_numpy(text, disallowed_special=())

    def _encode_chunks(self, texts: list[str]) -> list[np.ndarray]:
        if self.num_threads == 1 or len(texts) < 2:
            return [self._encode_one(t) for t in texts]
        with ThreadPoolExecutor(self.num_threads) as pool:  # the Rust encoder releases the GIL
            return list(pool.map(self._encode_one, texts))

    def decode(self, ids: Any) -> str:
        return self._enc.decode(_as_id_list(ids), errors="replace")

    def _decode_many(self, docs: list[list[int]]) -> list[str]:
        return self._enc.decode_batch(docs, errors="replace", num_threads=self.num_threads)

    def _canonical_bytes(self) -> bytes:
        # The .tiktoken layout in rank order, after the split pattern and the special tokens.
        head = json.dumps(
            {"format": "tiktoken/1", "pat_str": self._pat_str, "special_tokens": self._special},
            sort_keys=True,
            ensure_ascii=False,
        )
        lines = [head.encode()]
        for token, rank in sorted(self._ranks.items(), key=lambda kv: kv[1]):
            lines.append(base64.b64encode(token) + b" " + str(rank).encode())
        return b"\n".join(lines) + b"\n"


def load_gpt2(*, num_threads: int | None = None) -> TiktokenTokenizer:
    """GPT-2 (r50k_base): 50,257 ids, ``<|endoftext|>`` = 50256, built from whisper's file."""
    path = gpt2_bpe_file()
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != R50K_SHA256:
        raise TokenizerError(
            f"{path} has SHA-256 {digest[:12]}…, not GPT-2's r50k_base ({R50K_SHA256[:12]}…); "
            f"reinstall it with `{WHISPER_INSTALL}`"
        )
    return TiktokenTokenizer(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=parse_tiktoken_bpe(data, source=str(path)),
        special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=50257,
        num_threads=num_threads,
    )


class _Offline(Exception):
    """tiktoken asked for a file we will not download (or a hash we were not given)."""


_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _patched_tiktoken_load(attr: str, replacement: Any) -> Iterator[None]:
    """Swap ``tiktoken.load.<attr>`` for ``replacement`` while an encoding is constructed."""
    import tiktoken.load

    with _PATCH_LOCK:
        original = getattr(tiktoken.load, attr)
        setattr(tiktoken.load, attr, replacement)
        try:
            yield
        finally:
            setattr(tiktoken.load, attr, original)


def _constructors() -> dict[str, Any]:
    require("tiktoken", extra="tokenize")
    import tiktoken.registry

    names = tiktoken.registry.list_encoding_names()  # also fills ENCODING_CONSTRUCTORS
    return {n: tiktoken.registry.ENCODING_CONSTRUCTORS[n] for n in names}  # type: ignore[index]


def _named(name: str, num_threads: int | None) -> TiktokenTokenizer:
    constructors = _constructors()
    if name not in constructors:
        raise TokenizerError(
            f"tiktoken has no encoding {name!r}; it knows {sorted(constructors)} "
            "(or pass a file: `tiktoken:/path/NAME.tiktoken`)"
        )
    import tiktoken.load

    read_file = tiktoken.load.read_file

    def refuse_downloads(path: str) -> bytes:
        # tiktoken's cached reader calls this only on a cache miss
        if "://" in path:
            raise _Offline(path)
        return read_file(path)

    try:
        with _patched_tiktoken_load("read_file", refuse_downloads):
            params = constructors[name]()
    except _Offline as exc:
        raise TokenizerError(
            f"tiktoken encoding {name!r} is not available offline: its file {exc} is not in "
            "tiktoken's cache (TIKTOKEN_CACHE_DIR, else <tmp>/data-gym-cache) and tokenloom "
            f"never downloads; use `tiktoken:/path/{name}.tiktoken` with a copy of the file"
            + (", or the spec `gpt2`" if name in ("gpt2", "r50k_base") else "")
        ) from None
    return _from_params(f"tiktoken:{name}", params, num_threads)


def _from_file(path: Path, num_threads: int | None) -> TiktokenTokenizer:
    if not path.is_file():
        raise TokenizerError(f"tiktoken file {path} does not exist")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()

    def serve(blobpath: str, expected_hash: str | None = None) -> bytes:
        if expected_hash != digest:
            raise _Offline(blobpath)
        return data

    # A .tiktoken file holds only the ranks; the split pattern and special tokens come from the
    # registered encoding that pins the same SHA-256.
    for constructor in _constructors().values():
        try:
            with _patched_tiktoken_load("read_file_cached", serve):
                params = constructor()
        except _Offline:
            continue
        return _from_params(f"tiktoken:{path}", params, num_threads)
    raise TokenizerError(
        f"{path} (SHA-256 {digest[:12]}…) is not the file of any tiktoken encoding "
        f"({', '.join(_constructors())}); a .tiktoken file carries no split pattern or special "
        "tokens, so only those files are accepted; for your own BPE pass a tokenizer.json"
    )


def _from_params(spec: str, params: dict[str, Any], num_threads: int | None) -> TiktokenTokenizer:
    return TiktokenTokenizer(
        name=spec,
        pat_str=params["pat_str"],
        mergeable_ranks=params["mergeable_ranks"],
        special_tokens=params["special_tokens"],
        explicit_n_vocab=params.get("explicit_n_vocab"),
        num_threads=num_threads,
    )


def load_tiktoken_spec(rest: str, *, num_threads: int | None = None) -> TiktokenTokenizer:
    """Load the part after ``tiktoken:``: an encoding name (from cache only) or a file path.

    Raises:
        TokenizerError: Unknown name, not in the cache, or a file of no known encoding.
        MissingDependencyError: tiktoken is not installed.
    """
    if not rest:
        raise TokenizerError(
            "`tiktoken:` needs an encoding name or a file, e.g. tiktoken:o200k_base"
        )
    if "/" in rest or rest.endswith(".tiktoken") or Path(rest).is_file():
        return _from_file(Path(rest).expanduser().resolve(), num_threads)
    return _named(rest, num_threads)
