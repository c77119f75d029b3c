"""Nothing left behind: ``tokenloom gc`` removes orphans and stale leftovers and never a file any
version reads; the next backfill cleans what a killed one left; lock waits name the holder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from tests.conftest import run_cli, write_jsonl
from tokenloom.backfill import add_column, default_checkpoint_root, list_jobs, udf
from tokenloom.ingest import ingest
from tokenloom.table import Table
from tokenloom.table.gc import collect_garbage, referenced_files
from tokenloom.table.journal import RunJournal
from tokenloom.table.locks import FileLock, LockTimeoutError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}

DRIVER = """
import sys
from tokenloom.backfill import add_column
from tests.backfill import udfs

if __name__ == "__main__":
    add_column(sys.argv[1], None, udfs.slow_upper, workers=2, unit_rows=8, progress=False)
"""


@udf(inputs=["text"], output=pa.field("n_upper", pa.int64()), version="2")
def upper_v2(batch: pa.RecordBatch) -> pa.Array:
    """The same column as ``tests.backfill.udfs.slow_upper``, by a newer UDF version."""
    return pa.array([sum(c.isupper() for c in t) for t in batch.column("text").to_pylist()])


@udf(inputs=["text"], output=pa.field("n_chars2", pa.int64()), version="1")
def n_chars2(batch: pa.RecordBatch) -> pa.Array:
    return pa.array([len(t) for t in batch.column("text").to_pylist()], pa.int64())


_cli = run_cli


@pytest.fixture
def table(tmp_path, paragraphs) -> str:
    uri = str(tmp_path / "t.lance")
    for i in range(2):  # two ingests: two data files, versions 2 and 3
        write_jsonl(
            tmp_path / f"{i}.jsonl", [{"text": p} for p in paragraphs[i * 24 : i * 24 + 24]]
        )
        ingest([tmp_path / f"{i}.jsonl"], uri, progress=False)
    return uri


def _kill_backfill_midway(uri: str) -> None:
    """A ``slow_upper`` backfill killed with -9 after a few units: its job dir, results, lock."""
    script = os.path.join(os.path.dirname(uri), "driver.py")
    with open(script, "w") as fh:
        fh.write(DRIVER)
    proc = subprocess.Popen(
        [sys.executable, script, uri], env={**ENV, "TOKENLOOM_TEST_SLEEP": "0.2"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = default_checkpoint_root(uri)
    deadline = time.time() + 60
    try:
        while time.time() < deadline and proc.poll() is None:
            units = [f for _d, _s, fs in os.walk(root) for f in fs if f.endswith(".arrow")]
            if len(units) >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the backfill ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(0.3)  # its workers die with it


def _orphan_from_an_uncommitted_merge(uri: str) -> str:
    """What a backfill killed between writing its column files and committing leaves."""
    ds = Table.open(uri).dataset
    frag = ds.get_fragments()[0]

    def value(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch([pa.array([1] * batch.num_rows, pa.int64())], names=["x"])

    meta, _schema = frag.merge_columns(value, columns=["id"])
    path = os.path.join(uri, "data", meta.files[-1].path)
    assert os.path.exists(path)
    return path


def _read_every_version(uri: str) -> dict[int, int]:
    ds = Table.open(uri).dataset
    return {
        int(v["version"]): ds.checkout_version(int(v["version"])).to_table().num_rows
        for v in ds.versions()
    }


def test_gc_removes_orphans_and_stale_jobs_and_keeps_every_version(table):
    _kill_backfill_midway(table)  # job slow_upper v1: results + a dead holder's lock file
    add_column(table, None, n_chars2, workers=0)
    add_column(table, None, upper_v2, workers=0)  # the column by v2: v1's job is now stale
    Table.open(table).dataset.delete("id % 7 = 0")  # a deletion file
    planted = os.path.join(table, "data", "planted-orphan.lance")
    with open(planted, "wb") as fh:
        fh.write(b"\0" * 1234)
    merged = _orphan_from_an_uncommitted_merge(table)
    job_v2 = os.path.join(default_checkpoint_root(table), f"n_upper-{upper_v2.fingerprint()}")
    with open(os.path.join(job_v2, "units", "u.arrow.0123.tmp"), "w") as fh:
        fh.write("half a write")
    rows_before = _read_every_version(table)
    referenced = referenced_files(Table.open(table))
    assert len(Table.open(table).dataset.versions()) == len(rows_before) >= 6
    assert referenced and all(os.path.exists(os.path.join(table, r)) for r in referenced)
    time.sleep(0.05)

    dry = _cli("gc", "--table", table)
    assert dry.returncode == 0, dry.stderr
    assert "would delete" in dry.stdout and "--yes" in dry.stdout and "bytes" in dry.stdout
    assert os.path.exists(planted) and os.path.exists(merged)

    shown = json.loads(_cli("gc", "--table", table, "--json").stdout)
    kinds = {(i["kind"], os.path.basename(i["path"])) for i in shown["items"]}
    assert ("orphan", "planted-orphan.lance") in kinds
    assert ("orphan", os.path.basename(merged)) in kinds
    assert ("temporary", "u.arrow.0123.tmp") in kinds
    stale_jobs = [i for i in shown["items"] if i["kind"] == "job"]
    assert len(stale_jobs) == 1 and "another UDF version" in stale_jobs[0]["reason"]
    assert shown["bytes"] == sum(i["bytes"] for i in shown["items"]) > 1234
    assert not any(os.path.relpath(i["path"], table) in referenced for i in shown["items"])

    done = _cli("gc", "--table", table, "--yes")
    assert done.returncode == 0, done.stderr
    assert "deleted" in done.stdout
    assert not os.path.exists(planted) and not os.path.exists(merged)
    assert not os.path.exists(stale_jobs[0]["path"])
    for rel in referenced:  # every file a version reads is still there
        assert os.path.exists(os.path.join(table, rel)), rel
    assert _read_every_version(table) == rows_before
    assert [j.state for j in list_jobs(default_checkpoint_root(table))] == ["committed"] * 2

    again = _cli("gc", "--table", table)
    assert again.returncode == 0 and "nothing to delete" in again.stdout


def test_the_next_backfill_cleans_what_a_killed_one_left(table):
    _kill_backfill_midway(table)
    root = default_checkpoint_root(table)
    (job,) = [os.path.join(root, d) for d in os.listdir(root)]
    assert os.path.exists(os.path.join(job, "lock"))  # its holder is dead
    with open(os.path.join(job, "job.json.abc.tmp"), "w") as fh:
        fh.write("{")
    os.makedirs(os.path.join(root, "n_gone-0123abcd"))  # a job dir with no job.json
    os.environ["TOKENLOOM_TEST_SLEEP"] = "0"
    try:
        from tests.backfill.udfs import slow_upper

        result = add_column(table, None, slow_upper, workers=2, unit_rows=8)  # the same plan
    finally:
        del os.environ["TOKENLOOM_TEST_SLEEP"]
    assert result.units_reused >= 2  # the killed run's results were used, not cleaned
    left = sorted(os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root)
                  for f in fs)  # fmt: skip
    assert left == [os.path.relpath(os.path.join(job, "job.json"), root)]


def test_a_held_job_lock_names_its_holder_and_times_out(table):
    job = os.path.join(default_checkpoint_root(table), f"n_chars2-{n_chars2.fingerprint()}")
    with FileLock(os.path.join(job, "lock"), what="a test holding the lock").acquire(0):
        proc = subprocess.run(
            [sys.executable, "-c", _BACKFILL_N_CHARS2, table],
            capture_output=True, text=True, env=ENV, timeout=60,
        )  # fmt: skip
        gc = _cli("gc", "--table", table, "--lock-timeout", "0.5")
    assert proc.returncode == 1, proc.stderr
    holder = f"pid {os.getpid()} on host {socket.gethostname()} since "
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("waiting for the backfill of n_chars2") and holder in lines[0]
    assert (
        lines[-1].startswith("error: the backfill of n_chars2")
        and "gave up after 0.5 s" in lines[-1]
    )
    assert holder in lines[-1] and "for a test holding the lock" in lines[-1]
    assert gc.returncode == 1 and holder in gc.stderr and "gave up after 0.5 s" in gc.stderr
    assert "n_chars2" not in Table.open(table).schema().names
    assert not os.path.exists(os.path.join(job, "lock"))  # released: nothing left


_BACKFILL_N_CHARS2 = """
import sys
from tokenloom.cli.main import main
main(["backfill", "run", "--table", sys.argv[1], "--udf", "tests.table.test_gc:n_chars2",
      "--workers", "0", "--lock-timeout", "0.5"])
"""


def test_gc_removes_stale_checkpoint_temporaries_of_dead_processes(table, tmp_path):
    runs = tmp_path / "runs" / "r1"
    runs.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (runs / "step_100.pt").write_bytes(b"kept")
    (runs / f"step_200.pt.tmp-{dead.pid}").write_bytes(b"x" * 100)
    (runs / f"step_300.pt.tmp-{os.getpid()}").write_bytes(b"still being written")
    report = collect_garbage(table, runs=str(tmp_path / "runs"), delete=True)
    assert [(i.kind, os.path.basename(i.path)) for i in report.items] == [
        ("checkpoint", f"step_200.pt.tmp-{dead.pid}")
    ]
    assert sorted(os.listdir(runs)) == ["step_100.pt", f"step_300.pt.tmp-{os.getpid()}"]


def test_file_lock_leaves_nothing_and_a_dead_holder_never_blocks(tmp_path):
    path = str(tmp_path / "sub" / "lock")
    with FileLock(path, what="first").acquire(0):
        with pytest.raises(LockTimeoutError, match="locked by pid"):
            FileLock(path, what="second").acquire(0.2, on_wait=None)
    assert not os.path.exists(path)
    code = f"from tokenloom.table.locks import FileLock; FileLock({path!r}, what='x').acquire(0)"
    subprocess.run([sys.executable, "-c", code + "; import os; os._exit(0)"], env=ENV, check=True)
    assert os.path.exists(path)  # its holder died without releasing
    with FileLock(path, what="after").acquire(0):  # the kernel released it
        pass
    assert not os.path.exists(path)


def test_checkpoints_of_object_store_tables_never_go_to_the_current_directory():
    a = default_checkpoint_root("s3://bucket/corpus.lance")
    assert not a.startswith(os.getcwd() + os.sep) and "tokenloom" in a
    assert a == default_checkpoint_root("s3://bucket/corpus.lance/")
    assert a != default_checkpoint_root("s3://other/corpus.lance")
    assert default_checkpoint_root("rel.lance") == os.path.abspath("rel.lance") + ".backfill"


def test_gc_never_deletes_a_file_a_running_ingest_may_still_commit(table):
    """A live writer's journal protects its files, however old; once it is gone they are
    orphans like any other."""
    journal = RunJournal(table)  # a writer that is alive (this process holds the lock)
    pending = os.path.join(table, "data", "pending-commit.lance")
    journal.add("data/pending-commit.lance")
    with open(pending, "wb") as fh:
        fh.write(b"\0" * 99)
    os.utime(pending, (time.time() - 3600, time.time() - 3600))
    report = collect_garbage(table, delete=True)
    assert os.path.exists(pending)
    assert all(i.path != pending for i in report.items)
    journal.close()  # the writer finished without committing it
    report = collect_garbage(table, delete=True)
    assert not os.path.exists(pending) and any(i.path == pending for i in report.items)
