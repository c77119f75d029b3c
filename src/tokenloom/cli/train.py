"""``tokenloom train`` and ``tokenloom sample``."""

from __future__ import annotations

import os

import click

__all__ = ["commands"]


@click.command(
    "train",
    epilog="""\b
Examples:
  tokenloom train --table corpus.lance --model tiny --seq-len 256 --batch-size 8 --steps 300 \\
      --filter "NOT is_dup AND id % 100 != 0" --val-filter "id % 100 = 0" --out runs/tiny
  tokenloom train --table corpus.lance --out runs/tiny --steps 300 --resume
  torchrun --nproc-per-node 2 -m tokenloom.cli.main train --table corpus.lance \\
      --out runs/ddp --batch-size 4 --global-batch-size 16 --epochs 1
  tokenloom train --table corpus.lance --out runs/small --model small --compile \\
      --seq-len 1024 --batch-size 16 --grad-accum 4 --steps 2000 --plot runs/small/loss.png""",
)
@click.option("--table", required=True, metavar="PATH")
@click.option(
    "--out", default=None, metavar="DIR", help="Checkpoint directory [default: runs/MODEL]."
)
@click.option(
    "--model", type=click.Choice(["tiny", "small", "medium"]), default="tiny", show_default=True
)
@click.option("--column", "token_column", default="input_ids", show_default=True)
@click.option("--filter", default=None, metavar="SQL", help="Training rows.")
@click.option("--val-filter", default=None, metavar="SQL", help="Held-out rows for val loss.")
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Micro-batch: blocks per forward pass per process.",
)
@click.option(
    "--grad-accum",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Micro-batches per optimizer step.",
)
@click.option(
    "--global-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Blocks per optimizer step; sets --grad-accum to G / (batch size x processes), so a "
    "resume on another number of processes keeps the same data stream.",
)
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Optimizer steps [100].")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Instead of --steps.")
@click.option(
    "--stop-at",
    type=click.IntRange(min=1),
    default=None,
    help="End this invocation at this step (checkpointed); the schedule still runs to --steps.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="End this invocation (checkpointed) after this much training time.",
)
@click.option("--lr", type=float, default=3e-3, show_default=True, help="Peak learning rate.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=None, help="[5% of steps]")
@click.option("--weight-decay", type=float, default=0.1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--block-order",
    type=click.Choice(["interleave", "sequential"]),
    default="interleave",
    show_default=True,
    help="Global batch = one block from each of G stretches of the stream, or G consecutive.",
)
@click.option(
    "--attention", type=click.Choice(["document", "causal"]), default="document", show_default=True
)
@click.option(
    "--kernel",
    type=click.Choice(["auto", "sdpa", "flex"]),
    default="auto",
    show_default=True,
    help="Document-mask kernel (auto: flex_attention on CUDA, SDPA mask otherwise).",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ...")
@click.option(
    "--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True
)
@click.option("--compile", is_flag=True, help="torch.compile the model.")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--eval-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--eval-batches", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--log-every", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--provenance-log",
    is_flag=True,
    help="Each rank appends OUT/provenance-rankR.jsonl (what `tokenloom trace` recomputes).",
)
@click.option("--plot", default=None, metavar="FILE", help="Write loss curves (PNG) at the end.")
@click.option("--resume", is_flag=True, help="Continue from OUT/last.pt exactly.")
def train(resume: bool, plot: str | None, **options) -> None:  # noqa: ANN003
    """Train GPT-2 straight from the table with document-isolated attention.

    Runs as one process or under torchrun (DDP: gloo on CPU, nccl on GPU).
    """
    from tokenloom.train.loop import TrainConfig
    from tokenloom.train.loop import train as run

    if options["out"] is None:
        options["out"] = os.path.join("runs", options["model"])
    if options["steps"] is None and options["epochs"] is None:
        options["steps"] = 100
    result = run(TrainConfig(**options), resume=resume, log=click.echo)
    if int(os.environ.get("RANK") or 0) != 0:
        return
    val = f", last val loss {result.val_losses[-1][1]:.4f}" if result.val_losses else ""
    last = f"{result.losses[-1]:.4f}" if result.losses else "n/a"
    click.echo(
        f"done: step {result.step}, last loss {last}{val}, "
        f"{result.tokens / max(result.seconds, 1e-9):,.0f} tok/s, data wait "
        f"{100 * result.data_seconds / max(result.seconds, 1e-9):.1f}% of wall (+ "
        f"{result.startup_seconds:.1f} s loader start-up); checkpoint in "
        f"{options['out']}/last.pt"
    )
    if plot:
        from tokenloom.train.plot import plot_losses

        plot_losses(
            plot,
            result.history["train"],
            result.history["val"],
            title=f"{options['model']} on {os.path.basename(options['table'].rstrip('/'))}",
        )
        click.echo(f"loss curves: {plot}")


@click.command(
    "sample",
    epilog="""\b
Examples:
  tokenloom sample --checkpoint runs/tiny --prompt "In the beginning" --max-new-tokens 60""",
)
@click.option("--checkpoint", required=True, metavar="DIR")
@click.option("--prompt", required=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--temperature", type=float, default=0.8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def sample(
    checkpoint: str, prompt: str, max_new_tokens: int, temperature: float, seed: int
) -> None:
    """Continue a prompt with a trained checkpoint."""
    import torch

    from tokenloom.tokenize import load_tokenizer
    from tokenloom.train.loop import load_checkpoint
    from tokenloom.train.model import GPT, GPTConfig, generate

    state = load_checkpoint(os.path.join(checkpoint, "last.pt"))
    ident, cfg = state["tokenizer"], state["config"]
    tok = load_tokenizer(ident["name"])
    from tokenloom.train.model import PRESETS

    model = GPT(
        GPTConfig(
            **PRESETS[cfg["model"]], vocab_size=ident["vocab_size"], block_size=cfg["seq_len"]
        )
    )
    model.load_state_dict(state["model"])
    gen = torch.Generator().manual_seed(seed)
    ids = generate(
        model,
        tok.encode(prompt),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_id=ident.get("eos_id"),
        generator=gen,
    )
    click.echo(prompt + tok.decode(ids))


commands = [train, sample]
