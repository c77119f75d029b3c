"""Kill -9 of the driver or of a worker at several points; rerun; the same column, one version.
Also: vanished checkpoint files, and two backfills committing at the same time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.backfill.udfs import n_words, slow_upper
from tests.conftest import write_jsonl
from tokenloom.backfill import add_column, default_checkpoint_root, list_jobs
from tokenloom.ingest import ingest
from tokenloom.table import Table

DRIVER = """
import sys
from tokenloom.backfill import add_column
from tests.backfill import udfs

if __name__ == "__main__":
    uri, name, workers, unit_rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    r = add_column(uri, None, getattr(udfs, name), workers=workers, unit_rows=unit_rows,
                   progress=False)
    print("committed", r.version, r.units_reused, flush=True)
"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_ROWS = 120
UNIT_ROWS = 8  # 15 units


@pytest.fixture
def table(tmp_path, paragraphs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": p} for p in paragraphs[:N_ROWS]])
    uri = str(tmp_path / "t.lance")
    ingest([tmp_path / "a.jsonl"], uri, progress=False)
    (tmp_path / "driver.py").write_text(DRIVER)
    return uri


def _start(uri: str, udf_name: str, *, workers: int = 2, sleep: float = 0.25):
    env = {
        **os.environ,
        "TOKENLOOM_TEST_SLEEP": str(sleep),
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    }
    script = os.path.join(os.path.dirname(uri), "driver.py")
    return subprocess.Popen(
        [sys.executable, script, uri, udf_name, str(workers), str(UNIT_ROWS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _unit_files(uri: str) -> list[str]:
    root = default_checkpoint_root(uri)
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".arrow")]
    return out


def _wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _reference(uri: str) -> dict[int, int]:
    t = Table.open(uri).dataset.to_table(columns=["id", "text"])
    return dict(zip(t["id"].to_pylist(), slow_upper(t).column(0).to_pylist(), strict=True))


def _column(uri: str, name: str) -> dict[int, int]:
    t = Table.open(uri).dataset.to_table(columns=["id", name])
    return dict(zip(t["id"].to_pylist(), t[name].to_pylist(), strict=True))


@pytest.mark.parametrize("kill_after_units", [1, 7, 15])
def test_driver_killed_then_rerun_gives_the_same_column_once(table, kill_after_units):
    v0 = Table.open(table).version
    proc = _start(table, "slow_upper")
    try:
        _wait_for(lambda: len(_unit_files(table)) >= kill_after_units or proc.poll() is not None)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert Table.open(table).count_rows() == N_ROWS  # readable whatever the moment
    done_before = len(_unit_files(table))
    os.environ["TOKENLOOM_TEST_SLEEP"] = "0"
    try:
        result = add_column(table, None, slow_upper, workers=2, unit_rows=UNIT_ROWS)
    finally:
        del os.environ["TOKENLOOM_TEST_SLEEP"]
    table_now = Table.open(table)
    assert table_now.latest_version == v0 + 1  # exactly one new version, whenever it was killed
    assert _column(table, "n_upper") == _reference(table)
    if result.version is not None:
        assert result.units_reused >= min(done_before, 15) - 2  # pool may have lost in-flight
        assert result.units_reused >= 1
    assert [j.state for j in list_jobs(default_checkpoint_root(table))] == ["committed"]


def test_worker_killed_midway_is_replaced_and_the_run_completes(table):
    v0 = Table.open(table).version
    proc = _start(table, "slow_upper")
    try:
        _wait_for(lambda: len(_unit_files(table)) >= 2)
        workers = [p for p in _children(proc.pid)]
        assert workers, "no worker process found"
        os.kill(workers[-1], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.startswith("committed")
    assert Table.open(table).latest_version == v0 + 1
    assert _column(table, "n_upper") == _reference(table)


def test_vanished_checkpoint_is_recomputed(table):
    proc = _start(table, "slow_upper")
    try:
        _wait_for(lambda: len(_unit_files(table)) >= 5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    time.sleep(0.3)  # the workers die with the driver (PR_SET_PDEATHSIG); let them go
    files = _unit_files(table)
    os.unlink(files[0])  # e.g. removed by a cleanup job
    os.environ["TOKENLOOM_TEST_SLEEP"] = "0"
    try:
        result = add_column(table, None, slow_upper, workers=0, unit_rows=UNIT_ROWS)
    finally:
        del os.environ["TOKENLOOM_TEST_SLEEP"]
    assert result.units_reused == len(files) - 1
    assert _column(table, "n_upper") == _reference(table)


def test_two_concurrent_backfills_both_land(table):
    v0 = Table.open(table).version
    procs = [_start(table, "slow_upper", sleep=0.05), _start(table, "n_words", sleep=0.05)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    t = Table.open(table)
    assert t.latest_version == v0 + 2
    assert {"n_upper", "n_words"} <= set(t.schema().names)
    assert _column(table, "n_upper") == _reference(table)
    words = t.dataset.to_table(columns=["id", "text"])
    assert _column(table, "n_words") == dict(
        zip(words["id"].to_pylist(), n_words(words).column(0).to_pylist(), strict=True)
    )
