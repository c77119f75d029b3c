"""GPU check: train GPT-2 small from a synthetic tokenloom table for a fixed time and report
tokens/s, MFU and the share of time spent waiting for data.

Run through ``scripts/gpu_check.sh`` (which installs carried wheels first). Steady-state figures
leave out the first steps (compilation and warm-up). On a machine without a GPU it runs the same
path on the CPU with ``--device cpu --model tiny`` (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="training time")
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--docs", type=int, default=150_000, help="synthetic documents (~800 tok)")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--kernel", default="auto")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", dest="json_out", default=None, help="also write results here")
    args = ap.parse_args()

    import torch

    from tokenloom.bench.loader_data import CorpusSpec, build_table
    from tokenloom.loader import LoaderSpec
    from tokenloom.train.loop import TrainConfig, train

    t0 = time.perf_counter()
    work = args.workdir or tempfile.mkdtemp(prefix="tokenloom-gpu-check-")
    built = build_table(os.path.join(work, "synthetic.lance"), CorpusSpec(docs=args.docs))
    print(
        f"synthetic table: {built.docs:,} docs, {built.tokens / 1e6:.1f}M tokens, "
        f"{built.mbytes:.0f} MB, built in {built.seconds:.1f} s",
        flush=True,
    )
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__})", flush=True)
    cfg = TrainConfig(
        loader=LoaderSpec(
            table=built.path, seq_len=args.seq_len, global_batch=args.batch_size
        ),
        out=os.path.join(work, "run"),
        model=args.model,
        steps=100_000,  # the time limit ends the run
        time_limit=args.seconds,
        lr=6e-4,
        warmup_steps=100,
        compile=not args.no_compile,
        kernel=args.kernel,
        device=args.device,
        workers=args.workers,
        log_every=25,
        checkpoint_every=10**9,  # one checkpoint, at the end (its write time is reported)
    )
    res = train(cfg, log=lambda line: print(line, flush=True))
    steps = len(res.step_seconds)
    skip = min(max(10, steps // 5), max(steps - 1, 0))  # compile + warm-up
    steady = np.asarray(res.step_seconds[skip:])
    waits = np.asarray(res.wait_seconds[skip:])
    tokens_per_step = cfg.loader.global_batch * cfg.loader.seq_len
    rate = tokens_per_step * len(steady) / max(float(steady.sum()), 1e-9)
    from tokenloom.train.flops import flops_per_token, peak_flops
    from tokenloom.train.model import GPT

    dev = torch.device("cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu")
    model = GPT.preset(args.model, vocab_size=50257, block_size=args.seq_len)
    per_token = flops_per_token(model, args.seq_len)
    peak = peak_flops(dev)
    out = {
        "model": args.model,
        "params_M": round(model.num_params() / 1e6, 1),
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "steps": steps,
        "steady_steps": int(len(steady)),
        "first_step_s": round(res.step_seconds[0], 2) if steps else None,
        "tokens_per_s": round(rate),
        "mfu": round(rate * per_token / peak, 4) if peak else None,
        "data_stall_share": round(float(waits.sum() / max(steady.sum(), 1e-9)), 4),
        "step_ms_p50": round(float(np.median(steady)) * 1e3, 1) if len(steady) else None,
        "final_loss": round(res.losses[-1], 4) if res.losses else None,
        "peak_mem_GB": round(torch.cuda.max_memory_allocated() / 1e9, 1)
        if dev.type == "cuda"
        else None,
        "total_s": round(time.perf_counter() - t0, 1),
    }
    print("gpu check: " + json.dumps(out), flush=True)
    print(
        f"gpu check: {out['tokens_per_s']:,} tokens/s, MFU "
        + (f"{100 * out['mfu']:.1f}%" if out["mfu"] is not None else "n/a")
        + f", data stall {100 * out['data_stall_share']:.2f}% of step time "
        f"({out['steady_steps']} steady steps after {skip} warm-up steps)",
        flush=True,
    )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
