"""How a long job shows its progress on stderr: one decision, made here for every job.

* stderr is a terminal: a tqdm bar with rate and ETA (refreshed at least once a second, so a
  phase that reports nothing, like building an index, still shows its elapsed time);
* stderr is a log (a file, a pipe, CI): one plain line every ``TOKENLOOM_PROGRESS_SECONDS``
  seconds (default 30), e.g. ``train: 40/100 steps (40%), 3.03 steps/s, elapsed 00:13, eta
  00:19, loss 3.214``, and a last line when the job ends if any line was printed (a job shorter
  than the period prints nothing);
* silenced by ``tokenloom --quiet``, ``TOKENLOOM_QUIET=1`` or ``show=False``.

Nothing is written on stdout, so a command's ``--json`` output stays one clean document.

Example::

    with progress("embed", total=rows, unit="rows") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

__all__ = [
    "ENV_PERIOD",
    "ENV_QUIET",
    "Progress",
    "progress",
    "progress_mode",
    "silenced",
]

ENV_QUIET = "TOKENLOOM_QUIET"
"""Set (to anything but ``""`` or ``"0"``) to show no progress at all."""
ENV_PERIOD = "TOKENLOOM_PROGRESS_SECONDS"
"""Seconds between two plain progress lines when stderr is not a terminal (default 30)."""
DEFAULT_PERIOD = 30.0
BAR_REFRESH = 1.0
"""Seconds between two redraws of a terminal bar that got no update meanwhile."""

_silenced = 0


@contextlib.contextmanager
def silenced(on: bool = True) -> Iterator[None]:
    """Within the block, jobs of this process show no progress (``tokenloom --quiet``)."""
    global _silenced
    _silenced += bool(on)
    try:
        yield
    finally:
        _silenced -= bool(on)


def _quiet_env() -> bool:
    return os.environ.get(ENV_QUIET, "") not in ("", "0")


def period() -> float:
    """Seconds between plain progress lines (``TOKENLOOM_PROGRESS_SECONDS``, default 30)."""
    raw = os.environ.get(ENV_PERIOD, "")
    try:
        value = float(raw) if raw else DEFAULT_PERIOD
    except ValueError:
        value = DEFAULT_PERIOD
    return value if value > 0 else DEFAULT_PERIOD


def progress_mode(show: bool | None = None, stream: TextIO | None = None) -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` for a job asked to show progress ``show`` (``None``:
    unless silenced; ``False``: never; ``True``: even when silenced) on ``stream`` (stderr)."""
    if show is False or (show is None and (_silenced or _quiet_env())):
        return "off"
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        tty = False
    return "bar" if tty else "lines"


def _count(n: float, unit_scale: bool, divisor: int) -> str:
    from tqdm import tqdm

    if unit_scale and abs(n) >= divisor:
        return tqdm.format_sizeof(n, divisor=divisor)
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.1f}"


class Progress:
    """One job's progress: a bar, periodic lines, or nothing (see the module docstring).

    Thread-safe enough for its use: :meth:`update` runs in the job's thread, a daemon thread
    prints or redraws on a timer.
    """

    def __init__(
        self,
        desc: str,
        total: float | None = None,
        *,
        unit: str = "it",
        unit_scale: bool = False,
        unit_divisor: int = 1000,
        initial: float = 0,
        show: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.unit_scale, self.unit_divisor = unit_scale, unit_divisor
        self.n = self.initial = initial
        self.stream = stream if stream is not None else sys.stderr
        self.mode = progress_mode(show, self.stream)
        self.lines = 0
        """Plain lines printed so far."""
        self._note = ""
        self._started = time.monotonic()
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.mode == "off":
            return
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                desc=desc,
                total=total,
                initial=initial,
                unit=unit,
                unit_scale=unit_scale,
                unit_divisor=unit_divisor,
                file=self.stream,
                leave=False,
                dynamic_ncols=True,
            )
        every = BAR_REFRESH if self.mode == "bar" else period()
        self._thread = threading.Thread(
            target=self._tick, args=(every,), name=f"progress-{desc}", daemon=True
        )
        self._thread.start()

    def update(self, n: float = 1) -> None:
        """``n`` more units done."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """A short status shown after the counts (e.g. ``loss 3.214``)."""
        self._note = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def line(self) -> str:
        """The plain progress line of now."""
        from tqdm import tqdm

        elapsed = time.monotonic() - self._started
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        count = _count(self.n, self.unit_scale, self.unit_divisor)
        parts = [f"{self.desc}: {count}"]
        if self.total:
            total = _count(self.total, self.unit_scale, self.unit_divisor)
            parts[0] += f"/{total} {self.unit} ({100 * self.n / self.total:.0f}%)"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{_count(rate, self.unit_scale, self.unit_divisor)} {self.unit}/s")
        parts.append(f"elapsed {tqdm.format_interval(elapsed)}")
        if self.total and rate > 0:
            parts.append(f"eta {tqdm.format_interval(max(self.total - self.n, 0) / rate)}")
        if self._note:
            parts.append(self._note)
        return ", ".join(parts)

    def _print_line(self) -> None:
        try:
            print(self.line(), file=self.stream, flush=True)
        except (ValueError, OSError):  # the stream was closed under us (interpreter exit)
            return
        self.lines += 1

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            if self.mode == "lines":
                self._print_line()
            elif self._bar is not None:
                with contextlib.suppress(Exception):  # a redraw must never break the job
                    self._bar.refresh()

    def logger(self, log: Callable[[str], Any]) -> Callable[[str], None]:
        """``log`` wrapped so its lines do not tear a terminal bar (the bar is cleared, the line
        written, the bar drawn again)."""
        if self._bar is None:
            return log

        def wrapped(msg: str) -> None:
            from tqdm import tqdm

            with tqdm.external_write_mode(file=self.stream):
                log(msg)

        return wrapped

    def close(self) -> None:
        """End the job's progress (a last plain line if any was printed)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self.mode == "lines" and self.lines:
                self._print_line()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    desc: str,
    total: float | None = None,
    *,
    unit: str = "it",
    unit_scale: bool = False,
    unit_divisor: int = 1000,
    initial: float = 0,
    show: bool | None = None,
    stream: TextIO | None = None,
) -> Progress:
    """Start showing a job's progress; use as a context manager or call :meth:`Progress.close`.

    Args:
        desc: The job's name, first on every line.
        total: Units in all (``None``: unknown, no percentage or ETA).
        unit: What is counted (``rows``, ``steps``, ``B``).
        unit_scale: Print counts as 1.2k, 3.4M (``unit_divisor`` 1024 for bytes).
        initial: Units already done before this invocation (a resumed run).
        show: ``None``: unless silenced; ``False``: never; ``True``: even when silenced.
        stream: Where to show it (default: stderr).
    """
    return Progress(
        desc,
        total,
        unit=unit,
        unit_scale=unit_scale,
        unit_divisor=unit_divisor,
        initial=initial,
        show=show,
        stream=stream,
    )
