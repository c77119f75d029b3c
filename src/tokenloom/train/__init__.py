"""Training straight from the table (needs ``pip install 'tokenloom[train]'`` for torch).

Importing :mod:`tokenloom` never imports this package; importing this package imports torch.
"""

from tokenloom.errors import require

require("torch", extra="train")

from tokenloom.train.model import GPT, PRESETS, GPTConfig, document_mask  # noqa: E402

__all__ = ["GPT", "GPTConfig", "PRESETS", "document_mask"]
