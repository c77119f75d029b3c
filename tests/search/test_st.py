"""The sentence-transformers encoder beside the built-in one: same vectors, clear refusals."""

from __future__ import annotations

import importlib.util

import lance
import numpy as np
import pytest

from tests.conftest import real_paragraphs, run_cli
from tests.search.conftest import build, records
from tokenloom.errors import MissingDependencyError
from tokenloom.search.embed import embed_table
from tokenloom.search.index import SearchError
from tokenloom.search.minilm import MiniLM
from tokenloom.search.st import check_encoder, load_encoder

HAVE_ST = importlib.util.find_spec("sentence_transformers") is not None
needs_st = pytest.mark.skipif(not HAVE_ST, reason="sentence-transformers is not installed")


@needs_st
def test_sentence_transformers_equals_the_builtin_encoder():
    texts = [
        "A man is eating food.",
        "",
        *real_paragraphs(5),
        " ".join(real_paragraphs(60)),  # > 256 word pieces: both truncate alike
    ]
    st = load_encoder("sentence-transformers")
    theirs = st.encode(texts, batch_size=3)
    ours = MiniLM().encode(texts)  # numpy and torch agree: test_minilm
    assert theirs.shape == ours.shape and theirs.dtype == np.float32
    cos = (theirs * ours).sum(axis=1)
    assert cos.min() >= 1 - 1e-5, cos.min()


@needs_st
def test_embed_column_with_sentence_transformers_matches_builtin(tmp_path):
    uri = build(tmp_path, records(4))
    res = embed_table(uri, workers=0, encoder="sentence-transformers", progress=False)
    assert res.rows == 4
    got = lance.dataset(uri).to_table(columns=["text", "embedding"]).to_pylist()
    vecs = np.array([r["embedding"] for r in got], dtype=np.float32)
    ref = MiniLM().encode([r["text"] for r in got])
    assert (vecs * ref).sum(axis=1).min() >= 1 - 1e-5


def test_encoder_choices_are_checked():
    check_encoder("builtin", "numpy")
    with pytest.raises(SearchError, match="one of builtin, sentence-transformers"):
        check_encoder("fastembed")
    with pytest.raises(SearchError, match="drop --backend"):
        check_encoder("sentence-transformers", "numpy")
    if not HAVE_ST:
        with pytest.raises(MissingDependencyError, match=r"tokenloom\[sentence-transformers\]"):
            check_encoder("sentence-transformers")


def test_embed_cli_refuses_a_backend_with_sentence_transformers(tmp_path):
    uri = build(tmp_path, records(3))
    res = run_cli(
        "embed", "--table", uri, "--encoder", "sentence-transformers", "--backend", "numpy"
    )
    assert res.returncode == 1 and "drop --backend" in res.stderr, res.stderr
    res = run_cli("embed", "--table", uri, "--encoder", "fastembed")
    assert res.returncode == 2 and "fastembed" in res.stderr
