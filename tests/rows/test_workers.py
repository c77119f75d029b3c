"""The row loader on tokenloom's own workers
(:class:`~tokenloom.loader.pipeline.workers.WorkerPool`): no torch in them, arrays through shared
memory, a dead worker noticed within seconds, SIGTERM ends the tree, and a resumed loader continues
exactly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from tests.rows.hooks import slow_k
from tests.rows.tables import decode, row_table
from tokenloom.loader.pipeline.workers import WorkerError
from tokenloom.rows import RowDataset, RowLoader, RowSpec


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return row_table(tmp_path_factory.mktemp("row-workers"), n=36)


def _ds(table, **kw) -> RowDataset:
    spec = RowSpec(table=table, columns=("k", "payload"), global_batch=4, seed=7)
    return RowDataset(spec, transform=kw.pop("transform", decode), **kw)


@pytest.mark.parametrize("fmt", ["torch", "python"])
def test_workers_import_no_torch_and_give_the_in_process_batches(table, fmt):
    expected = list(_ds(table, format=fmt))
    ds = _ds(table, format=fmt)
    dl = RowLoader(ds, num_workers=2)
    got = list(dl)
    assert dl.worker_pool.torch_imported is False
    if fmt == "python":
        assert got == expected
    else:
        assert [sorted(b) for b in got] == [sorted(b) for b in expected]
        for g, e in zip(got, expected, strict=True):
            assert all(isinstance(g[k], torch.Tensor) and torch.equal(g[k], e[k]) for k in e)
    assert ds.cursor == (1, 0) and len(got) == 9


def test_arrays_of_any_dtype_and_shape_cross_in_shared_memory(table):
    expected = list(_ds(table, transform=slow_k, format="numpy"))
    got = list(RowLoader(_ds(table, transform=slow_k, format="numpy"), num_workers=2))
    for g, e in zip(got, expected, strict=True):
        assert list(g) == list(e)
        for k in e:
            assert g[k].dtype == e[k].dtype and g[k].shape == e[k].shape
            np.testing.assert_array_equal(g[k], e[k])
    # a view of a worker's ring (its base is the lent slot), not a pickled copy
    assert got[0]["grid"].base is not None and not got[0]["grid"].flags.owndata


def test_a_state_taken_mid_epoch_resumes_exactly_on_other_workers(table):
    ref = _ds(table)
    whole = [b["row_id"].tolist() for b in ref] + [b["row_id"].tolist() for b in ref]
    ds = _ds(table)
    first = []
    for b in RowLoader(ds, num_workers=2):
        first.append(b["row_id"].tolist())
        if len(first) == 4:
            break
    state = RowLoader(ds).state_dict()
    assert (state["epoch"], state["step"]) == (0, 4)
    again = _ds(table)
    dl = RowLoader(again, num_workers=3, persistent_workers=True)
    dl.load_state_dict(state)
    rest = [b["row_id"].tolist() for b in dl] + [b["row_id"].tolist() for b in dl]
    dl.close()
    assert first + rest == whole


def test_a_killed_worker_is_noticed_within_seconds(table):
    dl = RowLoader(_ds(table, transform=slow_k), num_workers=2)
    it = iter(dl)
    next(it)
    pid = dl.worker_pool.pids[1]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        for _ in it:
            pass
    assert time.monotonic() - killed < 5  # its queue and the other's would last longer
    said = rf"worker 1 \(pid {pid}\) exited unexpectedly with code -9, killed by SIGKILL"
    assert re.search(said, str(caught.value)), caught.value


_TRAINER = """
import sys
from tests.rows.hooks import slow_k
from tokenloom.rows import RowDataset, RowLoader
ds = RowDataset(sys.argv[1], columns=["k"], global_batch=4, transform=slow_k)
dl = RowLoader(ds, num_workers=2)
for i, batch in enumerate(dl):
    if i == 0:
        print(*dl.worker_pool.pids, flush=True)
print("finished", flush=True)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_ends_the_training_process_and_its_workers(table, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(script), table], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, pids
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM and "finished" not in out
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _running(p)]
    assert not alive, f"workers outlived the training process: {alive}"
