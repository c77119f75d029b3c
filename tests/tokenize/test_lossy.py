"""A lossy tokenizer is counted in full and refused before anything is committed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli, write_jsonl
from tokenloom.ingest import ingest
from tokenloom.table import Table

ROOT = Path(__file__).resolve().parents[2]


_run = run_cli


def _lossy(tmp_path: Path) -> Path:
    """A word-level tokenizer that knows two words: every other text comes back as [UNK]."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    words = ["hello", "world", "[UNK]", "<|endoftext|>"]
    tok = HF(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["<|endoftext|>"])
    out = tmp_path / "lossy"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    return out


def test_every_failure_is_counted_and_a_lossy_tokenizer_is_refused(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "a.jsonl", [{"text": f"row number {i} is not hello"} for i in range(300)]
    )
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    before = Table.open(uri).version
    tok = str(_lossy(tmp_path))

    refused = _run("tokenize", "--table", uri, "--tokenizer", tok, "--workers", "0")
    assert refused.returncode == 1, refused.stderr
    assert "256 of 256 sampled rows do not decode back" in refused.stderr
    assert "--allow-lossy" in refused.stderr and "nothing was committed" in refused.stderr
    assert Table.open(uri).version == before
    assert "input_ids" not in Table.open(uri).schema().names

    kept = _run(
        "tokenize", "--table", uri, "--tokenizer", tok, "--workers", "0", "--allow-lossy", "--json"
    )
    assert kept.returncode == 0, kept.stderr
    res = json.loads(kept.stdout)
    assert res["roundtrip_checked"] == 256 and res["roundtrip_failed"] == 256
    assert len(res["roundtrip_failures"]) == 20  # examples only; the count is complete
    text = _run("tokenize", "--table", uri, "--tokenizer", tok, "--workers", "0", "--allow-lossy")
    assert "round-trip: 0/256 sampled rows decode back" in text.stdout
