"""Killing a backfill driver leaves no worker behind: mid-run, and while its workers still start.

Every process of a run carries a marker in its environment (inherited from the driver), so the
test finds survivors even after they were re-parented away from the dead driver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import write_jsonl
from tokenloom.backfill import default_checkpoint_root
from tokenloom.ingest import ingest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Spawned workers import this file as ``__mp_main__``: the sleep below stretches their start-up
# (before the pool initializer runs) so the driver can be killed right in it.
DRIVER = """
import os, sys, time
if __name__ != "__main__":
    time.sleep(float(os.environ.get("TEST_WORKER_START_DELAY", "0")))
from tokenloom.backfill import add_column
from tests.backfill import udfs

if __name__ == "__main__":
    r = add_column(sys.argv[1], None, udfs.slow_upper, workers=2, unit_rows=8, progress=False)
    print("committed", r.version, flush=True)
"""


@pytest.fixture
def table(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:64]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    (tmp_path / "driver.py").write_text(DRIVER)
    return uri


def _marked(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``marker``."""
    needle = f"TOKENLOOM_TEST_MARKER={marker}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            out.append(int(entry))
    return out


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except OSError:
                continue
    return out


def _wait_for(cond, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def _unit_files(uri: str) -> int:
    return sum(
        f.endswith(".arrow")
        for _d, _s, files in os.walk(default_checkpoint_root(uri))
        for f in files
    )


@pytest.mark.parametrize(
    ("moment", "sig"),
    [("start-up", signal.SIGKILL), ("mid-run", signal.SIGKILL), ("mid-run", signal.SIGTERM)],
)
def test_no_worker_survives_its_driver(table, moment, sig):
    marker = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        "TOKENLOOM_TEST_MARKER": marker,
        "TOKENLOOM_TEST_SLEEP": "0.3",
        "TEST_WORKER_START_DELAY": "1.5" if moment == "start-up" else "0",
    }
    script = os.path.join(os.path.dirname(table), "driver.py")
    proc = subprocess.Popen(
        [sys.executable, script, table], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        if moment == "start-up":
            # The resource tracker and the first worker: both spawned, neither started work.
            _wait_for(lambda: len(_children(proc.pid)) >= 2 or proc.poll() is not None)
        else:
            _wait_for(lambda: _unit_files(table) >= 2 or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        assert len(_marked(marker)) >= 2  # the driver and at least one worker
        proc.send_signal(sig)
        proc.wait(30)
        deadline = time.time() + 15  # a worker still starting needs its start-up to notice
        while _marked(marker) and time.time() < deadline:
            time.sleep(0.05)
        survivors = _marked(marker)
    finally:
        proc.kill()
        proc.wait()
    for pid in survivors:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"processes outlived the killed driver: {survivors}"
