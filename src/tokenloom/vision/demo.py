"""``tokenloom demo --vlm``: the image+text pipeline end to end on the bundled images.

Build the bundled image+text set (with two corrupt images) → ingest it (the image a blob column,
width and height stored) → train a small byte-level BPE on its text and tokenize the prompt and
response columns with it → the padding of pad-to-longest, greedy and knapsack on the same
samples, planned from stored sizes only → train the tiny VLM from the table (the corrupt images
skipped and counted), stopped halfway and resumed (the resumed losses equal an uninterrupted
run's) → the trace of one step. A summary is written to ``WORKDIR/vlm/summary.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

__all__ = ["run_vlm_demo"]


def run_vlm_demo(
    workdir: str, *, steps: int = 40, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the image+text demo under ``workdir/vlm`` (recreated); returns the summary.

    Args:
        workdir: The demo's folder (``vlm/`` inside it is replaced).
        steps: Optimizer steps of the tiny VLM (stopped at half, then resumed).
        echo: Where the report lines go.
    """
    from tokenloom.ingest import ingest
    from tokenloom.table import Table
    from tokenloom.tokenize import train_bpe
    from tokenloom.tokenize.column import tokenize_table
    from tokenloom.train.checkpoint import load_checkpoint
    from tokenloom.train.config import TrainConfig
    from tokenloom.train.loop import train
    from tokenloom.vision.dataset import ImageTextStream
    from tokenloom.vision.images import IMAGES, build_image_set
    from tokenloom.vision.spec import ImageTextSpec
    from tokenloom.vision.trace import trace_vlm_run

    root = os.path.join(workdir, "vlm")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    started = time.perf_counter()
    total = 6

    def stage(n: int, text: str) -> None:
        echo(f"[vlm {n}/{total}] {text}")

    parquet = build_image_set(os.path.join(root, "images"), max_side=128, bad_images=2)
    uri = os.path.join(root, "img.lance")
    ingest([parquet], uri, columns="prompt,response,width,height", progress=False)
    samples = Table.open(uri).count_rows()
    stage(1, f"{samples} samples ({len(IMAGES)} images, 2 corrupt) -> {uri} (image as a blob)")

    ds = Table.open(uri).dataset
    texts = (t for b in ds.to_batches(columns=["text"]) for t in b.column(0).to_pylist())
    bpe = os.path.join(root, "bpe")
    tok = train_bpe(texts, vocab_size=400, out_dir=bpe, min_frequency=2)
    for text in ("prompt", "response"):
        tokenize_table(uri, bpe, column=f"{text}_ids", text_column=text, workers=0,
                       progress=False)  # fmt: skip
    stage(2, f"{tok.vocab_size}-id BPE trained on the text; prompt_ids, response_ids tokenized")

    spec = ImageTextSpec(table=uri, budget=96, global_batch=4, max_side=48, on_error="skip")
    ledgers = ImageTextStream(spec, threads=0).padding_by_policy(0)
    stage(3, "padding of each policy on the same samples (stored sizes only, nothing decoded):")
    for name, led in ledgers.items():
        echo(f"    {name:<15} {led['blocks']:>4} blocks  padding {led['padding']:>5} positions "
             f"({led['padding_share']:.1%})")  # fmt: skip
    longest, knap = ledgers["pad_to_longest"], ledgers["knapsack"]
    saved = longest["padding"] - knap["padding"]
    echo(f"    knapsack saves {saved:,} padding positions against pad-to-longest "
         f"({longest['padding_share']:.1%} -> {knap['padding_share']:.1%})")  # fmt: skip

    runs = {}
    quiet = lambda *_: None  # noqa: E731 - the stage lines say what happened
    knobs = {"model": "tiny", "steps": steps, "lr": 3e-3, "log_every": max(1, steps // 4),
             "checkpoint_every": steps}  # fmt: skip
    for name, stop in (("whole", None), ("resumed", steps // 2)):
        out = os.path.join(root, f"run-{name}")
        train(TrainConfig(loader=spec, out=out, stop_at=stop, **knobs), log=quiet, progress=False)
        if stop is not None:  # the rest of the run, from its checkpoint
            cfg = TrainConfig(loader=spec, out=out, **knobs)
            train(cfg, resume=True, log=quiet, progress=False)
        runs[name] = load_checkpoint(out)
    whole = runs["whole"]
    losses = [v for _, v in whole.history["train"]]
    led = whole.record.loader_state["ledger"]
    stage(4, f"tiny VLM, {steps} steps of 4 blocks x 96 positions: loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}; fed {led['images']} images, {led['image_tokens']} image tokens, "
          f"{led['text_tokens']} text tokens, {led['padding']} padding, {led['skipped']} "
          "corrupt samples skipped (counted)")  # fmt: skip
    same = whole.history["train"] == runs["resumed"].history["train"]
    stage(5, f"stopped at step {steps // 2} and resumed: every loss equal to the uninterrupted "
          f"run's: {same}")  # fmt: skip
    rows = trace_vlm_run(whole.record, step=steps)
    blocks = sorted({r["block"] for r in rows})
    stage(6, f"trace of step {steps}: {len(rows)} samples in blocks {blocks}; first rows "
          f"{[r['row_id'] for r in rows[:6]]}")  # fmt: skip
    summary = {
        "samples": samples,
        "padding": ledgers,
        "knapsack_saves_positions": saved,
        "losses": losses,
        "ledger": led,
        "resume_equal": same,
        "seconds": round(time.perf_counter() - started, 1),
    }
    with open(os.path.join(root, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    echo(f"vlm demo done in {summary['seconds']} s; summary in {root}/summary.json")
    return summary
