"""Golden losses: the first 20 CPU steps of a fixed run, stored in golden_losses.json.

A change to the model, the optimizer, the schedule, the loss normalisation or the loader's
stream shows up here as a different number. Regenerate deliberately with
``TOKENLOOM_UPDATE_GOLDEN=1 pytest tests/train/test_golden.py`` and say why in the commit.
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import LoaderSpec  # noqa: E402
from tokenloom.train.loop import TrainConfig, train  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "golden_losses.json")


def test_first_20_steps_match_the_golden_file(tmp_path):
    uri = token_table(tmp_path, real_paragraphs(60))
    cfg = TrainConfig(
        loader=LoaderSpec(table=uri, seq_len=64, global_batch=4, seed=0, filter="id % 10 != 0"),
        out=str(tmp_path / "run"),
        steps=20,
        lr=3e-3,
        checkpoint_every=100,
        log_every=100,
    )
    losses = train(cfg, log=lambda *_: None).losses
    if os.environ.get("TOKENLOOM_UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as fh:
            json.dump({"config": "see test_golden.py", "losses": losses}, fh, indent=1)
    with open(GOLDEN) as fh:
        golden = json.load(fh)["losses"]
    assert len(golden) == 20
    # CPU fp32; the tolerance absorbs other CPUs' summation order (vector widths), not changes
    assert losses == pytest.approx(golden, rel=2e-4)
    assert golden[-1] < golden[0] - 1.0  # and the run learns
