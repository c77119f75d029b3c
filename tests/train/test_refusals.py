"""Training refuses what cannot work, saying why: a device name torch does not know, a GPU the
machine lacks, a bad optimizer value, a selection that holds no training step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs, run_cli  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader.plan.spec import LoaderSpec  # noqa: E402
from tokenloom.train.config import TrainConfig, TrainError  # noqa: E402
from tokenloom.train.dist import parse_device, resolve_device  # noqa: E402


def test_device_names():
    assert parse_device("auto") is None
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device("cuda:1") == torch.device("cuda", 1)
    for bad in ("gpu", "cuda:x", "cpu:-1:2"):
        with pytest.raises(TrainError, match="is not a device name.*auto, cpu, cuda or cuda:N"):
            parse_device(bad)
    assert resolve_device("cpu") == torch.device("cpu")
    missing = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(TrainError, match=rf"cuda:{missing}' is not available.*--device cpu"):
        resolve_device(f"cuda:{missing}")


@pytest.mark.parametrize(
    ("field", "value"), [("lr", 0.0), ("lr", float("nan")), ("weight_decay", -1)]
)
def test_the_config_refuses_a_bad_optimizer_value(tmp_path, field, value):
    spec = LoaderSpec(table=str(tmp_path / "t.lance"))
    with pytest.raises(TrainError, match=field):
        TrainConfig(loader=spec, out=str(tmp_path / "run"), steps=1, **{field: value})


@pytest.mark.parametrize(
    ("args", "why"),
    [(("--filter", "id < 0"), "selects 0 rows and no token"), (("--drop-last",), "--drop-last")],
    ids=["empty-filter", "less-than-one-step"],
)
def test_a_selection_without_a_single_step_is_refused_not_looped(tmp_path, args, why):
    # Every epoch would end at once and the loop would start the next one forever.
    uri = token_table(tmp_path, real_paragraphs(6))
    mine = tmp_path / "mine"  # a folder of the user's: the refused run leaves it as it was
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    out = tmp_path / "runs" / "run" if args[0] == "--filter" else mine
    shape = ("--seq-len", "512", "--global-batch-size", "8", "--steps", "1")
    proc = run_cli(
        "--quiet", "train", "--table", uri, "--out", str(out), *shape, *args, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert "epoch 0 has no step" in proc.stderr and why in proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing written, and no empty --out (nor the parent it made) left: a rerun needs no flag
    assert not (tmp_path / "runs").exists()
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "kept"


def test_loss_slices_are_refused_on_grouped_rows(tmp_path):
    # A slice's membership is by table row; a grouped run's stretches are groups of files.
    spec = LoaderSpec(table=str(tmp_path / "t.lance"), group={"key": "package"})
    with pytest.raises(TrainError, match="--loss-slice, or drop --group-by"):
        TrainConfig(loader=spec, out=str(tmp_path / "run"), steps=1, loss_slices=["a=id < 5"])
