"""A model in the loop of ``bench loader`` (``--model tiny-gpt``): every loader feeds the same
model, from the same initial weights, the same number of training steps.

The text workload trains tokenloom's tiny GPT (:meth:`tokenloom.train.model.GPT.preset`
``"tiny"``, GPT-2's vocabulary, causal attention over each ``(B, L)`` block, next-token loss,
AdamW). Per loader: samples/s (blocks trained per second of wall), the data stall (the share of
the wall spent waiting for the next batch) and the total time of the steps. The first batch
(construction included) and one warm-up step are left out of the figures, as the speed run
leaves out the first batch. On a GPU each step is synchronised before the next batch is asked
for, so a loader prefetching in its workers is not charged for the GPU's work; on CPU the model
and the loader share the cores, which the figures show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenloom.bench.loader import LoaderBenchConfig
    from tokenloom.bench.loader_cases import CaseSpec
    from tokenloom.bench.loader_report import LoaderBench

__all__ = ["MODELS", "ModelRun", "train_case", "run_model_in_loop", "format_model_runs"]

MODELS: dict[str, str] = {"tiny-gpt": "tiny"}
"""``--model`` names and the :data:`tokenloom.train.presets.PRESETS` size each trains."""


@dataclass(frozen=True, kw_only=True)
class ModelRun:
    """One loader feeding the model."""

    label: str
    model: str
    device: str = ""
    batch_size: int = 0
    steps: int = 0
    samples: int = 0
    """Blocks trained in the measured steps."""
    total_s: float = 0.0
    """Wall time of the measured steps (waiting for data included)."""
    wait_s: float = 0.0
    """Of which waiting for the loader's next batch."""
    first_batch_s: float = 0.0
    loss_first: float | None = None
    loss_last: float | None = None
    window_samples_per_s: tuple[float, ...] = ()
    """Samples/s of each epoch (a window of ``steps / epochs`` steps)."""
    window_stall_pct: tuple[float, ...] = ()
    """Data stall % of each epoch."""
    error: str | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.total_s if self.total_s > 0 else 0.0

    @property
    def stall_pct(self) -> float:
        return 100.0 * self.wait_s / self.total_s if self.total_s > 0 else 0.0

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "samples_per_s": round(self.samples_per_s, 3),
            "stall_pct": round(self.stall_pct, 2),
        }


def train_case(
    spec: CaseSpec, model: str, steps: int, overrides: dict | None = None, epochs: int = 1
) -> dict:
    """Train ``model`` on ``spec``'s loader for one warm-up step plus ``epochs`` windows of
    ``steps`` steps each (this process); the figures are over all windows, and per window.

    Args:
        overrides: :class:`~tokenloom.train.model.GPTConfig` fields over the preset (tests use
            a smaller model).
    """
    import torch

    from tokenloom.bench.loader_cases import SOURCES, _Notes
    from tokenloom.bench.loader_data import VOCAB_SIZE
    from tokenloom.bench.loader_shuffle import check_batch
    from tokenloom.train.model import GPT

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)  # the same initial weights for every loader
    net = GPT.preset(
        MODELS[model], vocab_size=VOCAB_SIZE, block_size=spec.seq_len, **(overrides or {})
    ).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(batch: torch.Tensor) -> float:
        x = batch.to(device, non_blocking=True)
        labels = torch.full_like(x, -100)
        labels[:, :-1] = x[:, 1:]  # next token within the block
        _, loss = net(x, labels=labels, attention="causal")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return float(loss.detach())

    started = time.perf_counter()
    it = SOURCES[spec.kind](spec, _Notes())
    losses = []
    try:
        first = next(it)
        first_s = time.perf_counter() - started
        losses.append(step(first))  # warm-up: allocations, kernels
        windows: list[tuple[float, float, int]] = []  # (wall, waiting, samples) per epoch
        for _ in range(epochs):
            t0 = time.perf_counter()
            w_wait, w_samples = 0.0, 0
            for _ in range(steps):
                a = time.perf_counter()
                batch = next(it)
                w_wait += time.perf_counter() - a
                check_batch(spec, batch)  # an epoch's short last batch trains as it comes
                w_samples += batch.shape[0]
                losses.append(step(batch))
            windows.append((time.perf_counter() - t0, w_wait, w_samples))
        total = sum(w[0] for w in windows)
        wait = sum(w[1] for w in windows)
        samples = sum(w[2] for w in windows)
    finally:
        it.close()
    return ModelRun(
        label=spec.label,
        model=model,
        device=device,
        batch_size=spec.batch_size,
        steps=steps * epochs,
        samples=samples,
        total_s=total,
        wait_s=wait,
        first_batch_s=first_s,
        loss_first=losses[0],
        loss_last=losses[-1],
        window_samples_per_s=tuple(round(n / w, 3) if w > 0 else 0.0 for w, _, n in windows),
        window_stall_pct=tuple(round(100 * s / w, 2) if w > 0 else 0.0 for w, s, _ in windows),
    ).to_json()


def _from_json(payload: dict) -> ModelRun:
    fields = {k: v for k, v in payload.items() if k not in ("samples_per_s", "stall_pct")}
    for name in ("window_samples_per_s", "window_stall_pct"):
        fields[name] = tuple(fields.get(name, ()))
    return ModelRun(**fields)


def run_model_in_loop(
    config: LoaderBenchConfig,
    bench: LoaderBench,
    model: str,
    steps: int,
    *,
    log: Callable[[str], None] = lambda _msg: None,
    timeout_s: float = 1800.0,
) -> list[ModelRun]:
    """Every loader of ``config`` (reading the inputs ``bench``'s speed run built) trains ``model``
    at each batch size of the sweep for ``config.epochs`` windows of ``steps`` steps, each loader
    and size in a fresh process; the figures are also attached to the matching results of
    ``bench`` (``figures["model"]``)."""
    from tokenloom.bench.loader import plan_cases
    from tokenloom.bench.loader_shuffle import run_isolated

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    paths = {name: built.path for name, built in bench.builds.items()}
    out = []
    for base in plan_cases(config, paths):
        for size in config.sizes:
            spec = replace(base, batch_size=size, steps=steps)
            log(f"{model} on {spec.label}, B={size} ({config.epochs} x {steps} steps) ...")
            kind, payload = run_isolated(
                train_case, (spec, model, steps, None, config.epochs), timeout_s
            )
            run = (
                _from_json(payload)
                if kind == "ok"
                else ModelRun(
                    label=spec.label,
                    model=model,
                    batch_size=size,
                    error=str(payload).splitlines()[0],
                )
            )
            out.append(run)
            if run.error:
                log(f"  FAILED: {run.error}")
            else:
                log(f"  {run.samples_per_s:.2f} samples/s, data stall {run.stall_pct:.1f}%")
            bench.attach(spec.label, "model", run.to_json(), size)
    return out


def format_model_runs(runs: list[ModelRun]) -> str:
    """A table: samples/s, data stall % and total time of each loader feeding the model."""
    if not runs:
        return ""
    head = runs[0]
    lines = [
        f"model in the loop: {head.model} ({head.device or 'n/a'}), {head.steps} steps per "
        "loader and batch size after a warm-up step; stall = time waiting for the next batch "
        "/ wall",
        f"{'loader':<62} {'B':>3} {'samples/s':>10} {'stall %':>8} {'total s':>8} "
        f"{'1st batch':>10} {'loss':>13}",
    ]
    for r in runs:
        if r.error:
            lines.append(f"{r.label:<62} {r.batch_size:>3} failed: {r.error}")
            continue
        loss = f"{r.loss_first:.2f}->{r.loss_last:.2f}"
        lines.append(
            f"{r.label:<62} {r.batch_size:>3} {r.samples_per_s:>10.2f} {r.stall_pct:>8.1f} "
            f"{r.total_s:>8.1f} {r.first_batch_s:>9.2f}s {loss:>13}"
        )
    return "\n".join(lines)
