"""``tokenloom train`` (with --resume) and ``tokenloom sample`` through the CLI."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs  # noqa: E402
from tests.verify.tables import gpt2_table  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.loader.plan.spec import LoaderSpec  # noqa: E402
from tokenloom.train.config import TrainError  # noqa: E402


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
        "--keep-every",
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
    prompt = ["--prompt", "The table", "--max-new-tokens", "5", "--temperature", "0"]
    first = CliRunner().invoke(cli, ["sample", "--run", str(tmp_path / "run" / "step-2"), *prompt])
    last = CliRunner().invoke(cli, ["sample", "--run", str(tmp_path / "run" / "step-4"), *prompt])
    assert first.exit_code == 0 and last.exit_code == 0, first.output + last.output
    assert first.output.startswith("The table")


def _train_options():
    from tokenloom.cli.train import train

    return {p.name: p for p in train.params if isinstance(p, click.Option)}


def test_every_trainer_knob_is_a_train_option_declared_by_its_field():
    from tokenloom.train.config import knobs

    options = _train_options()
    for f in knobs():
        opt = options[f.name]
        assert opt.opts == [f.metadata["flag"] or f"--{f.name.replace('_', '-')}"]
        assert opt.help.startswith(f.metadata["help"])
        assert opt.default is None  # not given: TrainConfig's own default applies
        if f.default not in (None, (), False):
            assert opt.help.endswith(f"[default: {f.default}]")
        if f.metadata["choices"]:
            assert list(opt.type.choices) == list(f.metadata["choices"])
    assert list(options["model"].type.choices) == ["tiny", "small", "medium"]  # the presets


def test_a_new_knob_is_one_field(tmp_path):
    """A TrainConfig subclass with one more knob: its option, range and default come with it."""
    import dataclasses

    from tokenloom.cli.train import trainer_options
    from tokenloom.train.config import TrainConfig, knob

    Bigger = dataclasses.make_dataclass(
        "Bigger",
        [("ema_decay", float, knob(0.99, "EMA of the weights.", min=0, max=1))],
        bases=(TrainConfig,),
        frozen=True,
        kw_only=True,
    )
    seen = {}

    @click.command()
    @trainer_options(Bigger)
    def cmd(**options):
        seen.update(options)

    out = CliRunner().invoke(cmd, ["--help"])
    assert (
        "--ema-decay FLOAT RANGE" in out.output
        and "EMA of the weights. [default: 0.99]" in out.output
    )
    assert CliRunner().invoke(cmd, ["--ema-decay", "0.5"]).exit_code == 0
    assert seen["ema_decay"] == 0.5
    bad = CliRunner().invoke(cmd, ["--ema-decay", "2"])
    assert bad.exit_code == 2 and "--ema-decay" in bad.output
    with pytest.raises(TrainError, match="ema_decay must be <= 1"):  # the same rule in the config
        Bigger(loader=LoaderSpec(table=str(tmp_path / "t.lance")), out="x", ema_decay=2.0)


def test_the_cli_builds_trainconfig_defaults_when_no_knob_is_given(tmp_path, monkeypatch):
    from tokenloom.train import loop
    from tokenloom.train.config import knobs

    uri = gpt2_table(tmp_path, real_paragraphs(10))
    built = []

    def fake_train(cfg, **_):
        built.append(cfg)
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(loop, "train", fake_train)
    out = CliRunner().invoke(cli, ["train", "--table", uri, "--out", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    for f in knobs():
        assert getattr(built[0], f.name) == f.default, f.name
    CliRunner().invoke(
        cli, ["train", "--table", uri, "--out", str(tmp_path / "r"), "--epochs", "2"]
    )
    assert built[1].epochs == 2 and built[1].steps is None
