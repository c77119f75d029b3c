"""``train --resume --data-change continue`` through the real CLI: the run finishes its epoch on
the changed table exactly, a ``kill -9`` after the change resumes to the same batches, the record,
``runs``, ``ledger`` and ``trace`` follow the change, and the refusals name the option."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import lance
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # kill/resume through real training processes: minutes

from tests.conftest import REPO, invoke, real_paragraphs, run_cli, write_jsonl  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.train.torchrun import step_on_disk  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.refresh import refresh_table  # noqa: E402
from tokenloom.table import Table  # noqa: E402
from tokenloom.train.checkpoint import load_checkpoint  # noqa: E402
from tokenloom.train.record import read_record  # noqa: E402

SHAPE = ("--seq-len", "64", "--global-batch-size", "4", "--log-every", "100")
ENV = {"OMP_NUM_THREADS": "1"}
END = 12  # both runs stop here


def _losses(out) -> list[float]:
    return [loss for _, loss in load_checkpoint(out).history["train"]]


def test_continue_onto_appended_and_deleted_rows_resumes_exactly_after_a_kill(tmp_path):
    paras = real_paragraphs(60)
    uri = token_table(tmp_path, paras[:40])
    v0 = Table.open(uri).version
    a = tmp_path / "a"
    invoke("train", "--table", uri, "--out", str(a), *SHAPE, "--steps", "40", "--stop-at", "3",
           "--checkpoint-every", "1")  # fmt: skip
    # the table changes under the run: rows appended (and tokenized), one deleted
    write_jsonl(tmp_path / "more.jsonl", [{"text": t, "source": "new"} for t in paras[40:]])
    ingest([tmp_path / "more.jsonl"], uri, progress=False)
    refresh_table(uri, workers=0, progress=False)
    lance.dataset(uri).delete("id = 5")
    v1 = Table.open(uri).version
    b = tmp_path / "b"
    shutil.copytree(a, b)

    # a usage error without --resume, and the refusal of the new version names the option
    fresh = run_cli("train", "--table", uri, "--out", str(tmp_path / "c"), *SHAPE,
                    "--steps", "4", "--data-change", "continue", env=ENV)  # fmt: skip
    assert fresh.returncode == 2, fresh.stderr
    assert "--data-change continue applies to --resume only" in fresh.stderr
    both = run_cli("train", "--out", str(a), "--resume", "--data-change", "continue",
                   "--allow-data-change", env=ENV)  # fmt: skip
    assert both.returncode == 2 and "exclude each other" in both.stderr
    newer = run_cli("train", "--out", str(a), "--resume", "--version", str(v1), env=ENV)
    assert newer.returncode == 1, newer.stderr
    assert f"--out {a} --resume --data-change continue" in newer.stderr
    assert "Traceback" not in newer.stderr

    stay = run_cli("train", "--out", str(a), "--resume", "--stop-at", "3", env=ENV)
    assert stay.returncode == 0, stay.stderr  # the default stays on the run's version, saying so
    assert f"has version {v1}; this run stays on its version {v0}" in stay.stderr
    assert "--data-change continue" in stay.stderr

    # uninterrupted: the change at step 4, then on to the end
    done = run_cli("train", "--out", str(a), "--resume", "--data-change", "continue",
                   "--stop-at", str(END), env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"v{v0} -> v{v1} from step 4" in done.stdout
    record = read_record(a)
    assert record.loader.version == v1
    assert [(v["version"], v["from_step"]) for v in record.data_versions] == [(v0, 1), (v1, 4)]
    assert {p["version"] for p in record.pins} == {v0, v1}  # the old version stays readable

    # the same change, killed with -9 after it, then resumed without the flag: the same batches
    args = [sys.executable, "-m", "tokenloom.cli.main", "train", "--out", str(b), "--resume",
            "--data-change", "continue", "--stop-at", str(END)]  # fmt: skip
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get(
        "PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while step_on_disk(b) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    stderr = proc.communicate()[1].decode()
    killed_at = read_record(b).step
    assert proc.returncode == -signal.SIGKILL and 5 <= killed_at < END, (killed_at, stderr)
    again = run_cli("train", "--out", str(b), "--resume", "--stop-at", str(END), env=ENV)
    assert again.returncode == 0, again.stderr
    assert _losses(b) == pytest.approx(_losses(a), rel=1e-5)
    assert read_record(b).data_versions == record.data_versions

    # the ledger counts across the change what the run was fed; runs and trace follow it
    led = json.loads(invoke("ledger", "--run", str(a), "--steps", str(END), "--json"))
    pool = led["pools"][0]
    fed = record.pools[0]
    for key in ("blocks", "body_tokens", "loss_positions", "unique_documents"):
        assert pool[key] == fed[key], key
    assert led["change"]["version_after"] == v1
    runs = invoke("runs", "list", str(tmp_path))
    assert f"versions v{v0} from step 1, v{v1} from step 4 (continue)" in runs
    for step in (2, END):
        tr = invoke("trace", "--run", str(a), "--step", str(step), "--json")
        rows = {r["row_id"] for r in json.loads(tr)["rows"]}
        assert rows and (step < 4 or 5 not in rows)
