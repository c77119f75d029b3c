"""The simulated GPU consumer: its arithmetic, its bookkeeping, and the stall and verdict it
reports on a real loader fed to a slow and to a fast consumer, or read through a slow reader."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import DataLoader, PackedDataset  # noqa: E402
from tokenloom.loader.observe.profile import GpuSim, parse_gpu_sims, simulate  # noqa: E402
from tokenloom.loader.pipeline.read import TokenReader  # noqa: E402
from tokenloom.train.flops import flops_per_token  # noqa: E402
from tokenloom.train.model import GPT  # noqa: E402


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return token_table(tmp_path_factory.mktemp("profile"), real_paragraphs(120))


def _loader(uri: str, **read: int) -> DataLoader:
    ds = PackedDataset(uri, seq_len=64, global_batch=4, seed=0, read_group=1, **read)
    return DataLoader(ds, num_workers=0)


def test_gpt2_step_time_follows_peak_times_mfu_over_flops_per_token():
    with torch.device("meta"):
        small = flops_per_token(GPT.preset("small"), 1024)
    sim = GpuSim.gpt2("124M", 1024)
    assert sim.tokens_per_second == pytest.approx(989e12 * 0.4 / small)
    assert round(sim.tokens_per_second, -2) == 462_600  # 6 N + 12 L H T = 855.2 MFLOP/token
    assert round(GpuSim.gpt2("354M", 1024).tokens_per_second, -2) == 163_200
    assert sim.step_seconds(8 * 1024) == pytest.approx(8 * 1024 / sim.tokens_per_second)
    assert [s.model for s in parse_gpu_sims("124M, medium", 1024)] == ["124M", "354M"]
    with pytest.raises(ValueError, match="unknown GPT-2 size '7B'; choose from 124M, 354M"):
        parse_gpu_sims("124M,7B", 1024)


def test_simulate_sleeps_each_batch_for_its_tokens_and_runs_passes_to_the_budget():
    sim = GpuSim(model="x", flops_per_token=1.0, peak_flops=1000.0, mfu=0.5)  # 500 tok/s
    slept: list[float] = []
    batches = [torch.zeros(2, 8), {"input_ids": torch.zeros(1, 8)}]
    result = simulate(batches, sim, steps=5, sleep=slept.append)
    assert (result.steps, result.tokens) == (5, 16 + 8 + 16 + 8 + 16)
    assert slept == [16 / 500, 8 / 500, 16 / 500, 8 / 500, 16 / 500]
    assert 0 <= result.stall <= 1 and result.verdict == ""  # a list has no loader stats
    assert simulate(batches, sim, sleep=slept.append).steps == 2  # no budget: one pass


def test_a_slow_gpu_hides_the_loader_and_a_fast_one_waits_for_it(table):
    # 60 ms a step of 256 tokens: the loader hides behind it even on two cores busy with other
    # work (at 20 ms a loaded machine once made it wait: a stall, truly measured, not the point)
    slow = GpuSim(model="slow", flops_per_token=1.0, peak_flops=256 / 0.06, mfu=1.0)
    fast = GpuSim(model="fast", flops_per_token=1.0, peak_flops=1e15, mfu=1.0)  # ~0 ms
    fed = simulate(_loader(table), slow, steps=25)
    starved = simulate(_loader(table), fast, steps=25)
    assert fed.steps == starved.steps == 25
    assert fed.stall < starved.stall
    assert fed.bottleneck == "consumer" and "the consumer is the bottleneck" in fed.verdict


def test_a_slow_reader_is_named_the_bottleneck(table, monkeypatch):
    original = TokenReader._take  # every read of rows goes through it, timed as reading

    def slow_take(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        time.sleep(0.1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TokenReader, "_take", slow_take)
    fast = GpuSim(model="fast", flops_per_token=1.0, peak_flops=1e15, mfu=1.0)
    # one read at a time, two groups ahead: the pipeline sized from a slow probe may otherwise
    # read every step of the run ahead while the first batch is awaited (start-up, not stall)
    loader = _loader(table, io_threads=1, read_ahead=2)
    result = simulate(loader, fast, steps=12)
    assert result.bottleneck == "read", result.verdict
    assert result.verdict.startswith("reading is the bottleneck: the packed queue was empty")
    assert result.stall > 0.5
