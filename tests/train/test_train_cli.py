"""``tokenloom train`` (with --resume) and ``tokenloom sample`` through the CLI."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402


def test_train_resume_and_sample(tmp_path):
    uri = gpt2_table(tmp_path, real_paragraphs(40))
    base = [
        "train",
        "--table",
        uri,
        "--out",
        str(tmp_path / "run"),
        "--seq-len",
        "32",
        "--global-batch-size",
        "2",
        "--checkpoint-every",
        "2",
        "--log-every",
        "1",
        "--val-filter",
        "id % 10 = 0",
        "--eval-every",
        "2",
    ]
    out = CliRunner().invoke(cli, [*base, "--steps", "2"])
    assert out.exit_code == 0, out.output
    assert "step      2  loss" in out.output and "val loss" in out.output
    png = tmp_path / "loss.png"
    out = CliRunner().invoke(cli, [*base, "--steps", "4", "--resume", "--plot", str(png)])
    assert "--reschedule" in str(out.exception)  # a longer schedule only knowingly
    resume = [*base, "--steps", "4", "--resume", "--reschedule", "--plot", str(png)]
    out = CliRunner().invoke(cli, resume)
    assert out.exit_code == 0, out.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # curves of the whole run
    assert "step      3" in out.output and "step      1 " not in out.output  # continued
    out = CliRunner().invoke(
        cli,
        [
            "sample",
            "--checkpoint",
            str(tmp_path / "run"),
            "--prompt",
            "The table",
            "--max-new-tokens",
            "5",
        ],
    )
    assert out.exit_code == 0, out.output
    assert out.output.startswith("The table")
