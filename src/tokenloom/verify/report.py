"""What ``verify`` returns: a :class:`CheckResult` per check, in a :class:`VerifyReport`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tokenloom.errors import TokenloomError

__all__ = ["CHECKS", "CheckResult", "VerifyError", "VerifyReport"]

CHECKS = (
    "text_reconstruction",
    "token_ids",
    "document_isolation",
    "loss_positions",
    "resume",
    "pool_shares",
)
"""The checks, in the order they run and are printed."""


class VerifyError(TokenloomError):
    """``verify`` cannot run as asked (no tokenizer recorded, no rows selected, bad options)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    """One of :data:`CHECKS`."""
    passed: bool
    detail: str
    """One line: what was checked and, on failure, the first thing that was wrong."""
    seconds: float = 0.0
    """Time the check took (reading the sample is not counted here)."""


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """Every check of one ``verify`` run, with what was sampled."""

    table: str
    """The table's URI."""
    version: int
    """The table version that was read (pinned for the whole run)."""
    options: dict[str, Any]
    """The loader options under test."""
    total_steps: int
    """Global steps of epoch 0 under these options."""
    steps_read: list[int]
    """Steps of epoch 0 whose batches were checked (the samples plus the fixed documents' steps)."""
    fixed_rows: list[int]
    """Row ids of the two fixed documents (shortest and longest selected)."""
    rows_checked: int
    """Distinct rows whose text was tokenized again."""
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the whole run."""
    left_out: str | None = None
    """How many rows the filter left out because a column it reads is null, or ``None``."""

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed."""
        return [c.name for c in self.checks if not c.passed]

    def check(self, name: str) -> CheckResult:
        """The result of the check called ``name``."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``passed`` included)."""
        out = asdict(self)
        out["passed"] = self.passed
        return out
