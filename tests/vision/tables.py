"""The bundled image set as a tokenized image+text table, built through the CLI."""

from __future__ import annotations

import json

from tests.conftest import invoke
from tokenloom.vision.images import build_image_set


def image_table(
    folder, *, bad_images: int = 2, tokenize: bool = True, max_side: int = 96, vocab: int = 0
) -> str:
    """``folder/img.lance``: the bundled samples (+ ``bad_images`` corrupt ones), with
    ``prompt_ids`` and ``response_ids`` made by ``tokenloom tokenize`` (gpt2, or with ``vocab``
    a byte-level BPE of that size trained on the table: a small model trains faster)."""
    path = build_image_set(str(folder), max_side=max_side, bad_images=bad_images)
    uri = str(folder / "img.lance")
    cols = "prompt,response,width,height"
    got = json.loads(invoke("ingest", path, "--table", uri, "--columns", cols, "--json"))
    assert got["rows_written"] > 0
    tokenizer = "gpt2"
    if vocab:
        tokenizer = str(folder / "bpe")
        invoke("tokenizer", "train", "--table", uri, "--vocab-size", str(vocab), "--out", tokenizer)
    if tokenize:
        for text in ("prompt", "response"):
            invoke("tokenize", "--table", uri, "--tokenizer", tokenizer, "--text-column", text,
                   "--column", f"{text}_ids", "--workers", "0", "--json")  # fmt: skip
    return uri
