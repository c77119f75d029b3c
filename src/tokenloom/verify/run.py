"""``verify(table, ...)``: the checks a training team runs on a loader before a long job."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from tokenloom.loader.plan.spec import LoaderSpec
from tokenloom.verify.isolation import check_isolation
from tokenloom.verify.loss import check_loss
from tokenloom.verify.report import CheckResult, VerifyError, VerifyReport
from tokenloom.verify.resume import check_resume
from tokenloom.verify.sample import read_sample
from tokenloom.verify.shares import check_pool_shares
from tokenloom.verify.text import check_text, check_token_ids

__all__ = ["verify"]


def _guarded(name: str, run: Callable[[], CheckResult]) -> CheckResult:
    """Run one check; a check that cannot finish has not verified anything, so it fails."""
    started = time.perf_counter()
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        if os.environ.get("TOKENLOOM_DEBUG", "") not in ("", "0"):
            raise
        return CheckResult(
            name=name,
            passed=False,
            detail=f"the check could not finish: {type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - started,
        )


def verify(
    spec: LoaderSpec, *, steps: int = 8, storage_options: Mapping[str, str] | None = None
) -> VerifyReport:
    """Check a loader spec on real batches of its epoch 0.

    Six checks (each module's docstring defines its check exactly): ``text_reconstruction``
    (:mod:`~tokenloom.verify.text`), ``token_ids`` (same module), ``document_isolation``
    (:mod:`~tokenloom.verify.isolation`), ``loss_positions`` (:mod:`~tokenloom.verify.loss`),
    ``resume`` (:mod:`~tokenloom.verify.resume`) and ``pool_shares``
    (:mod:`~tokenloom.verify.shares`). They look at the first ``steps`` global steps,
    ``steps`` steps at an offset drawn from the seed, and every step holding the shortest or the
    longest selected row, in the spec's block order. The table version is pinned at the start.

    Args:
        spec: The loader under test (:class:`~tokenloom.loader.LoaderSpec`).
        steps: Steps per sample (``k``), and the steps read before saving the resume state.
        storage_options: Object-store options (with the ``AWS_*`` environment); never part of
            the report.

    Returns:
        The :class:`VerifyReport`; ``report.passed`` says whether every check passed.

    Raises:
        VerifyError: ``steps < 1``, or no tokenizer is recorded on the column.
        EmptyEpochError: The filter selects no tokens, or ``drop_last`` leaves no step.
        LoaderError, PlanError: The loader cannot be built with these options.
        TokenizerError: The recorded tokenizer cannot be loaded here.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise VerifyError(f"steps must be an integer >= 1, got {steps!r}")
    started = time.perf_counter()
    sample = read_sample(spec, steps=steps, storage_options=storage_options)
    pinned = sample.spec
    checks = [
        _guarded("text_reconstruction", lambda: check_text(sample)),
        _guarded("token_ids", lambda: check_token_ids(sample)),
        _guarded("document_isolation", lambda: check_isolation(sample)),
        _guarded("loss_positions", lambda: check_loss(sample)),
        _guarded(
            "resume",
            lambda: check_resume(pinned, steps=steps, storage_options=storage_options),
        ),
        _guarded("pool_shares", lambda: check_pool_shares(sample)),
    ]
    return VerifyReport(
        table=sample.uri,
        version=sample.version,
        options={**pinned.to_dict(), "steps": steps},
        total_steps=sample.total_steps,
        steps_read=[b.step for b in sample.batches],
        fixed_rows=list(sample.fixed_rows),
        rows_checked=len(sample.rows),
        checks=checks,
        seconds=time.perf_counter() - started,
        left_out=sample.left_out,
    )
