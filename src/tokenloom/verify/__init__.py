"""``verify``: the checks a training team runs on a loader configuration before a long job.

On real batches of epoch 0 (a sample of steps plus every block of two fixed documents) it checks
that the blocks decode back to the source text, that the stored ids are the recorded tokenizer's,
that attention built from the batch alone never crosses a document, that exactly the intended
positions carry loss, and that a resumed loader continues the uninterrupted stream.

Importing this package does not import torch; :func:`verify` does (``tokenloom[train]``).
"""

from __future__ import annotations

from typing import Any

from tokenloom.verify.report import CHECKS, CheckResult, VerifyError, VerifyReport

__all__ = ["CHECKS", "CheckResult", "VerifyError", "VerifyReport", "verify"]


def verify(table: Any, **loader_options: Any) -> VerifyReport:
    """Run every check; see :func:`tokenloom.verify.run.verify` for the options.

    Raises:
        MissingDependencyError: torch is not installed.
    """
    from tokenloom.errors import require

    require("torch", extra="train")
    from tokenloom.verify.run import verify as run

    return run(table, **loader_options)
