"""``verify``: the checks a training team runs on a loader configuration before a long job.

On real batches of epoch 0 (a sample of steps plus every block of two fixed documents) it checks
that the blocks decode back to the source text, that the stored ids are the recorded tokenizer's,
that attention built from the batch alone never crosses a document, that exactly the intended
positions carry loss, and that a resumed loader continues the uninterrupted stream.

Importing this package does not import torch; :func:`verify` does (``tokenloom[train]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenloom.verify.report import CHECKS, CheckResult, VerifyError, VerifyReport

__all__ = ["CHECKS", "CheckResult", "VerifyError", "VerifyReport", "verify"]


def verify(
    spec: Any,
    *,
    steps: int = 8,
    storage_options: Mapping[str, str] | None = None,
    **options: Any,
) -> VerifyReport:
    """Run every check on a :class:`~tokenloom.loader.LoaderSpec` (or a table path plus the
    spec's fields as keywords), reaching an object store with ``storage_options``; see
    :func:`tokenloom.verify.run.verify`.

    Raises:
        TableNotFoundError: Nothing is at the spec's table (said before torch is imported).
        MissingDependencyError: torch is not installed.
    """
    from tokenloom.errors import require
    from tokenloom.loader.plan.spec import LoaderSpec
    from tokenloom.table.core import Table

    if not isinstance(spec, LoaderSpec):
        spec = LoaderSpec.from_options(table=spec, **options)
    Table.require(spec.table, storage_options=storage_options)
    require("torch", extra="train")
    from tokenloom.verify.run import verify as run

    return run(spec, steps=steps, storage_options=storage_options)
