"""torchrun from a table on a real S3 server: 2 processes train, the launcher is killed (its
ranks die with it), and the run resumes on 1 process through the CLI with exactly the losses of
an uninterrupted 1-process run. Only the table is on S3; the run directory is local."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import invoke, real_paragraphs, write_jsonl  # noqa: E402
from tests.loader.tables import byte_tokens  # noqa: E402
from tests.s3.conftest import so_args  # noqa: E402
from tests.train.torchrun import kill_launcher_at  # noqa: E402
from tokenloom.backfill import add_column  # noqa: E402
from tokenloom.ingest import ingest  # noqa: E402
from tokenloom.loader import LoaderSpec  # noqa: E402
from tokenloom.table import Table  # noqa: E402
from tokenloom.train.loop import TrainConfig, load_checkpoint, train  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 400  # the schedule's length; runs stop long before (kill / stop_at)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _s3_token_table(s3_server, prefix: str, tmp_path) -> str:
    src = tmp_path / "in.jsonl"
    texts = real_paragraphs(80)
    write_jsonl(src, [{"text": t, "source": ("even", "odd")[i % 2]} for i, t in enumerate(texts)])
    uri = f"{prefix}/t.lance"
    so = s3_server.storage_options
    ingest([src], uri, storage_options=so, progress=False)
    add_column(Table.open(uri, storage_options=so), None, byte_tokens, workers=0, progress=False)
    return uri


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # options only
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "src")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_torchrun_from_s3_killed_resumes_on_one_process(
    s3_server, s3_prefix, tmp_path, monkeypatch
):
    table = _s3_token_table(s3_server, s3_prefix, tmp_path)
    so = so_args(s3_server)
    out = tmp_path / "ddp"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tokenloom.cli.main", "train", "--table", table, *so, "--out", str(out),
        "--seq-len", "64", "--global-batch-size", "4", "--micro-batch-size", "2",
        "--steps", str(STEPS), "--checkpoint-every", "2", "--log-every", "1000",
        "--filter", "id % 10 != 0",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=_env(),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    kill_launcher_at(proc, out, step=6, timeout=180)
    state = load_checkpoint(out)
    k = state.step
    assert 6 <= k < STEPS and state.record.world_size == 2
    killed = [loss for _, loss in state.history["train"]]
    assert len(killed) == k

    # an uninterrupted run on one process, the same global batch of 4 blocks: the same losses
    ref = train(
        TrainConfig(
            loader=LoaderSpec(table=table, seq_len=64, global_batch=4, filter="id % 10 != 0"),
            storage_options=s3_server.storage_options,
            out=str(tmp_path / "ref"),
            steps=STEPS,
            stop_at=k + 4,
            checkpoint_every=2,
            eval_every=1000,
            log_every=1000,
        ),
        log=lambda *_: None,
    )
    assert killed == pytest.approx(ref.losses[:k], rel=1e-5)

    # resume the killed 2-process run on 1 process (B=2, K=2) through the CLI (in this process:
    # its success is what counts here): only --out, --resume and the storage options (never
    # recorded, nor in the environment) are needed
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    invoke("train", "--out", str(out), "--resume", "--stop-at", str(k + 4), *so)
    state = load_checkpoint(out)
    assert state.step == k + 4 and state.record.world_size == 1
    resumed = [loss for _, loss in state.history["train"]]
    assert resumed[:k] == killed
    assert resumed[k:] == pytest.approx(ref.losses[k:], rel=1e-4)
    assert "aws_secret_access_key" not in (out / "last.json").read_text()
