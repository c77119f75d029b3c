"""Training straight from the table (needs ``pip install 'tokenloom[train]'`` for torch).

Importing :mod:`tokenloom` never imports this package. The run record
(:mod:`tokenloom.train.record`) is pure and importable without torch; the model and the loop
import torch when first asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GPT", "GPTConfig", "PRESETS", "document_mask"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tokenloom.errors import require

        require("torch", extra="train")
        from tokenloom.train import model

        return getattr(model, name)
    raise AttributeError(f"module 'tokenloom.train' has no attribute {name!r}")
