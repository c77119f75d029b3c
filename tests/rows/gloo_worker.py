"""One rank of the 2-process gloo test (run under torchrun): stream the image table with decode
in threads, skip bad images, and all-reduce once per step as DDP would (a rank with fewer steps
would hang the other; the process group's timeout turns that into a failure)."""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from tokenloom.rows import RowDataset
from tokenloom.vision.patches import ImageTransform, PatchGrid


def main(table: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = RowDataset(
        table,
        columns=["image"],
        global_batch=8,
        transform=ImageTransform(PatchGrid(patch=16, max_side=32)),
        transform_threads=2,
        read_batch_size=2,
        on_error="skip",
        rank=rank,
        world_size=world,
    )
    steps, rows = 0, []
    for batch in ds:
        tokens = torch.tensor([int(batch["n_image_tokens"].sum())])
        dist.all_reduce(tokens)  # every rank must reach this the same number of times
        steps += 1
        rows.append(batch["row_id"].tolist())
    skipped = torch.tensor([sum(ds.skipped.values())])
    dist.all_reduce(skipped)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(
            {"steps": steps, "rows": rows, "skipped": dict(ds.skipped), "total": int(skipped)}, fh
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
