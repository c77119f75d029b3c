"""Check 5, resume: a loader rebuilt from a saved state continues the uninterrupted stream.

One loader reads ``2k`` steps without stopping. Another reads ``k`` steps and saves its
``state_dict()``; the state goes through JSON (as a checkpoint would store it) into a freshly
built :class:`~tokenloom.loader.PackedDataset`, which reads ``k`` more steps. Those must equal
steps ``k .. 2k`` of the uninterrupted run in every tensor (``input_ids`` and ``labels`` first).
An epoch shorter than ``2k`` steps is crossed, so resuming across the epoch boundary is checked
too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.verify.report import CheckResult
from tokenloom.verify.sample import dataset

__all__ = ["take", "check_resume"]

_COMPARED = ("input_ids", "labels", "position_ids", "doc_ids", "cu_seqlens", "spans")


def take(dl: Any, n: int) -> list[dict[str, np.ndarray]]:
    """The next ``n`` batches of a DataLoader, continuing into the next epoch when one ends."""
    out: list[dict[str, np.ndarray]] = []
    while len(out) < n:
        before = len(out)
        for batch in dl:
            out.append({k: v.numpy() for k, v in batch.items() if hasattr(v, "numpy")})
            if len(out) == n:
                break
        if len(out) == before:  # an empty epoch: nothing more will come
            break
    return out


def check_resume(
    spec: LoaderSpec, *, steps: int, storage_options: Mapping[str, str] | None = None
) -> CheckResult:
    """Check 5 (see the module docstring); ``storage_options`` reach an object store."""
    from tokenloom.loader import DataLoader

    started = time.perf_counter()
    k = steps
    whole = take(DataLoader(dataset(spec, storage_options)), 2 * k)
    first = DataLoader(dataset(spec, storage_options))
    take(first, k)
    state = json.loads(json.dumps(first.state_dict()))
    resumed_ds = dataset(spec, storage_options)
    resumed_ds.load_state_dict(state)
    resumed = take(DataLoader(resumed_ds), k)
    problem = None
    if len(resumed) != len(whole) - k:
        problem = f"resumed run gave {len(resumed)} steps, the uninterrupted run {len(whole) - k}"
    for i, (a, b) in enumerate(zip(whole[k:], resumed, strict=False)):
        for key in _COMPARED:
            if a[key].shape != b[key].shape or not np.array_equal(a[key], b[key]):
                problem = (
                    f"step {k + i} after resuming (state epoch {state['epoch']} step "
                    f"{state['step']}): {key} differs from the uninterrupted run"
                )
                break
        if problem:
            break
    seconds = time.perf_counter() - started
    if problem:
        return CheckResult(name="resume", passed=False, detail=problem, seconds=seconds)
    return CheckResult(
        name="resume",
        passed=True,
        detail=(
            f"state after {k} steps (epoch {state['epoch']}, step {state['step']}) loaded into a "
            f"fresh loader: the next {len(resumed)} steps equal the uninterrupted run "
            f"({', '.join(_COMPARED)})"
        ),
        seconds=seconds,
    )
