"""``tokenloom train`` and ``tokenloom sample``."""

from __future__ import annotations

import click

__all__ = ["commands"]


@click.command(
    "train",
    epilog="""\b
Examples:
  tokenloom train --table corpus.lance --model tiny --seq-len 256 --batch-size 8 --steps 300 \\
      --filter "NOT is_dup AND id % 100 != 0" --val-filter "id % 100 = 0" --out runs/tiny
  tokenloom train --table corpus.lance --out runs/tiny --steps 600 --resume""",
)
@click.option("--table", required=True, metavar="PATH")
@click.option("--out", required=True, metavar="DIR", help="Checkpoint directory.")
@click.option(
    "--model", type=click.Choice(["tiny", "small", "medium"]), default="tiny", show_default=True
)
@click.option("--column", "token_column", default="input_ids", show_default=True)
@click.option("--filter", default=None, metavar="SQL")
@click.option("--val-filter", default=None, metavar="SQL")
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--lr", type=float, default=3e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--attention", type=click.Choice(["document", "causal"]), default="document", show_default=True
)
@click.option("--eval-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--log-every", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from OUT/last.pt exactly.")
def train(resume: bool, **options) -> None:  # noqa: ANN003
    """Train GPT-2 straight from the table with document-isolated attention."""
    from tokenloom.train.loop import TrainConfig
    from tokenloom.train.loop import train as run

    result = run(TrainConfig(**options), resume=resume, log=click.echo)
    val = f", last val loss {result.val_losses[-1][1]:.4f}" if result.val_losses else ""
    last = f"{result.losses[-1]:.4f}" if result.losses else "n/a"
    click.echo(
        f"done: step {result.step}, last loss {last}{val}, "
        f"{result.tokens / max(result.seconds, 1e-9):,.0f} tok/s; checkpoint in "
        f"{options['out']}/last.pt"
    )


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
    import os

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
