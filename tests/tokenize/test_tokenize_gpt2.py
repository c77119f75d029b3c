"""GPT-2 built offline from the openai-whisper package: ids, identity, workers, round-trip."""

from __future__ import annotations

import multiprocessing
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tokenloom.errors import MissingDependencyError
from tokenloom.tokenize import (
    Tokenizer,
    TokenizerError,
    load_tokenizer,
    roundtrip_failures,
    tiktoken_backend,
)
from tokenloom.tokenize.base import _restore

GPT2_VOCAB_HASH = "7245435d774b28b13ad5b38bbda118cd3bf11e5bb4e849817a73db4609e1921c"
"""Pinned: the hash must be the same on every machine, so a changed recipe shows up here."""


def test_gpt2_known_ids(gpt2: Tokenizer) -> None:
    out = gpt2.encode_batch(["Hello world"])
    assert out.type == pa.list_(pa.uint16())
    assert out.to_pylist() == [[15496, 995]]
    assert gpt2.id_type == pa.uint16()
    assert (gpt2.vocab_size, gpt2.eos_id, gpt2.bos_id, gpt2.pad_id) == (50257, 50256, None, None)
    assert gpt2.name == "gpt2"
    assert gpt2.decode([15496, 995]) == "Hello world"
    assert gpt2.decode([50256]) == "<|endoftext|>"


def test_gpt2_identity_is_pinned_and_stable(gpt2: Tokenizer) -> None:
    again = load_tokenizer("gpt2")
    assert again is not gpt2
    assert (
        again.identity()
        == gpt2.identity()
        == {
            "name": "gpt2",
            "vocab_size": 50257,
            "vocab_hash": GPT2_VOCAB_HASH,
            "eos_id": 50256,
            "bos_id": None,
            "pad_id": None,
        }
    )


def test_empty_null_and_special_text(gpt2: Tokenizer) -> None:
    out = gpt2.encode_batch(["", None, "<|endoftext|>", "a"])
    assert out.to_pylist() == [[], None, [27, 91, 437, 1659, 5239, 91, 29], [64]]
    assert out.null_count == 1
    # the loader appends EOS; a document's own text never yields it
    assert 50256 not in out.flatten().to_numpy()
    assert gpt2.encode_batch([]).to_pylist() == []
    assert gpt2.encode_batch([]).type == pa.list_(pa.uint16())


def test_arrow_input_matches_list_input(gpt2: Tokenizer, corpus) -> None:
    texts = corpus.pick(wiki_en=5, wiki_fr=3, kjv=3, python_stdlib=3)
    chunked = pa.chunked_array([pa.array(texts[:7]), pa.array(texts[7:])])
    expected = gpt2.encode_batch(texts)
    assert gpt2.encode_batch(pa.array(texts)).equals(expected)
    assert gpt2.encode_batch(pa.array(texts, type=pa.large_string())).equals(expected)
    assert gpt2.encode_batch(pa.array(texts).slice(3)).equals(expected.slice(3))
    assert gpt2.encode_batch(chunked).equals(expected)


def test_fast_path_matches_tiktoken_reference(gpt2: Tokenizer, corpus) -> None:
    """encode_batch (numpy buffers, threads) == tiktoken's encode_ordinary, text by text."""
    texts = corpus.pick(
        wiki_en=200, wiki_es=200, wiki_fr=200, kjv=20, python_stdlib=20, shakespeare_folio=2
    )
    out = gpt2.encode_batch(texts)
    enc = gpt2._enc  # type: ignore[attr-defined]
    for got, text in zip(out.to_pylist(), texts, strict=True):
        assert got == enc.encode_ordinary(text)
    one_thread = load_tokenizer("gpt2", num_threads=1)
    assert one_thread.encode_batch(texts).equals(out)


def test_pickles_as_its_spec(gpt2: Tokenizer) -> None:
    blob = pickle.dumps(gpt2)
    assert len(blob) < 500  # the spec and the hash, not 50k merges
    assert pickle.loads(blob).identity() == gpt2.identity()


def test_restore_refuses_another_vocabulary() -> None:
    with pytest.raises(TokenizerError, match="files behind the spec differ"):
        _restore("gpt2", 1, "0" * 64)


def test_identity_and_ids_in_a_spawned_worker(gpt2: Tokenizer, corpus) -> None:
    texts = corpus.pick(wiki_es=3, python_stdlib=2)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        identity = pool.apply(Tokenizer.identity, (gpt2,))
        ids = pool.apply(gpt2.encode_batch, (texts,))
    assert identity == gpt2.identity()
    assert ids.equals(gpt2.encode_batch(texts))


@pytest.mark.slow
def test_roundtrip_whole_corpus(gpt2: Tokenizer, corpus) -> None:
    """Byte-level BPE: every document of every source (es/fr/code included) comes back exactly."""
    assert len(corpus.texts) > 28_000
    assert roundtrip_failures(gpt2, corpus.texts) == []


def test_missing_whisper_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiktoken_backend, "_whisper_dir", lambda: None)
    with pytest.raises(MissingDependencyError) as err:
        load_tokenizer("gpt2")
    assert "pip install --no-deps openai-whisper==20250625" in str(err.value)


def test_whisper_without_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tiktoken_backend, "_whisper_dir", lambda: tmp_path)
    with pytest.raises(MissingDependencyError, match="openai-whisper==20250625"):
        load_tokenizer("gpt2")


def test_whisper_file_with_another_hash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "assets").mkdir()
    original = tiktoken_backend.gpt2_bpe_file()
    lines = original.read_bytes().splitlines(keepends=True)
    (tmp_path / "assets" / "gpt2.tiktoken").write_bytes(b"".join(lines[:-1]))
    monkeypatch.setattr(tiktoken_backend, "_whisper_dir", lambda: tmp_path)
    with pytest.raises(TokenizerError, match="not GPT-2's r50k_base"):
        load_tokenizer("gpt2")


def test_missing_tiktoken_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    with pytest.raises(MissingDependencyError, match=r"tokenloom\[tokenize\]"):
        load_tokenizer("gpt2")


def test_tiktoken_file_spec(gpt2: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "r50k_base.tiktoken"
    shutil.copy(tiktoken_backend.gpt2_bpe_file(), path)
    tok = load_tokenizer(f"tiktoken:{path}")
    assert tok.name == f"tiktoken:{path.resolve()}"
    assert tok.vocab_hash == gpt2.vocab_hash
    assert tok.encode_batch(["Hello world"]).to_pylist() == [[15496, 995]]
    assert load_tokenizer(tok.name).identity() == tok.identity()


def test_tiktoken_file_of_no_known_encoding(tmp_path: Path) -> None:
    path = tmp_path / "mine.tiktoken"
    path.write_bytes(b"YQ== 0\nYg== 1\n")
    with pytest.raises(TokenizerError, match="not the file of any tiktoken encoding"):
        load_tokenizer(f"tiktoken:{path}")
    with pytest.raises(TokenizerError, match="load it as 'tiktoken:"):
        load_tokenizer(str(path))


def test_tiktoken_name_from_cache_only(
    gpt2: Tokenizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import hashlib

    import tiktoken.load

    def no_network(path: str) -> bytes:
        raise AssertionError(f"tried to read {path}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)  # ours must refuse first
    with pytest.raises(TokenizerError, match="not available offline"):
        load_tokenizer("tiktoken:cl100k_base")
    monkeypatch.undo()

    # a warm cache, as tiktoken itself lays it out: the file under sha1(url)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    url = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
    cached = tmp_path / hashlib.sha1(url.encode()).hexdigest()
    shutil.copy(tiktoken_backend.gpt2_bpe_file(), cached)
    tok = load_tokenizer("tiktoken:r50k_base")
    assert tok.name == "tiktoken:r50k_base"
    assert tok.vocab_hash == gpt2.vocab_hash
    ids = tok.encode_batch(["Hola, ¿qué tal?"]).to_pylist()
    assert ids == gpt2.encode_batch(["Hola, ¿qué tal?"]).to_pylist()


def test_unknown_tiktoken_name() -> None:
    with pytest.raises(TokenizerError, match="tiktoken has no encoding 'nope'"):
        load_tokenizer("tiktoken:nope")


def test_ids_fit_uint16_exactly(gpt2: Tokenizer, corpus) -> None:
    out = gpt2.encode_batch(corpus.of("python_stdlib", 20))
    values = out.flatten().to_numpy()
    assert values.dtype == np.uint16
    assert int(values.max()) < gpt2.vocab_size
