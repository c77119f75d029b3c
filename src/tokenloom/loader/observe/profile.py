"""A consumer that stands in for a GPU training step: would the loader keep an H100 fed?

:func:`simulate` takes batches from a loader and, per batch, sleeps the time a GPT-2 model would
take to train on that many token positions, then reports the **data stall**: the share of its
time spent waiting for the next batch. Sleeping releases the GIL as a training step waiting on
the device does, so the loader's threads and workers run meanwhile.

Assumption (arithmetic, not a measurement): one H100 SXM at its dense bf16 peak of 989 TFLOP/s
(:func:`tokenloom.train.flops.peak_flops_named`) and 40% model FLOPs utilisation, with the
training FLOPs per token of :func:`tokenloom.train.flops.flops_per_token` (``6 N`` for the
weights, forward and backward, plus ``12 L H T`` for attention scores) for the GPT-2 preset at
the loader's block length ``T``::

    tokens/s = 989e12 * 0.4 / (6 N + 12 L H T)

About 463k tokens/s for GPT-2 124M (``N`` = 124M without the position embedding, ``L`` = 12,
``H`` = 768) and 163k for GPT-2 354M (``L`` = 24, ``H`` = 1024) at ``T = 1024``: a batch of
8 x 1024 tokens is a 17.7 ms or 50.2 ms step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GPT2_SIZES", "GpuSim", "SimResult", "parse_gpu_sims", "simulate"]

GPT2_SIZES = {"124M": "small", "354M": "medium"}
"""Model names :meth:`GpuSim.gpt2` takes -> :data:`tokenloom.train.model.PRESETS` (the preset
names ``small`` / ``medium`` and ``350M`` are accepted too)."""
_ALIASES = {"small": "124M", "medium": "354M", "350M": "354M"}

DEVICE = "H100"
"""The simulated accelerator (its dense bf16 peak from :mod:`tokenloom.train.flops`)."""
MFU = 0.4
"""Model FLOPs utilisation assumed (an assumption for well-tuned dense bf16 training, not a
figure measured by tokenloom)."""


@dataclass(frozen=True, kw_only=True)
class GpuSim:
    """A simulated training step: seconds per token position from FLOPs, peak and MFU."""

    model: str
    """Label, e.g. ``124M``."""
    flops_per_token: float
    """Training FLOPs per token position."""
    peak_flops: float
    """The device's dense peak in FLOP/s."""
    mfu: float = MFU
    """Fraction of the peak the step achieves."""

    def __post_init__(self) -> None:
        if self.flops_per_token <= 0 or self.peak_flops <= 0 or not 0 < self.mfu <= 1:
            raise ValueError(f"flops, peak must be > 0 and 0 < mfu <= 1 (got {self})")

    @property
    def tokens_per_second(self) -> float:
        """What the simulated device trains on: peak x MFU / FLOPs per token."""
        return self.peak_flops * self.mfu / self.flops_per_token

    def step_seconds(self, tokens: int) -> float:
        """Time of one training step on ``tokens`` positions."""
        return tokens / self.tokens_per_second

    @classmethod
    def gpt2(cls, size: str, seq_len: int, *, device: str = DEVICE, mfu: float = MFU) -> GpuSim:
        """GPT-2 ``124M`` or ``354M`` at block length ``seq_len`` on ``device`` (e.g. H100).

        The model is built on torch's ``meta`` device (shapes only, no memory), once per size.
        """
        from tokenloom.train.flops import peak_flops_named

        name = _gpt2_name(size)
        peak = peak_flops_named(device)
        if peak is None:
            raise ValueError(f"no known bf16 peak for device {device!r} (see train/flops.py)")
        flops = _gpt2_flops_per_token(GPT2_SIZES[name], int(seq_len))
        return cls(model=name, flops_per_token=flops, peak_flops=peak, mfu=mfu)


def _gpt2_name(size: str) -> str:
    name = _ALIASES.get(size, size)
    if name not in GPT2_SIZES:
        raise ValueError(
            f"unknown GPT-2 size {size!r}; choose from {', '.join(GPT2_SIZES)} "
            "(or the presets small, medium)"
        )
    return name


@functools.cache
def _gpt2_flops_per_token(preset: str, seq_len: int) -> float:
    """Training FLOPs per token of a GPT-2 preset, built on torch's ``meta`` device."""
    import torch

    from tokenloom.train.flops import flops_per_token
    from tokenloom.train.model import GPT

    with torch.device("meta"):
        model = GPT.preset(preset, block_size=max(seq_len, 1024))
    return flops_per_token(model, seq_len)


def parse_gpu_sims(text: str, seq_len: int) -> list[GpuSim]:
    """``"124M,354M"`` -> one :class:`GpuSim` each (ValueError naming the choices)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no model given; choose from {', '.join(GPT2_SIZES)}")
    for name in names:
        _gpt2_name(name)  # every name checked before torch is imported
    return [GpuSim.gpt2(n, seq_len) for n in names]


@dataclass(kw_only=True)
class SimResult:
    """What one simulated run measured. Times after each pass's first batch (start-up apart)."""

    model: str
    gpu_tokens_per_s: float
    """The simulated device's training rate (the ceiling)."""
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    """Wall time from the first batch in hand to the end of the last simulated step."""
    wait_seconds: float = 0.0
    """Time spent waiting for the next batch (the data stall)."""
    compute_seconds: float = 0.0
    """Time spent in simulated steps."""
    startup_seconds: float = 0.0
    """Waits for each pass's first batch (workers spawned, plan built)."""
    bottleneck: str = ""
    """The loader's verdict stage (:mod:`tokenloom.loader.observe.bottleneck`), when it has
    stats."""
    verdict: str = ""

    @property
    def stall(self) -> float:
        """Data stall: waiting for data over the whole time (0 .. 1)."""
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Training tokens/s achieved with this loader (at most ``gpu_tokens_per_s``)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "stall": round(self.stall, 4),
            "tokens_per_s": round(self.tokens_per_s, 1),
        }


def _positions(batch: Any) -> int:
    """Token positions of a batch: its ``input_ids`` (a dict batch) or the tensor itself."""
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    return int(ids.numel() if hasattr(ids, "numel") else ids.size)


def simulate(
    loader: Iterable[Any],
    sim: GpuSim,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    tokens: Callable[[Any], int] = _positions,
    sleep: Callable[[float], None] = time.sleep,
) -> SimResult:
    """Consume ``loader`` as a training loop on ``sim`` would: per batch, wait for it, then
    "train" on it for :meth:`GpuSim.step_seconds`.

    Passes follow one another (a DataLoader moves to the next epoch) until ``steps`` batches or
    ``seconds`` of wall time; with neither, one pass. Each pass's first batch is start-up, not
    stall. When ``loader`` has ``stats``
    (:class:`~tokenloom.loader.pipeline.dataloader.DataLoader`), the result carries their bottleneck
    verdict.
    """
    result = SimResult(model=sim.model, gpu_tokens_per_s=sim.tokens_per_second)
    began: float | None = None
    later_startup = 0.0  # start-up of later passes happens inside the wall time; kept out

    def over() -> bool:
        return (steps is not None and result.steps >= steps) or (
            seconds is not None and result.seconds >= seconds
        )

    while True:
        it, got = iter(loader), 0
        while not over():
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            if got == 0:
                result.startup_seconds += now - asked
                if began is None:
                    began = now
                else:
                    later_startup += now - asked
            else:
                result.wait_seconds += now - asked
            n = tokens(batch)
            sleep(sim.step_seconds(n))
            done = time.perf_counter()
            result.compute_seconds += done - now
            result.steps += 1
            result.tokens += n
            result.seconds = done - began - later_startup
            got += 1
        if hasattr(it, "close"):
            it.close()  # a DataLoader's workers stop now, not at garbage collection
        if over() or got == 0 or (steps is None and seconds is None):
            break
    stats = getattr(loader, "stats", None)
    if stats is not None and hasattr(stats, "wall_seconds"):
        from tokenloom.loader.observe.bottleneck import bottleneck

        verdict = bottleneck(stats)
        result.bottleneck, result.verdict = verdict.stage, verdict.text
    return result
