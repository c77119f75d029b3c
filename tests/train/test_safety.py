"""Safe to stop, safe to resume: a signal checkpoints at a step boundary; a table rebuilt at the
same path is refused on resume, naming what changed (through the real CLI, exit codes included)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # training processes, killed

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402


def _train(*args: str, **kw) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = [sys.executable, "-m", "tokenloom.cli.main", "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kw.get("background"):
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


BASE = ("--seq-len", "64", "--global-batch-size", "4", "--log-every", "1")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The table of the tests that train on it without changing it (one build per module)."""
    return token_table(tmp_path_factory.mktemp("safety"), real_paragraphs(40))


def test_sigterm_checkpoints_at_the_next_step_and_resume_continues(table, tmp_path):
    uri = table
    out = tmp_path / "run"
    proc = _train(
        "--table", uri, "--out", str(out), *BASE, "--steps", "100000",
        "--checkpoint-every", "100000", background=True,
    )  # fmt: skip
    deadline = time.time() + 120
    lines: list[bytes] = []
    while time.time() < deadline:  # wait for a few logged steps
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith(b"step      3"):
            break
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    text = b"".join(lines).decode() + stdout.decode()
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode() + text
    assert "stopped by a signal" in text
    record = read_record(out)
    assert 3 <= record.step < 100000  # a checkpoint at a step boundary, not at the schedule end
    assert not [f for f in os.listdir(out) if ".tmp-" in f]
    more = _train("--out", str(out), "--resume", "--stop-at", str(record.step + 2))
    assert more.returncode == 0, more.stderr
    assert read_record(out).step == record.step + 2


def test_a_table_rebuilt_at_the_same_path_is_refused_on_resume(tmp_path):
    texts = real_paragraphs(40)
    build = tmp_path / "b1"
    build.mkdir()
    uri = token_table(build, texts)
    out = tmp_path / "run"
    first = _train("--table", uri, "--out", str(out), *BASE, "--steps", "6", "--stop-at", "2")
    assert first.returncode == 0, first.stderr
    shutil.rmtree(uri)  # the same path, the same rows, the same version numbers: another table
    assert token_table(build, texts) == uri
    again = _train("--out", str(out), "--resume")
    assert again.returncode == 1, again.stderr
    assert "deleted and built again" in again.stderr and "--allow-data-change" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1  # one line, no traceback
    knowingly = _train("--out", str(out), "--resume", "--allow-data-change")
    assert knowingly.returncode == 0, knowingly.stderr


def test_a_column_added_since_is_a_new_version_not_a_rebuilt_table(tmp_path):
    from tests.loader.test_resume_version import n_bytes
    from tokenloom.backfill import add_column
    from tokenloom.table import Table

    uri = token_table(tmp_path, real_paragraphs(40))
    out = tmp_path / "run"
    first = _train("--table", uri, "--out", str(out), *BASE, "--steps", "6", "--stop-at", "2")
    assert first.returncode == 0, first.stderr
    pinned = Table.open(uri).version
    add_column(uri, None, n_bytes, workers=0, progress=False)
    latest = Table.open(uri).version
    newer = _train("--out", str(out), "--resume", "--version", str(latest), "--stop-at", "3")
    assert newer.returncode == 1, newer.stderr
    assert newer.stderr.startswith(
        f"error: checkpoint was taken on table version {pinned} but the loader reads version "
        f"{latest}"
    )
    assert "built again" not in newer.stderr and "Traceback" not in newer.stderr
    pinned_run = _train("--out", str(out), "--resume", "--stop-at", "3")
    assert pinned_run.returncode == 0, pinned_run.stderr
    assert read_record(out).step == 3 and read_record(out).loader.version == pinned


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--filter", "id < 0"), "--filter 'id < 0' selects 0 rows and no token"),
        (("--drop-last", "--global-batch-size", "100000"), "or drop --drop-last"),
    ],
)
def test_an_epoch_without_a_step_is_refused_before_training(table, tmp_path, options, message):
    uri = table
    cmd = [sys.executable, "-m", "tokenloom.cli.main", "train", "--table", uri]
    cmd += ["--out", str(tmp_path / "run"), "--seq-len", "64", "--steps", "3", *options]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 1, done.stderr
    assert "epoch 0 has no step" in done.stderr and message in done.stderr
    assert "parameters" not in done.stdout  # refused before the model is built


def test_one_sigterm_while_the_loader_starts_ends_train_at_once(table, tmp_path):
    uri = table
    out = tmp_path / "run"
    proc = _train(
        "--table", uri, "--out", str(out), *BASE, "--steps", "100000", "--workers", "2",
        background=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith(b"data:"):  # an early end fails the asserts below
            break
    proc.send_signal(signal.SIGTERM)  # once: the first batch may not have come yet
    sent = time.time()
    stdout, stderr = proc.communicate(timeout=30)
    # ~3.5 s on a quiet machine (workers stopped, record written); 10.008 s was seen at load ~15
    assert time.time() - sent < 15
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode()
    said = stdout.decode() + stderr.decode()  # before the first batch, or at the first step
    assert "stopped by SIGTERM before the first step" in said or "stopped by a signal" in said


def _start_training(uri: str, tmp_path) -> tuple[subprocess.Popen, bytes]:
    """``train`` on ``uri`` with two loader workers in its own process group, once it has taken
    steps (and the line that says so)."""
    cmd = [sys.executable, "-m", "tokenloom.cli.main", "train", "--table", uri, "--out"]
    cmd += [str(tmp_path / "run"), *BASE, "--steps", "100000", "--workers", "2"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith(b"step      3"):
            break
    return proc, line


def _semaphores() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("sem.")}


@pytest.mark.serial  # counts every semaphore on the machine: nothing else may run beside it
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory lives elsewhere")
def test_kill_9_of_the_training_process_group_leaves_no_semaphore(table, tmp_path):
    before = _semaphores()
    proc, line = _start_training(table, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: resource tracker included
    proc.wait()
    assert line.startswith(b"step      3"), proc.stderr.read().decode()  # it was training
    time.sleep(0.5)
    assert not _semaphores() - before
