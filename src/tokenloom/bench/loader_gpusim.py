"""``tokenloom bench loader --gpu-sim 124M,354M``: would tokenloom's loader keep a GPU busy?

tokenloom's loader on the bench's table, with the bench's batch shape, is consumed by
:func:`tokenloom.loader.observe.profile.simulate`: per batch it sleeps the time GPT-2 of each size
would take to train on it on one H100 at 40% MFU (the assumption is spelled out in
:mod:`tokenloom.loader.observe.profile`), and reports the data stall, the share of time spent
waiting for the next batch, with the loader's own bottleneck verdict. Runs in this process, after
the throughput cases, for the same budget (``--seconds`` or ``--steps``) per model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenloom.bench.loader import LoaderBenchConfig, build_inputs
from tokenloom.bench.loader_data import EOS_ID
from tokenloom.loader.observe.profile import DEVICE, MFU, GpuSim, SimResult, simulate

__all__ = ["format_gpu_sims", "run_gpu_sims"]


def run_gpu_sims(
    config: LoaderBenchConfig,
    sims: list[GpuSim],
    *,
    workers: int = 2,
    log: Callable[[str], None] = lambda _msg: None,
) -> list[SimResult]:
    """Feed each simulated model from a fresh tokenloom loader with ``workers`` workers."""
    from tokenloom.loader import DataLoader, PackedDataset

    table = build_inputs(dataclasses.replace(config, only=("tokenloom",)), log)["table"].path
    results = []
    for sim in sims:
        log(f"simulating GPT-2 {sim.model} on an {DEVICE} (tokenloom, workers={workers}) ...")
        ds = PackedDataset(
            table,
            seq_len=config.seq_len,
            global_batch=config.batch_size,
            block_order="sequential",
            seed=0,
            eos_id=EOS_ID,
            pad_id=EOS_ID,
        )
        loader = DataLoader(ds, num_workers=workers)
        budget = {"steps": config.steps} if config.steps else {"seconds": config.seconds}
        result = simulate(loader, sim, **budget)
        log(f"  data stall {result.stall:.1%}")
        results.append(result)
    return results


def format_gpu_sims(results: list[SimResult], sims: list[GpuSim], *, workers: int = 2) -> str:
    """The simulation's table: per model, the GPU's rate, what the loader let it reach, stall."""
    if not sims:
        return ""
    peak = sims[0].peak_flops
    lines = [
        f"GPU-step simulation: tokenloom (workers={workers}) feeding one {DEVICE} "
        f"(bf16 dense peak {peak / 1e12:,.0f} TFLOP/s x MFU {MFU:.0%}, GPT-2 FLOPs per token; "
        "see tokenloom.loader.observe.profile)",
    ]
    head = f"{'model':<8} {'GPU tok/s':>10} {'got tok/s':>10} {'steps':>6} {'data stall':>10}"
    lines += [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.model:<8} {r.gpu_tokens_per_s:>10,.0f} {r.tokens_per_s:>10,.0f} {r.steps:>6} "
            f"{r.stall:>10.1%}"
        )
    lines.append("data stall = time waiting for the next batch / total (start-up excluded)")
    for r in results:
        if r.verdict:
            lines.append(f"  [{r.model}] {r.verdict}")
    return "\n".join(lines)
