"""tokenloom's own DataLoader workers: no torch in them, exact order, failures reported, no
process left behind (their rings are anonymous shared memory: no file to leave)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from tests.conftest import real_paragraphs
from tests.loader.tables import token_table
from tests.loader.worker_hooks import fail_in_worker_1, kill_worker_1
from tokenloom.loader import DataLoader, PackedDataset
from tokenloom.loader.pipeline import prebuilt
from tokenloom.loader.pipeline.read import LoaderError
from tokenloom.loader.pipeline.workers import WorkerError
from tokenloom.loader.plan import pack as pack_module

L = 32


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("workers"), real_paragraphs(200))


def _ds(uri: str) -> PackedDataset:
    return PackedDataset(uri, seq_len=L, global_batch=4, seed=5, read_group=2)


def test_workers_import_no_torch_and_keep_the_in_process_stream(table):
    expected = [b["input_ids"] for b in DataLoader(_ds(table), num_workers=0)]
    dl = DataLoader(_ds(table), num_workers=3)
    got = [b["input_ids"] for b in dl]
    assert len(got) == len(expected) > 6
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert dl.worker_pool.torch_imported is False
    assert dl.worker_pool.numba_imported is False  # their packer is built ahead of time
    assert not multiprocessing.active_children()


def test_a_worker_packs_with_the_kernel_built_ahead_of_time(table):
    """What a worker runs (its groups of the stream) packs with the prebuilt module's kernel,
    which the training process builds before it starts workers (numba's JIT stays out)."""
    if not prebuilt.can_build():
        pytest.skip("no C compiler here: workers pack with numpy (tested below)")
    assert prebuilt.ensure() is not None
    module = prebuilt.load()
    kernels = []
    real = pack_module._pack_compiled

    def spy(kernel, *args, **kwargs):
        kernels.append(kernel)
        return real(kernel, *args, **kwargs)

    with (
        mock.patch.object(pack_module, "_PREBUILT", None),
        mock.patch.object(pack_module, "_pack_compiled", spy),
    ):
        groups = _ds(table).detached().groups(0, 2)
        first = list(itertools.islice(groups, 2))
        groups.close()
        assert pack_module._PREBUILT is module
    assert len(first) == 2 and len(kernels) >= 2
    assert all(k in [getattr(module, f"pack_rows_{t}") for t in prebuilt.DTYPES] for k in kernels)


def test_workers_pack_with_numpy_where_the_prebuilt_kernel_cannot_be_built(
    table, tmp_path, monkeypatch
):
    def no_compiler(*args):
        raise OSError("no C compiler")

    monkeypatch.setenv(prebuilt.CACHE_ENV, str(tmp_path / "kernels"))  # the workers' too
    monkeypatch.setattr(prebuilt, "_compile", no_compiler)
    monkeypatch.setattr(prebuilt, "_failed", None)
    expected = [b["labels"] for b in DataLoader(_ds(table), num_workers=0)]
    dl = DataLoader(_ds(table), num_workers=2)
    with pytest.warns(RuntimeWarning, match=r"numpy packer .*no C compiler"):
        got = [b["labels"] for b in dl]
    assert len(got) == len(expected) > 6
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert dl.worker_pool.numba_imported is False
    assert prebuilt.path() is None


def test_the_kernel_is_built_in_a_child_process_into_its_cache(tmp_path):
    """From an empty cache: built whole by a child process (the training process never loads
    numba for it), then loaded without numba."""
    if not prebuilt.can_build():
        pytest.skip("no C compiler here")
    code = (
        "import sys\n"
        "from tokenloom.loader.pipeline import prebuilt\n"
        "built = prebuilt.ensure()\n"
        "assert built is not None and built == prebuilt.path(), built\n"
        "assert 'numba' not in sys.modules\n"
        "module = prebuilt.load()\n"
        "assert all(hasattr(module, f'pack_rows_{t}') for t in prebuilt.DTYPES)\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules\n"
        "print(built)\n"
    )
    env = {**os.environ, prebuilt.CACHE_ENV: str(tmp_path / "kernels")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )  # a hung build fails the test, never hangs the suite
    assert done.returncode == 0, done.stderr[-2000:]
    built = Path(done.stdout.strip())
    assert built.parent == tmp_path / "kernels" and built.is_file()
    assert [p.name for p in built.parent.iterdir() if not p.name.endswith(".lock")] == [built.name]


def test_without_a_c_compiler_the_build_is_not_tried(tmp_path, monkeypatch):
    def compiled(*args):
        raise AssertionError("no build without a compiler")

    monkeypatch.setenv(prebuilt.CACHE_ENV, str(tmp_path / "kernels"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(prebuilt, "_compile", compiled)
    monkeypatch.setattr(prebuilt, "_failed", None)
    assert not prebuilt.can_build()
    with pytest.warns(RuntimeWarning, match="numpy packer .*no C compiler"):
        assert prebuilt.ensure() is None
    assert prebuilt.ensure() is None  # warned once a process
    assert not (tmp_path / "kernels").exists() and prebuilt.load() is None


def test_a_worker_exception_is_raised_with_its_traceback(table):
    dl = DataLoader(_ds(table), num_workers=2, worker_init_fn=fail_in_worker_1)
    with pytest.raises(ValueError, match="worker 1 failed") as info:
        list(dl)
    assert "bad shard settings in worker 1" in str(info.value)
    assert "fail_in_worker_1" in str(info.value)  # the worker's traceback
    assert not multiprocessing.active_children()


def test_a_killed_worker_is_reported_not_waited_for(table):
    dl = DataLoader(_ds(table), num_workers=2, worker_init_fn=kill_worker_1)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) exited unexpectedly with code -9"):
        for _ in dl:
            pass
    assert not multiprocessing.active_children()


def test_stopping_early_stops_the_workers(table):
    dl = DataLoader(_ds(table), num_workers=2)
    it = iter(dl)
    next(it)
    it.close()
    assert not multiprocessing.active_children()
    # the cursor says one batch was delivered; a new pass continues from there
    assert dl.state_dict()["step"] == 1


def test_a_plain_torch_dataloader_with_workers_is_refused(table):
    plain = torch.utils.data.DataLoader(
        _ds(table), batch_size=None, num_workers=1, multiprocessing_context="spawn"
    )
    with pytest.raises(Exception, match="tokenloom.loader.DataLoader"):
        next(iter(plain))


_TRAINER = """
import sys, time
from tokenloom.loader import DataLoader, PackedDataset
def main():
    ds = PackedDataset(sys.argv[1], seq_len=32, global_batch=4, seed=5, read_group=2)
    dl = DataLoader(ds, num_workers=2, prefetch_factor=1, multiprocessing_context=sys.argv[2])
    for i, _ in enumerate(dl):
        if i == 0:
            import multiprocessing
            print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
        time.sleep(0.2)
if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_training_process_killed_outright_takes_its_workers_along(table, tmp_path, context):
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), table, context], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    pids = [int(p) for p in line.split()]
    assert len(pids) >= 2, line  # the two workers (and the resource tracker)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and _running(p)]
    assert not alive, f"workers outlived the training process: {alive}"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_FAILING = """
import sys
from tests.loader.worker_hooks import fail_in_worker_1
from tokenloom.loader import DataLoader, PackedDataset
def main():
    ds = PackedDataset(sys.argv[1], seq_len=32, global_batch=4, seed=5, read_group=2)
    for _ in DataLoader(ds, num_workers=2, worker_init_fn=fail_in_worker_1):
        pass
    print("finished")
if __name__ == "__main__":
    main()
"""


def test_a_failing_worker_fails_the_training_process(table, tmp_path):
    """Through a real process: the worker's error ends the training script with a non-zero
    status and the worker's traceback, never a silent or hung run."""
    import subprocess
    import sys

    script = tmp_path / "failing.py"
    script.write_text(_FAILING)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, str(script), table],
        capture_output=True, text=True, timeout=120, env=env, cwd=root,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "finished" not in out.stdout
    assert "DataLoader worker 1 failed" in out.stderr
    assert "bad shard settings in worker 1" in out.stderr


def _epochs(dl, epochs: int, *, stop_after: int | None = None) -> list[torch.Tensor]:
    """``input_ids`` of ``epochs`` passes over ``dl`` (the last one left after ``stop_after``
    batches when given)."""
    out = []
    for e in range(epochs):
        for i, batch in enumerate(dl):
            out.append(batch["input_ids"])
            if stop_after is not None and e == epochs - 1 and i + 1 == stop_after:
                break
    return out


def test_persistent_workers_keep_their_processes_and_the_stream_across_epochs(table):
    expected = _epochs(DataLoader(_ds(table), num_workers=0), 3)
    ds = _ds(table)
    dl = DataLoader(ds, num_workers=2, persistent_workers=True)
    got = []
    pids = []
    for _ in range(3):
        got += [b["input_ids"] for b in dl]
        pids.append(dl.worker_pool.pids)
    assert len(got) == len(expected) > 12
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert pids[0] == pids[1] == pids[2] and len(set(pids[0])) == 2  # the same two processes
    assert dl.worker_pool.passes == 3 and ds.epoch == 3 and ds.step == 0
    assert len(multiprocessing.active_children()) == 2
    # set_epoch reaches the kept workers: each pass is told its cursor
    ds.set_epoch(1)
    again = [b["input_ids"] for b in dl]
    first_epoch = len(expected) // 3
    assert all(
        torch.equal(a, b)
        for a, b in zip(again, expected[first_epoch : 2 * first_epoch], strict=True)
    )
    assert dl.worker_pool.pids == pids[0]
    dl.close()
    assert not multiprocessing.active_children()


def test_persistent_workers_left_mid_epoch_restart_from_the_cursor(table):
    expected = _epochs(DataLoader(_ds(table), num_workers=0), 2)
    dl = DataLoader(_ds(table), num_workers=2, persistent_workers=True)
    got = _epochs(dl, 1, stop_after=3)  # a pass left early stops its workers
    assert not multiprocessing.active_children()
    state = dl.state_dict()
    got += [b["input_ids"] for b in dl]  # the rest of epoch 0, from new workers
    got += [b["input_ids"] for b in dl]  # epoch 1, the same workers
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert len(got) == len(expected)
    # a resumed loader with persistent workers continues the same stream
    resumed = DataLoader(_ds(table), num_workers=2, persistent_workers=True)
    resumed.load_state_dict(state)
    rest = _epochs(resumed, 2)
    assert all(torch.equal(a, b) for a, b in zip(rest, expected[3:], strict=True))
    assert len(rest) == len(expected) - 3
    resumed.close()
    dl.close()
    assert not multiprocessing.active_children()


def test_persistent_workers_are_not_shared_by_two_passes_at_once(table):
    expected = [b["input_ids"] for b in DataLoader(_ds(table), num_workers=0)]
    dl = DataLoader(_ds(table), num_workers=2, persistent_workers=True)
    first = iter(dl)
    got = [next(first)["input_ids"]]
    pool = dl.worker_pool
    got += [b["input_ids"] for b in dl]  # a second pass from the cursor, with its own workers
    assert dl.worker_pool is not pool
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert len(got) == len(expected)
    first.close()
    dl.close()
    assert not multiprocessing.active_children()


def test_a_persistent_worker_killed_between_passes_is_reported_at_the_next_pass(table):
    import signal

    dl = DataLoader(_ds(table), num_workers=2, persistent_workers=True)
    assert len([b for b in dl]) > 6
    pids = dl.worker_pool.pids
    os.kill(pids[1], signal.SIGKILL)
    said = rf"worker 1 \(pid {pids[1]}\) exited unexpectedly with code -9, killed by SIGKILL"
    with pytest.raises(WorkerError, match=said):
        for _ in dl:
            pass
    assert not multiprocessing.active_children()  # the other one is stopped too
    assert [b for b in dl]  # the next pass starts new workers
    dl.close()
    assert not multiprocessing.active_children()


_LONG_TRAINER = """
import multiprocessing, sys, time
from tokenloom.loader import DataLoader, PackedDataset
def main():
    ds = PackedDataset(sys.argv[1], seq_len=32, global_batch=4, seed=5, read_group=1)
    for i, _ in enumerate(DataLoader(ds, num_workers=2, prefetch_factor=16)):
        if i == 0:
            print(" ".join(str(p.pid) for p in multiprocessing.active_children()
                           if p.name.startswith("tokenloom-loader")), flush=True)
        time.sleep(1.5)  # a training step: 16 groups of each worker queued meanwhile
    print("finished", flush=True)
if __name__ == "__main__":
    main()
"""


def test_a_worker_killed_outright_ends_the_training_process_within_seconds(table, tmp_path):
    """Through a real process: with many groups still queued from the other worker (and its
    own), a SIGKILLed worker ends the training process at once, naming the worker, its exit
    code and the signal."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "trainer.py"
    script.write_text(_LONG_TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), table], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)  # what the kernel's out-of-memory killer does
        killed = time.monotonic()
        out, err = proc.communicate(timeout=60)
        # the queued groups would last 48 s; the bound leaves a loaded machine room to exit
        assert time.monotonic() - killed < 15
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.decode()
    assert proc.returncode == 1 and b"finished" not in out, text
    said = rf"worker [01] \(pid {pids[1]}\) exited unexpectedly with code -9, killed by SIGKILL"
    assert re.search(said, text), text


@pytest.mark.parametrize("context", ["forkserver", multiprocessing.get_context("forkserver")])
def test_forkserver_workers_give_the_in_process_stream(table, context):
    expected = [b["input_ids"] for b in DataLoader(_ds(table), num_workers=0)]
    got = [
        b["input_ids"]
        for b in DataLoader(_ds(table), num_workers=2, multiprocessing_context=context)
    ]
    assert len(got) == len(expected) > 6
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert not multiprocessing.active_children()


def test_fork_workers_are_refused_naming_the_start_methods_that_work(table):
    with pytest.raises(LoaderError, match="Lance is not fork-safe.*'spawn'.*'forkserver'"):
        DataLoader(_ds(table), num_workers=2, multiprocessing_context="fork")
