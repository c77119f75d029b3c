"""`tokenloom trace`: step -> rows equals what the loader fed a real run; row -> steps is its
exact inverse, across epochs (world size 1 here; 2 -> 1 in tests/train/test_ddp.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tests.search.provenance import assert_trace_matches_log  # noqa: E402
from tokenloom.cli.main import cli  # noqa: E402
from tokenloom.loader import LoaderSpec, PackedDataset  # noqa: E402
from tokenloom.search.trace import TraceError, open_run  # noqa: E402
from tokenloom.train.loop import TrainConfig, train  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    uri = token_table(tmp, real_paragraphs(30))
    spec = LoaderSpec(table=uri, filter="id % 5 != 0", seq_len=64, global_batch=6)
    steps = PackedDataset(spec).epoch_info(0)["steps"] + 3  # the 2nd epoch sees every row again
    cfg = TrainConfig(
        loader=spec, out=str(tmp / "run"), micro_batch_size=3, steps=steps,
        checkpoint_every=1000, log_every=1000, provenance_log=True,
    )  # fmt: skip
    train(cfg, log=lambda *_: None)
    return cfg, steps


def test_trace_equals_the_loaders_provenance_and_inverts(run):
    cfg, steps = run
    trace, rows = assert_trace_matches_log(cfg.out, steps=steps, world_at=lambda s: 1)
    assert any(len({x[0] for x in seen}) > 1 for seen in rows.values())  # repeats across epochs
    assert trace.row(5) == []  # filtered out: never seen
    with pytest.raises(TraceError, match="outside the run"):
        trace.step(steps + 1)


def test_trace_cli(run):
    cfg, steps = run
    out = CliRunner().invoke(cli, ["trace", "--checkpoint", cfg.out, "--step", "2", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert [tuple(r["provenance"]) for r in got["rows"]] == [
        s.as_tuple() for s in open_run(cfg.out).step(2)
    ]
    assert all(r["snippet"] for r in got["rows"])
    row = got["rows"][0]["row_id"]
    out = CliRunner().invoke(cli, ["trace", "--checkpoint", cfg.out, "--row", str(row)])
    assert out.exit_code == 0, out.output
    assert f"row {row}" in out.output and "step" in out.output
