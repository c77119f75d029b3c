"""tokenloom: an LLM pretraining corpus on one versioned Lance table.

Ingest raw text, curate and tokenize it as added columns, train straight from the table, and
search what the model saw afterwards. Importing this package is cheap: heavy optional
dependencies (torch, ray) are imported lazily by the modules that need them.
"""

from tokenloom.errors import TokenloomError

__version__ = "0.1.0"

__all__ = ["TokenloomError", "__version__"]
