"""Kill a torchrun launcher mid-run, as a scheduler or an OOM killer would, and check that its
ranks (in sessions of their own) die with it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

__all__ = ["kill_launcher_at", "step_on_disk", "descendants"]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its ranks in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def step_on_disk(out) -> int:
    try:
        with open(os.path.join(out, "last.json")) as fh:
            return json.load(fh)["step"]
    except (OSError, ValueError):
        return 0


def kill_launcher_at(proc: subprocess.Popen, out, *, step: int, timeout: float) -> str:  # noqa: ANN001
    """Wait until ``out`` holds a checkpoint of at least ``step`` steps, SIGKILL only the
    launcher, assert every rank below it dies within 20 s; return the launcher's output."""
    deadline = time.time() + timeout
    while step_on_disk(out) < step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    ranks = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # only the launcher: its ranks must not outlive it
    output = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, output
    deadline = time.time() + 20
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in ranks):
        time.sleep(0.05)
    survivors = [p for p in ranks if os.path.exists(f"/proc/{p}")]
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert ranks and not survivors, "ranks outlived their torchrun launcher"
    return output
