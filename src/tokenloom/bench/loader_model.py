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


def train_case(spec: CaseSpec, model: str, steps: int, overrides: dict | None = None) -> dict:
    """Train ``model`` on ``spec``'s loader for one warm-up step plus ``steps`` (this process).

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
    wait = 0.0
    samples = 0
    try:
        first = next(it)
        first_s = time.perf_counter() - started
        losses.append(step(first))  # warm-up: allocations, kernels
        t0 = time.perf_counter()
        for _ in range(steps):
            a = time.perf_counter()
            batch = next(it)
            wait += time.perf_counter() - a
            check_batch(spec, batch)  # an epoch's short last batch trains as it comes
            samples += batch.shape[0]
            losses.append(step(batch))
        total = time.perf_counter() - t0
    finally:
        it.close()
    return ModelRun(
        label=spec.label,
        model=model,
        device=device,
        steps=steps,
        samples=samples,
        total_s=total,
        wait_s=wait,
        first_batch_s=first_s,
        loss_first=losses[0],
        loss_last=losses[-1],
    ).to_json()


def _from_json(payload: dict) -> ModelRun:
    return ModelRun(**{k: v for k, v in payload.items() if k not in ("samples_per_s", "stall_pct")})


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
    for ``steps`` steps, each in a fresh process; the figures are also added to the matching
    results of ``bench`` (``figures["model"]``)."""
    from tokenloom.bench.loader import plan_cases
    from tokenloom.bench.loader_shuffle import run_isolated

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    paths = {name: built.path for name, built in bench.builds.items()}
    out = []
    for spec in plan_cases(config, paths):
        log(f"{model} on {spec.label} ({steps} steps) ...")
        kind, payload = run_isolated(
            train_case, (replace(spec, steps=steps), model, steps), timeout_s
        )
        run = (
            _from_json(payload)
            if kind == "ok"
            else ModelRun(label=spec.label, model=model, error=str(payload).splitlines()[0])
        )
        out.append(run)
        if run.error:
            log(f"  FAILED: {run.error}")
        else:
            log(f"  {run.samples_per_s:.2f} samples/s, data stall {run.stall_pct:.1f}%")
        for result in bench.results:
            if result.label == spec.label:
                result.figures["model"] = run.to_json()
    return out


def format_model_runs(runs: list[ModelRun]) -> str:
    """A table: samples/s, data stall % and total time of each loader feeding the model."""
    if not runs:
        return ""
    head = runs[0]
    lines = [
        f"model in the loop: {head.model} ({head.device or 'n/a'}), {head.steps} steps per "
        "loader after a warm-up step; stall = time waiting for the next batch / wall",
        f"{'loader':<62} {'samples/s':>10} {'stall %':>8} {'total s':>8} {'1st batch':>10} "
        f"{'loss':>13}",
    ]
    for r in runs:
        if r.error:
            lines.append(f"{r.label:<62} failed: {r.error}")
            continue
        loss = f"{r.loss_first:.2f}->{r.loss_last:.2f}"
        lines.append(
            f"{r.label:<62} {r.samples_per_s:>10.2f} {r.stall_pct:>8.1f} {r.total_s:>8.1f} "
            f"{r.first_batch_s:>9.2f}s {loss:>13}"
        )
    return "\n".join(lines)
