"""Two gloo processes stream a table holding bad images: both run the same steps (no hang), the
global batches equal one process's, and the skips add up to one process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tokenloom.rows import RowDataset
from tokenloom.vision.images import build_image_set
from tokenloom.vision.patches import ImageTransform, PatchGrid

pytest.importorskip("torch.distributed")


def test_bad_images_do_not_desynchronise_two_gloo_ranks(tmp_path):
    from tokenloom.ingest import ingest

    uri = str(tmp_path / "img.lance")
    ingest([build_image_set(str(tmp_path), max_side=64, bad_images=3)], uri, progress=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tests.rows.gloo_worker", uri, str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 8  # 57 rows, 8 per step: ceil = 8
    ref = RowDataset(
        uri,
        columns=["image"],
        global_batch=8,
        transform=ImageTransform(PatchGrid(patch=16, max_side=32)),
        on_error="skip",
    )
    whole = [b["row_id"].tolist() for b in ref]
    assert [a + b for a, b in zip(ranks[0]["rows"], ranks[1]["rows"], strict=True)] == whole
    assert ranks[0]["total"] == sum(ref.skipped.values()) >= 3
    assert set(ranks[0]["skipped"]) | set(ranks[1]["skipped"]) == {"UnidentifiedImageError"}
