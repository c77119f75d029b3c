"""tokenizer.json files and directories (Hugging Face tokenizers), and train_bpe."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pyarrow as pa
import pytest

from tokenloom.tokenize import TokenizerError, load_tokenizer, roundtrip_failures, train_bpe


def test_trained_dir_loads_with_roles(bpe_dir: Path) -> None:
    assert sorted(p.name for p in bpe_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    tok = load_tokenizer(bpe_dir)
    assert tok.name == str(bpe_dir.resolve())
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (0, 1, None)
    assert tok.vocab_size == 1000
    assert tok.id_type == pa.uint16()
    assert tok.decode([tok.eos_id]) == "<|endoftext|>"
    assert tok.decode([tok.pad_id]) == "<|pad|>"


def test_file_form_recognises_roles_by_name(bpe_dir: Path) -> None:
    by_dir = load_tokenizer(bpe_dir)
    by_file = load_tokenizer(str(bpe_dir / "tokenizer.json"))
    assert by_file.name == str((bpe_dir / "tokenizer.json").resolve())
    assert {**by_file.identity(), "name": None} == {**by_dir.identity(), "name": None}
    text = ["Il était une fois — ¿qué? def f(x): return x"]
    assert by_file.encode_batch(text).equals(by_dir.encode_batch(text))


def test_identity_stable_across_loads(bpe_dir: Path) -> None:
    assert load_tokenizer(bpe_dir).identity() == load_tokenizer(str(bpe_dir)).identity()


def test_train_bpe_is_deterministic(bpe_texts: list[str], bpe_dir: Path, tmp_path: Path) -> None:
    again = train_bpe(bpe_texts, vocab_size=1000, out_dir=tmp_path / "again")
    assert again.vocab_hash == load_tokenizer(bpe_dir).vocab_hash
    # and in another process, whose hash maps are seeded differently
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        other = pool.apply(
            train_bpe, (bpe_texts,), {"vocab_size": 1000, "out_dir": tmp_path / "spawned"}
        )
    assert other.vocab_hash == again.vocab_hash


def test_trained_bpe_roundtrips_real_text(bpe_dir: Path, corpus) -> None:
    tok = load_tokenizer(bpe_dir)
    texts = corpus.pick(
        wiki_en=300, wiki_es=300, wiki_fr=300, kjv=30, python_stdlib=30, shakespeare_gutenberg=1
    )
    assert roundtrip_failures(tok, texts) == []


def test_special_text_is_plain_text(bpe_dir: Path) -> None:
    tok = load_tokenizer(bpe_dir)
    ids = tok.encode_batch(["a<|endoftext|>b"]).to_pylist()[0]
    assert tok.eos_id not in ids
    assert tok.decode(ids) == "a<|endoftext|>b"


def test_empty_and_null(bpe_dir: Path) -> None:
    tok = load_tokenizer(bpe_dir)
    assert tok.encode_batch(["", None]).to_pylist() == [[], None]
    assert tok.encode_batch([None]).to_pylist() == [None]


def _word_level(tmp_path: Path, n_words: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(n_words)}
    vocab["[UNK]"] = n_words
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_vocab_over_65536_gives_int32(tmp_path: Path) -> None:
    tok = load_tokenizer(_word_level(tmp_path, 70_000))
    assert tok.vocab_size == 70_002
    assert tok.eos_id == 70_001
    assert tok.id_type == pa.int32()
    out = tok.encode_batch(["w69999 w1", ""])
    assert out.type == pa.list_(pa.int32())
    assert out.to_pylist() == [[69_999, 1], []]


def test_roles_from_config_files(tmp_path: Path) -> None:
    _word_level(tmp_path, 10)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "w3", "__type": "AddedToken"}, "pad_token": None})
    )
    (tmp_path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "w9", "bos_token": "w1", "pad_token": "w2"})
    )
    tok = load_tokenizer(tmp_path)
    # tokenizer_config.json wins; special_tokens_map.json fills what it leaves unset
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (3, 1, 2)


def test_config_naming_a_missing_token(tmp_path: Path) -> None:
    _word_level(tmp_path, 10)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(TokenizerError, match="'</s>' as eos_token, but that token is not in"):
        load_tokenizer(tmp_path)


def test_no_eos_token(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    with pytest.raises(TokenizerError, match="has no EOS token"):
        load_tokenizer(path)


def test_dir_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_invalid_tokenizer_json(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": 1}')
    with pytest.raises(TokenizerError, match="is not a valid tokenizer.json"):
        load_tokenizer(path)


def test_train_bpe_rejects_tiny_vocab(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="at least 258"):
        train_bpe(["abc"], vocab_size=100, out_dir=tmp_path)


def _regex_bomb_tokenizer(path: Path) -> Path:
    """A tokenizer.json that loads, but whose Split regex ``(a+)+b`` exceeds Oniguruma's retry
    limit on a long run of ``a`` (the Rust side panics: a ``BaseException`` in Python)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"a": 0, "b": 1, "<|endoftext|>": 2, "[UNK]": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+b"), behavior="isolated")
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path


def test_tokenizer_failing_at_encode_time_is_status_1_naming_it_and_the_row(
    tmp_path: Path,
) -> None:
    from tests.conftest import run_cli, write_jsonl
    from tokenloom.ingest import ingest
    from tokenloom.table import Table

    spec = _regex_bomb_tokenizer(tmp_path / "tokenizer.json")
    rows = [{"text": "a" * 40 if i == 7 else f"word {i}"} for i in range(30)]
    write_jsonl(tmp_path / "d.jsonl", rows)
    uri = str(tmp_path / "t.lance")
    version = ingest([tmp_path / "d.jsonl"], uri, progress=False).version
    env = {"RUST_BACKTRACE": "0"}
    # The round-trip check before the backfill meets the row first (in this process).
    proc = run_cli("tokenize", "--table", uri, "--tokenizer", str(spec), env=env)
    assert proc.returncode == 1, proc.stderr
    assert f"row id 7: tokenizer '{spec}' cannot encode a text" in proc.stderr
    assert "PanicException" in proc.stderr and "Nothing was committed" in proc.stderr
    # Without that check the backfill meets it: in spawned workers and inline.
    for workers in ("2", "0"):
        proc = run_cli(
            "tokenize", "--table", uri, "--tokenizer", str(spec), "--allow-lossy",
            "--workers", workers, env=env,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert f"spec='{spec}'" in proc.stderr and "failed on row id 7: EncodeError" in proc.stderr
        assert "please report" not in proc.stderr and "Traceback" not in proc.stderr
    assert Table.open(uri).latest_version == version
