"""``tokenloom.progress``: a bar on a terminal, periodic plain lines in logs, or nothing."""

from __future__ import annotations

import io
import re
import threading

from tokenloom.progress import ENV_PERIOD, ENV_QUIET, progress, progress_mode, silenced


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines_until(stream: io.StringIO, n: int) -> list[str]:
    """Wait (on the ticker, not on a clock) until ``n`` lines were printed."""
    done = threading.Event()
    for _ in range(2000):
        lines = stream.getvalue().splitlines()
        if len(lines) >= n:
            return lines
        done.wait(0.005)
    raise AssertionError(f"fewer than {n} progress lines: {stream.getvalue()!r}")


def test_a_log_gets_periodic_plain_lines_and_a_last_one(monkeypatch):
    monkeypatch.setenv(ENV_PERIOD, "0.01")
    monkeypatch.delenv(ENV_QUIET, raising=False)
    log = io.StringIO()
    with progress("embed", total=200, unit="rows", stream=log) as bar:
        assert bar.mode == "lines"
        bar.update(50)
        bar.note("batch 3")
        _lines_until(log, 2)
    lines = log.getvalue().splitlines()
    assert all("\r" not in line and line.startswith("embed: ") for line in lines)
    assert re.fullmatch(
        r"embed: 50/200 rows \(25%\), [\d.,]+ rows/s, elapsed 00:\d\d, eta \d\d:\d\d, batch 3",
        lines[-1],
    ), lines[-1]
    threading.Event().wait(0.05)  # five periods
    assert log.getvalue().splitlines() == lines  # closed: the ticker stopped


def test_a_job_shorter_than_the_period_prints_nothing(monkeypatch):
    monkeypatch.setenv(ENV_PERIOD, "60")
    log = io.StringIO()
    with progress("score", total=10, stream=log) as bar:
        bar.update(10)
    assert log.getvalue() == ""


def test_quiet_by_env_by_context_or_by_argument(monkeypatch):
    monkeypatch.setenv(ENV_PERIOD, "0.01")
    tty = _Terminal()
    assert progress_mode(stream=tty) == "bar"
    assert progress_mode(stream=io.StringIO()) == "lines"
    assert progress_mode(False, stream=tty) == "off"
    with silenced():
        assert progress_mode(stream=tty) == "off"
        assert progress_mode(True, stream=tty) == "bar"  # asked for explicitly
    assert progress_mode(stream=tty) == "bar"
    monkeypatch.setenv(ENV_QUIET, "1")
    assert progress_mode(stream=tty) == "off"
    log = io.StringIO()
    with progress("x", total=3, stream=log) as bar:
        bar.update(3)
        threading.Event().wait(0.05)
    assert log.getvalue() == ""


def test_a_terminal_gets_a_bar_with_an_eta_and_log_lines_around_it(monkeypatch):
    monkeypatch.delenv(ENV_QUIET, raising=False)
    tty = _Terminal()
    with progress("train", total=10, unit="steps", stream=tty) as bar:
        bar.update(4)
        bar.note("loss 3.2100")
        bar.logger(lambda msg: tty.write(msg + "\n"))("step 4")
    text = tty.getvalue()
    assert "train:" in text and "4/10" in text and "steps" in text
    assert re.search(r"\[\d\d:\d\d<(\d\d:\d\d|\?)", text)  # elapsed<remaining (the ETA)
    assert "step 4\n" in text
