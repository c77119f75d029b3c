"""Training metrics written beside the checkpoint: ``metrics.csv`` and TensorBoard event files.

``TrainConfig.log_to`` names the sinks (``csv``, ``tensorboard``); rank 0 writes, at the steps the
loop logs (``log_every``, the last step) and at every evaluation:

* ``OUT/metrics.csv``: one row per logged step, columns :data:`CSV_COLUMNS` (a validation row
  fills ``val_loss`` only);
* ``OUT/metrics-by-group.csv``: the loss by provenance (:mod:`~tokenloom.train.provenance_loss`),
  one row per logged step, split (``train``/``val``) and group (``pool/NAME``, ``slice/NAME``),
  columns :data:`GROUP_COLUMNS`; written only by a run that tracks groups;
* ``OUT/tensorboard/``: ``train/loss``, ``train/lr``, ``train/tokens_per_second``, ``train/mfu``
  and ``val/loss`` scalars, and ``train/loss/GROUP``, ``val/loss/GROUP`` by provenance
  (``torch.utils.tensorboard``, which needs the ``tensorboard`` package:
  ``pip install 'tokenloom[train]'``).

A resumed run continues the sinks from its checkpoint's step: CSV rows and TensorBoard events of
later steps (written by an invocation killed before its next checkpoint) are dropped first, so
each step appears once.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CSV_COLUMNS",
    "CSV_NAME",
    "GROUP_COLUMNS",
    "GROUP_CSV_NAME",
    "LOG_SINKS",
    "TB_DIR",
    "MetricsLog",
    "parse_log_to",
]

LOG_SINKS = ("csv", "tensorboard")
"""The sinks ``--log-to`` accepts."""
CSV_NAME = "metrics.csv"
TB_DIR = "tensorboard"
CSV_COLUMNS = ("step", "loss", "val_loss", "lr", "tokens_per_second", "mfu", "elapsed_seconds")
"""The columns of ``metrics.csv``; a value a row does not have is empty."""
GROUP_CSV_NAME = "metrics-by-group.csv"
GROUP_COLUMNS = ("step", "split", "group", "loss", "tokens")
"""The columns of ``metrics-by-group.csv`` (``loss`` empty for a group with no target)."""


def parse_log_to(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"csv,tensorboard"`` (or a list of names) as a tuple of known sinks, in order, once each.

    Raises:
        ValueError: an unknown sink, naming the known ones.
    """
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for name in (n.strip().lower() for n in names):
        if not name:
            continue
        if name not in LOG_SINKS:
            raise ValueError(f"unknown log sink {name!r}; one of {', '.join(LOG_SINKS)}")
        if name not in out:
            out.append(name)
    return tuple(out)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class MetricsLog:
    """The run's metric sinks (rank 0 only); :meth:`close` flushes them."""

    def __init__(self, out: str, sinks: Iterable[str], *, start_step: int = 0) -> None:
        """Open the sinks under ``out``; a run resumed at ``start_step`` drops later records."""
        self.sinks = tuple(sinks)
        self.csv_path = os.path.join(out, CSV_NAME) if "csv" in self.sinks else None
        self.tb_dir = os.path.join(out, TB_DIR) if "tensorboard" in self.sinks else None
        self._csv = self._writer = self._tb = None
        self._start_step = start_step
        self._groups_csv = self._groups_writer = None
        if self.tb_dir is not None:
            from tokenloom.errors import require

            if not start_step and os.path.isdir(self.tb_dir):  # a replaced run's events
                for name in os.listdir(self.tb_dir):
                    if name.startswith("events.out.tfevents."):
                        os.remove(os.path.join(self.tb_dir, name))

            require("tensorboard", extra="train")
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events at or after it (from a killed invocation) are discarded
            self._tb = SummaryWriter(
                log_dir=self.tb_dir, purge_step=start_step + 1 if start_step else None
            )
        if self.csv_path is not None:
            kept = _rows_up_to(self.csv_path, start_step) if start_step else []
            self._csv = open(self.csv_path, "w", newline="", encoding="utf-8")  # noqa: SIM115
            self._writer = csv.writer(self._csv)
            self._writer.writerow(CSV_COLUMNS)
            self._writer.writerows(kept)
            self._csv.flush()

    def train(self, step: int, **values: float | None) -> None:
        """A logged training step: ``loss``, ``lr``, ``tokens_per_second``, ``mfu``,
        ``elapsed_seconds`` (``None``: not known)."""
        self._row(step, values)
        if self._tb is not None:
            for key in ("loss", "lr", "tokens_per_second", "mfu"):
                if values.get(key) is not None:
                    self._tb.add_scalar(f"train/{key}", values[key], step)

    def val(self, step: int, loss: float) -> None:
        """A validation loss at ``step``."""
        self._row(step, {"val_loss": loss})
        if self._tb is not None:
            self._tb.add_scalar("val/loss", loss, step)

    def groups(self, step: int, split: str, values: dict[str, tuple[float | None, int]]) -> None:
        """The loss by provenance at ``step``: ``{group: (loss, target tokens)}`` of ``split``
        (``train`` or ``val``)."""
        if self.csv_path is not None and values:
            if self._groups_writer is None:
                path = os.path.join(os.path.dirname(self.csv_path), GROUP_CSV_NAME)
                kept = _rows_up_to(path, self._start_step) if self._start_step else []
                self._groups_csv = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
                self._groups_writer = csv.writer(self._groups_csv)
                self._groups_writer.writerow(GROUP_COLUMNS)
                self._groups_writer.writerows(kept)
            for name, (loss, tokens) in values.items():
                self._groups_writer.writerow([step, split, name, _fmt(loss), tokens])
            self._groups_csv.flush()
        if self._tb is not None:
            for name, (loss, _) in values.items():
                if loss is not None:
                    self._tb.add_scalar(f"{split}/loss/{name}", loss, step)

    def _row(self, step: int, values: dict[str, Any]) -> None:
        if self._writer is None:
            return
        unknown = set(values) - set(CSV_COLUMNS)
        assert not unknown, f"not a metrics.csv column: {sorted(unknown)}"
        self._writer.writerow([_fmt(step), *(_fmt(values.get(c)) for c in CSV_COLUMNS[1:])])
        self._csv.flush()  # a killed run keeps every row written so far

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the sinks."""
        if self._csv is not None:
            self._csv.close()
            self._csv = self._writer = None
        if self._groups_csv is not None:
            self._groups_csv.close()
            self._groups_csv = self._groups_writer = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _rows_up_to(path: str, step: int) -> list[list[str]]:
    """The data rows of an existing ``metrics.csv`` whose step is at most ``step``."""
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step]
